//! Each template rendered in a process of its own, with bounded memory and time: a
//! template is a pull request's, and minijinja's fuel does not charge everything a
//! template can make (a list doubled with `+` in a loop grows for free), so the bound
//! that holds whatever the template does is the kernel's. The child is this cibox again
//! (`cibox __render-template`), which loads the same manifest, renders one template as
//! [`super::render::render`] does and prints what it rendered; its address space is
//! capped at [`MEMORY`], its CPU time at [`CPU`], and its time in all at [`WALL`] (a
//! loaded runner can take many times its CPU time to use it up).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use super::render::{CPU, Flavor, MAX_OUTPUT_BYTES, MEMORY, RenderError, Rendered};

/// The most of the child's error output read.
const MAX_ERROR_BYTES: u64 = 64 << 10;

/// The most time a render's process may take in all: its CPU time is bounded by the
/// kernel, but on a loaded runner that can take many times as long to use up, and a
/// render must not hold up the command past this.
const WALL: std::time::Duration = std::time::Duration::from_secs(30);

impl Flavor {
    /// The flavour as the child's command line names it.
    pub fn as_arg(self) -> &'static str {
        match self {
            Flavor::GitHub => "github",
            Flavor::Buildkite => "buildkite",
        }
    }
}

/// Renders `template` of the manifest at `manifest` in a child process (see the
/// module's doc): what [`super::render::render`] gives, or why not.
pub fn render(
    manifest: &Path,
    template: &Path,
    flavor: Flavor,
    selection: Option<&super::context::Selection>,
    collected: Option<&crate::manifest::Collected>,
) -> Result<Rendered, RenderError> {
    let exe = std::env::current_exe().map_err(|source| RenderError::Unreadable {
        template: template.to_path_buf(),
        source,
    })?;
    // The lists collected here reach the child on its standard input: it cannot
    // collect them itself (it has no engine, and must not run a container).
    let lists = collected.map(|c| serde_json::to_vec(c).unwrap_or_default());
    let mut cmd = child_command(exe, manifest, template, flavor, selection, lists.is_some());
    let child_failed = |source: std::io::Error| RenderError::Unreadable {
        template: template.to_path_buf(),
        source,
    };
    let mut child = cmd.spawn().map_err(child_failed)?;
    let watchdog = Watchdog::start(&child, WALL);
    if let (Some(lists), Some(mut stdin)) = (lists, child.stdin.take()) {
        // Written beside the reads below, so that neither pipe waits on the other.
        std::thread::spawn(move || {
            let _ = std::io::Write::write_all(&mut stdin, &lists);
        });
    }
    let mut stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = (&mut stderr).take(MAX_ERROR_BYTES).read_to_end(&mut text);
        // What is left is read and dropped, so the child never blocks on it.
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
        text
    });
    let mut text = Vec::new();
    let stdout = child.stdout.take().expect("piped");
    // The banner comes on top of what a render may write.
    let mut bounded = stdout.take(MAX_OUTPUT_BYTES as u64 + 4096);
    let read = bounded.read_to_end(&mut text);
    let mut rest = bounded.into_inner();
    let _ = std::io::copy(&mut rest, &mut std::io::sink());
    // Stopped before the child is reaped, so its pid is still its own when killed.
    let out_of_time = watchdog.stop();
    let status = child.wait().map_err(child_failed)?;
    let errors = String::from_utf8_lossy(&errors.join().unwrap_or_default()).into_owned();
    read.map_err(child_failed)?;
    if status.success() {
        let text = String::from_utf8(text).map_err(|_| RenderError::OutputNotUtf8 {
            template: template.to_path_buf(),
        })?;
        let name = template
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("template");
        return Ok(Rendered {
            template: template.to_path_buf(),
            output: template.with_file_name(name.trim_end_matches(".j2")),
            text,
            flavor,
        });
    }
    // The child said why in its one line (`cibox: error: …`), as an error of its own.
    if let Some(line) = errors
        .lines()
        .find_map(|l| l.strip_prefix("cibox: error: "))
    {
        let more: Vec<String> = errors
            .lines()
            .skip_while(|l| !l.starts_with("cibox: error: "))
            .skip(1)
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect();
        return Err(RenderError::InChild {
            message: line.to_string(),
            details: more,
        });
    }
    Err(RenderError::OverBounds {
        template: template.to_path_buf(),
        how: match std::os::unix::process::ExitStatusExt::signal(&status) {
            Some(9) if out_of_time => format!("it ran for {} s without ending", WALL.as_secs()),
            // The kernel's at the CPU bound (soft and hard are one), an allocation that
            // failed at the memory bound aborts.
            Some(9) => "it used all its CPU time".to_string(),
            Some(6) => "it ran out of memory".to_string(),
            Some(sig) => format!("its process ended by signal {sig}"),
            None => format!("its process ended with {status}"),
        },
    })
}

/// The child's command: this cibox's `__render-template`, bounded (see the module's
/// doc); `lists`: the collected test lists come on its standard input.
fn child_command(
    exe: std::path::PathBuf,
    manifest: &Path,
    template: &Path,
    flavor: Flavor,
    selection: Option<&super::context::Selection>,
    lists: bool,
) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg("--manifest")
        .arg(manifest)
        .args(["__render-template", "--flavor", flavor.as_arg()])
        .arg(template);
    if let Some(s) = selection {
        // `--opt=VALUE`: a revision is the user's text, never an option of its own.
        cmd.arg(format!("--selection-base={}", s.base))
            .arg(format!("--selection-head={}", s.head));
        cmd.args(s.groups.iter().map(|g| format!("--changed={g}")));
    }
    if lists {
        cmd.arg("--collected-stdin");
    }
    cmd.stdin(if lists { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("CIBOX_LOG", "error");
    // SAFETY: only setrlimit between fork and exec, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
            // Only ever lowered: a bound cibox itself runs under stays.
            let lowered = |resource, n: u64| {
                let was = getrlimit(resource).maximum.unwrap_or(u64::MAX);
                let n = n.min(was);
                setrlimit(
                    resource,
                    Rlimit {
                        current: Some(n),
                        maximum: Some(n),
                    },
                )
            };
            lowered(Resource::As, MEMORY)?;
            lowered(Resource::Cpu, CPU)?;
            Ok(())
        });
    }
    cmd
}

/// Kills a child that is still running when its time is up.
struct Watchdog {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<bool>,
}

impl Watchdog {
    fn start(child: &std::process::Child, limit: std::time::Duration) -> Watchdog {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || match stopped.recv_timeout(limit) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                true
            }
            _ => false,
        });
        Watchdog { stop, thread }
    }

    /// Stops it (call before the child is reaped); whether it killed the child.
    fn stop(self) -> bool {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or(false)
    }
}

/// The most of the collected lists a child reads from its parent: what collectors may
/// print, with room for the JSON around each entry.
const MAX_COLLECTED_BYTES: u64 = 4 * crate::manifest::MAX_COLLECT_BYTES as u64;

/// In the child: `m` with the lists its parent collected, read from standard input.
pub fn with_collected_stdin(
    m: crate::manifest::Manifest,
) -> Result<crate::manifest::Manifest, crate::error::Error> {
    let mut text = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_COLLECTED_BYTES)
        .read_to_end(&mut text)
        .map_err(|source| RenderError::Unreadable {
            template: std::path::PathBuf::from("(the collected test lists)"),
            source,
        })?;
    let collected: crate::manifest::Collected =
        serde_json::from_slice(&text).map_err(|e| RenderError::Unreadable {
            template: std::path::PathBuf::from("(the collected test lists)"),
            source: std::io::Error::other(e),
        })?;
    Ok(m.with_collected(&collected)?)
}
