//! A socket between cibox and the engine that passes every byte through, but for the
//! one request a test names: an image save cut short or stalled, or something done just
//! before an image load reaches the engine. What an engine that fails mid-stream does
//! to cibox, made to happen on purpose.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};

/// What the proxy does to the request it watches for.
#[derive(Clone)]
pub enum Fault {
    /// The response to an image save (`GET …/images/…/get`) ends, connection closed,
    /// after this many bytes.
    CutSave(usize),
    /// The response to an image save stops after this many bytes, the connection left
    /// open (as an engine that hangs).
    StallSave(usize),
    /// Runs once, before an image load (`POST …/images/load`) is passed on.
    BeforeLoad(Arc<dyn Fn() + Send + Sync>),
    /// The first build (`POST …/build`) is answered by the proxy, not the engine: a
    /// stream whose one message is this error; later builds pass.
    FailFirstBuild(Arc<(String, std::sync::atomic::AtomicBool)>),
}

impl Fault {
    /// [`Fault::FailFirstBuild`] with `error`.
    pub fn fail_first_build(error: &str) -> Fault {
        Fault::FailFirstBuild(Arc::new((
            error.to_string(),
            std::sync::atomic::AtomicBool::new(false),
        )))
    }
}

/// A proxy listening in a folder of its own; `host` is what `DOCKER_HOST` takes.
pub struct EngineProxy {
    pub host: String,
    _dir: tempfile::TempDir,
}

const ENGINE: &str = "/var/run/docker.sock";

impl EngineProxy {
    pub fn start(fault: Fault) -> EngineProxy {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let fault = fault.clone();
                std::thread::spawn(move || connection(client, fault));
            }
        });
        EngineProxy {
            host: format!("unix://{}", path.display()),
            _dir: dir,
        }
    }
}

/// How many more bytes of the engine's answer pass, and what happens then.
#[derive(Clone, Copy)]
enum Limit {
    Cut(usize),
    Stall(usize),
}

fn connection(client: UnixStream, fault: Fault) {
    let Ok(engine) = UnixStream::connect(ENGINE) else {
        return;
    };
    let limit: Arc<Mutex<Option<Limit>>> = Arc::new(Mutex::new(None));
    let (mut from_engine, mut to_client) =
        (engine.try_clone().unwrap(), client.try_clone().unwrap());
    let answer_limit = limit.clone();
    std::thread::spawn(move || answers(&mut from_engine, &mut to_client, &answer_limit));
    requests(client, engine, &fault, &limit);
}

/// Client to engine: every byte, watching request lines.
fn requests(
    mut client: UnixStream,
    mut engine: UnixStream,
    fault: &Fault,
    limit: &Mutex<Option<Limit>>,
) {
    let mut line = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Fault::FailFirstBuild(once) = fault
            && is_build(&buf[..n])
            && !once.1.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let body = serde_json::json!({
                "errorDetail": {"message": once.0},
                "error": once.0,
            });
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{body}\n"
            );
            // The answer ends where the connection's write side does; the request's
            // body is read to its end meanwhile, so the client never meets a closed
            // connection while it still writes (which would fail it otherwise).
            let _ = client.write_all(answer.as_bytes());
            let _ = client.shutdown(std::net::Shutdown::Write);
            while matches!(client.read(&mut buf), Ok(n) if n > 0) {}
            break;
        }
        for &b in &buf[..n] {
            if b == b'\n' {
                let text = String::from_utf8_lossy(&line);
                if text.starts_with("GET ") && text.contains("/images/") && is_save(&text) {
                    *limit.lock().unwrap() = match fault {
                        Fault::CutSave(n) => Some(Limit::Cut(*n)),
                        Fault::StallSave(n) => Some(Limit::Stall(*n)),
                        Fault::BeforeLoad(_) | Fault::FailFirstBuild(_) => None,
                    };
                }
                if text.starts_with("POST ")
                    && text.contains("/images/load")
                    && let Fault::BeforeLoad(hook) = fault
                {
                    hook();
                }
                line.clear();
            } else if line.len() < 1024 {
                line.push(b);
            }
        }
        if engine.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = engine.shutdown(std::net::Shutdown::Write);
}

/// Whether these bytes, the start of a request, are a build's.
fn is_build(bytes: &[u8]) -> bool {
    let head = String::from_utf8_lossy(&bytes[..bytes.len().min(256)]);
    let path = head.split(' ').nth(1).unwrap_or("");
    head.starts_with("POST ") && path.split('?').next().unwrap_or("").ends_with("/build")
}

fn is_save(request_line: &str) -> bool {
    let path = request_line.split(' ').nth(1).unwrap_or("");
    let path = path.split('?').next().unwrap_or("");
    path.ends_with("/get")
}

/// Engine to client: every byte, until a watched answer runs out of its limit.
fn answers(engine: &mut UnixStream, client: &mut UnixStream, limit: &Mutex<Option<Limit>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match engine.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut guard = limit.lock().unwrap();
        let (pass, ended) = match *guard {
            None => (n, None),
            Some(Limit::Cut(left)) => {
                let pass = n.min(left);
                *guard = Some(Limit::Cut(left - pass));
                (pass, (left == pass).then_some(false))
            }
            Some(Limit::Stall(left)) => {
                let pass = n.min(left);
                *guard = Some(Limit::Stall(left - pass));
                (pass, (left == pass).then_some(true))
            }
        };
        drop(guard);
        if client.write_all(&buf[..pass]).is_err() {
            break;
        }
        match ended {
            None => {}
            Some(false) => {
                let _ = client.shutdown(std::net::Shutdown::Both);
                let _ = engine.shutdown(std::net::Shutdown::Both);
                return;
            }
            Some(true) => {
                // Hangs: neither closes nor sends, until the client goes.
                let mut sink = [0u8; 1];
                let _ = client.read(&mut sink);
                return;
            }
        }
    }
    let _ = client.shutdown(std::net::Shutdown::Write);
}
