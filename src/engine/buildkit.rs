//! BuildKit builds through the engine: `POST /build?version=2`, the engine's own
//! BuildKit (Docker 18.09 and later have it inside; no `# syntax=` frontend image is
//! pulled), with the build context streamed as the request body, as the classic build
//! sends it. Secrets (`RUN --mount=type=secret`) come from a session of cibox's own,
//! opened for every build as the docker CLI opens one: `POST /session` upgraded to
//! HTTP/2, on which the engine calls cibox's gRPC services (BuildKit's secrets and gRPC
//! health). A secret not given is `NotFound`, as BuildKit's own provider answers, so a
//! `required=false` mount of it is no file.
//!
//! Why not bollard's `build_image` with its `buildkit` feature: it builds this way too
//! (it works against Docker 20.10 offline), but the session it opens offers
//! registry credentials only, so a secret mount finds nothing, and it starts that
//! session itself for every BuildKit build, so no other session can take the build's
//! ID. The request is plain HTTP/1.1 over the engine's socket (hyper, as bollard uses),
//! the session's services are tonic servers for the protocol types bollard's own
//! `bollard-buildkit-proto` defines, and the progress the engine streams (BuildKit's
//! `StatusResponse`, base64 in `moby.buildkit.trace` messages) is decoded with prost.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bollard_buildkit_proto::health::health_server::{Health, HealthServer};
use bollard_buildkit_proto::health::{
    HealthCheckRequest, HealthCheckResponse, HealthListRequest, HealthListResponse,
    health_check_response::ServingStatus,
};
use bollard_buildkit_proto::moby::buildkit::secrets::v1::secrets_server::{Secrets, SecretsServer};
use bollard_buildkit_proto::moby::buildkit::secrets::v1::{GetSecretRequest, GetSecretResponse};
use bollard_buildkit_proto::moby::buildkit::v1::StatusResponse;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::images::BuildSpec;
use super::{Engine, EngineError};
use crate::mask::{MaskStream, Masker};

/// A secret a build may mount (`RUN --mount=type=secret,id=ID`): its value is given to
/// the engine through the build's session only, never in the request, a log or an
/// image.
#[derive(Clone)]
pub struct BuildSecret {
    pub id: String,
    pub value: Vec<u8>,
}

impl std::fmt::Debug for BuildSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BuildSecret({}, {} bytes)", self.id, self.value.len())
    }
}

/// What a build reports as it goes.
#[derive(Debug)]
pub enum BuildEvent<'a> {
    /// A step of the build started: BuildKit's name for it (`[stage 2/4] RUN …`), and
    /// whether it was taken from the cache.
    Step { name: &'a str, cached: bool },
    /// What a step printed (or the classic builder's output), as it comes, masked.
    Output(&'a str),
}

/// The oldest API with BuildKit in the engine's build endpoint (`version=2`, Docker
/// 18.09).
const BUILDKIT_API: (u64, u64) = (1, 39);

/// The most a build's messages may hold back (a line not yet ended).
const MAX_PENDING: usize = 16 << 20;

/// The last lines of output each step keeps, to say why it failed.
const KEPT_LINES: usize = 30;

impl Engine {
    /// Why this engine cannot build with BuildKit (`None` when it can): an API older
    /// than Docker 18.09's, `DOCKER_BUILDKIT=0`, or an engine address other than a
    /// Unix socket or plain TCP (the build's session is cibox's own connection).
    pub fn buildkit_missing(&self) -> Option<String> {
        if std::env::var("DOCKER_BUILDKIT")
            .is_ok_and(|v| matches!(v.trim(), "0" | "false" | "FALSE" | "False"))
        {
            return Some("DOCKER_BUILDKIT=0 asks for the classic builder".into());
        }
        let v = self.docker.client_version();
        if (v.major_version as u64, v.minor_version as u64) < BUILDKIT_API {
            return Some(format!(
                "the engine speaks API {}.{}, older than BuildKit's 1.39 (Docker 18.09)",
                v.major_version, v.minor_version
            ));
        }
        if self.host.starts_with("unix://") {
            return None;
        }
        if self.host.starts_with("tcp://")
            && std::env::var("DOCKER_TLS_VERIFY").is_ok_and(|v| !v.is_empty())
        {
            return Some(format!(
                "the engine at {} is reached over TLS, which cibox's BuildKit session does not speak",
                self.host
            ));
        }
        if self.host.starts_with("tcp://") {
            return None;
        }
        Some(format!(
            "the engine at {} is not a Unix socket or plain TCP address",
            self.host
        ))
    }

    /// Builds with the engine's BuildKit from a tar of the build context, as `spec`
    /// says, with `secrets` on a session of its own; tags the result `spec.tag` and
    /// returns its ID. What the build prints and its errors are masked by `mask`, as
    /// bytes, before they are text (each step's output as one stream).
    pub fn build_kit(
        &self,
        context_tar: std::fs::File,
        spec: &BuildSpec<'_>,
        (secrets, mask): (&[BuildSecret], &Masker),
        mut on: impl FnMut(BuildEvent<'_>),
    ) -> Result<String, EngineError> {
        let action = "building the image (BuildKit)";
        let rejected = |reason: String| EngineError::Rejected {
            action: action.into(),
            reason,
        };
        let api = |reason: String| EngineError::Api {
            action: action.into(),
            reason,
        };
        let session_id = crate::util::random_hex(16).map_err(|e| EngineError::Io {
            action: "naming the build's session".into(),
            reason: e.to_string(),
        })?;
        let query = build_query(spec, &session_id).map_err(|e| api(e.to_string()))?;
        let version = self.docker.client_version();
        let path = format!(
            "/v{}.{}/build?{query}",
            version.major_version, version.minor_version
        );
        let host = self.host.clone();
        self.rt.block_on(async {
            // The session first: the engine looks the build's session up when a step
            // mounts a secret, and it must be there by then. Every build has one, as
            // every `docker build` has: a step that mounts a secret not given
            // (`required=false`) is told it is not found and runs without it; with no
            // session at all BuildKit fails it (`no active sessions`).
            let session = open_session(&host, &session_id, secrets)
                .await
                .map_err(|e| api(format!("opening the build's session: {e}")))?;
            let result = async {
                let body = super::streamed(Box::new(context_tar))
                    .map(|chunk| chunk.map(hyper::body::Frame::data));
                let request = http::Request::post(path)
                    .header(http::header::HOST, "docker")
                    .header(http::header::CONTENT_TYPE, "application/x-tar")
                    .body(http_body_util::StreamBody::new(body))
                    .map_err(|e| api(e.to_string()))?;
                let mut sender = connect(&host).await.map_err(|e| api(e.to_string()))?;
                let response = sender
                    .send_request(request)
                    .await
                    .map_err(|e| api(e.to_string()))?;
                let status = response.status();
                let mut body = response.into_body();
                let mut progress = Progress::new(mask);
                let mut pending: Vec<u8> = Vec::new();
                let mut error_body = Vec::new();
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(|e| api(e.to_string()))?;
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if !status.is_success() {
                        if error_body.len() < 64 << 10 {
                            error_body.extend_from_slice(&data);
                        }
                        continue;
                    }
                    pending.extend_from_slice(&data);
                    while let Some(end) = memchr::memchr(b'\n', &pending) {
                        let line: Vec<u8> = pending.drain(..=end).collect();
                        progress.message(&line, &mut on).map_err(rejected)?;
                    }
                    if pending.len() > MAX_PENDING {
                        return Err(api(format!(
                            "the engine sent a message of over {} MiB",
                            MAX_PENDING >> 20
                        )));
                    }
                }
                if !status.is_success() {
                    let text = mask.mask_lossy(&error_body);
                    let message = serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|v| v["message"].as_str().map(str::to_string))
                        .unwrap_or_else(|| text.trim().to_string());
                    return Err(if status.is_client_error() {
                        rejected(message)
                    } else {
                        api(format!("{status}: {message}"))
                    });
                }
                progress.message(&pending, &mut on).map_err(rejected)?;
                progress.flush(&mut on);
                progress.id.clone().ok_or_else(|| {
                    rejected(format!(
                        "the engine reported no image ID{}",
                        progress.last_words()
                    ))
                })
            }
            .await;
            session.abort();
            result
        })
    }
}

/// The build request's query: what `spec` asks, and the session that serves the
/// build's secrets.
fn build_query(
    spec: &BuildSpec<'_>,
    session: &str,
) -> Result<String, serde_urlencoded::ser::Error> {
    let mut query: Vec<(&str, String)> = vec![
        ("version", "2".into()),
        ("dockerfile", spec.dockerfile.into()),
        ("t", spec.tag.into()),
        ("rm", "1".into()),
        ("forcerm", "1".into()),
        (
            "labels",
            serde_json::to_string(spec.labels).expect("labels serialise"),
        ),
        (
            "buildargs",
            serde_json::to_string(spec.build_args).expect("arguments serialise"),
        ),
    ];
    if spec.no_cache {
        query.push(("nocache", "1".into()));
    }
    if let Some(target) = spec.target {
        query.push(("target", target.into()));
    }
    if let Some(network) = spec.network {
        query.push(("networkmode", network.into()));
    }
    query.push(("session", session.into()));
    serde_urlencoded::to_string(&query)
}

/// An HTTP/1.1 connection to the engine, its driver spawned (with upgrades, for the
/// session).
async fn connect<B>(host: &str) -> std::io::Result<hyper::client::conn::http1::SendRequest<B>>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let io = dial(host).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

/// The engine's socket or TCP port, as `DOCKER_HOST` names it.
async fn dial(host: &str) -> std::io::Result<Conn> {
    if let Some(path) = host.strip_prefix("unix://") {
        return Ok(Conn::Unix(tokio::net::UnixStream::connect(path).await?));
    }
    if let Some(addr) = host.strip_prefix("tcp://") {
        let addr = addr.trim_end_matches('/');
        return Ok(Conn::Tcp(tokio::net::TcpStream::connect(addr).await?));
    }
    Err(std::io::Error::other(format!(
        "{host}: not a unix:// or tcp:// address"
    )))
}

/// A connection to the engine.
enum Conn {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// The build's session: `POST /session` upgraded to h2c, on which the engine is the
/// gRPC client of the services cibox serves (each one named in a header, as the
/// engine only calls what a session says it has). Returns the task serving it.
async fn open_session(
    host: &str,
    id: &str,
    secrets: &[BuildSecret],
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let mut sender = connect::<http_body_util::Empty<Bytes>>(host).await?;
    let mut request = http::Request::post("/session")
        .header(http::header::HOST, "docker")
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "h2c")
        .header("X-Docker-Expose-Session-Uuid", id)
        .header("X-Docker-Expose-Session-Name", "cibox")
        .header("X-Docker-Expose-Session-Sharedkey", "");
    for method in [
        "/moby.buildkit.secrets.v1.Secrets/GetSecret",
        "/grpc.health.v1.Health/Check",
    ] {
        request = request.header("X-Docker-Expose-Session-Grpc-Method", method);
    }
    let request = request
        .body(http_body_util::Empty::new())
        .map_err(std::io::Error::other)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(std::io::Error::other)?;
    if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        return Err(std::io::Error::other(format!(
            "the engine answered {} instead of switching to HTTP/2",
            response.status()
        )));
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(std::io::Error::other)?;
    let store = SecretStore {
        secrets: Arc::new(
            secrets
                .iter()
                .map(|s| (s.id.clone(), s.value.clone()))
                .collect(),
        ),
    };
    let incoming =
        futures_util::stream::iter([Ok::<_, std::io::Error>(SessionIo(TokioIo::new(upgraded)))]);
    Ok(tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(HealthServer::new(Healthy))
            .add_service(SecretsServer::new(store))
            .serve_with_incoming(incoming)
            .await;
    }))
}

/// The upgraded session connection, as tonic serves it.
struct SessionIo(TokioIo<hyper::upgrade::Upgraded>);

impl tonic::transport::server::Connected for SessionIo {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for SessionIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SessionIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// The session's health, which the engine checks while the build runs (a session
/// that does not answer is closed).
struct Healthy;

#[tonic::async_trait]
impl Health for Healthy {
    async fn check(
        &self,
        _: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        Ok(tonic::Response::new(HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        }))
    }

    async fn list(
        &self,
        _: tonic::Request<HealthListRequest>,
    ) -> Result<tonic::Response<HealthListResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("list"))
    }

    type WatchStream = Pin<
        Box<dyn futures_util::Stream<Item = Result<HealthCheckResponse, tonic::Status>> + Send>,
    >;

    async fn watch(
        &self,
        _: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("watch"))
    }
}

/// The build's secrets, by ID, for the engine to ask for.
struct SecretStore {
    secrets: Arc<HashMap<String, Vec<u8>>>,
}

#[tonic::async_trait]
impl Secrets for SecretStore {
    async fn get_secret(
        &self,
        request: tonic::Request<GetSecretRequest>,
    ) -> Result<tonic::Response<GetSecretResponse>, tonic::Status> {
        match self.secrets.get(&request.get_ref().id) {
            Some(value) => Ok(tonic::Response::new(GetSecretResponse {
                data: value.clone(),
            })),
            None => Err(tonic::Status::not_found(format!(
                "secret `{}` was not given to this build",
                request.get_ref().id
            ))),
        }
    }
}

/// One message of the build's stream, as the engine writes them.
#[derive(serde::Deserialize)]
struct Message {
    id: Option<String>,
    stream: Option<String>,
    aux: Option<serde_json::Value>,
    #[serde(rename = "errorDetail")]
    error_detail: Option<ErrorDetail>,
    error: Option<String>,
}

#[derive(serde::Deserialize)]
struct ErrorDetail {
    message: Option<String>,
}

/// What the build's messages said so far.
struct Progress<'m> {
    mask: &'m Masker,
    /// The built image's ID, once the engine names it.
    id: Option<String>,
    /// Steps (BuildKit's vertices) by digest: their name, and whether they were shown.
    steps: HashMap<String, Step>,
    /// The steps in the order they started, for the failure's last words.
    order: Vec<String>,
    /// Each step's output as it comes, masked (by step; `""` for the builder's own
    /// lines): what may be the start of a masked value is held back.
    streams: HashMap<String, MaskStream<'m>>,
    /// A step's output (masked) not yet ended by a newline, by step.
    partial: HashMap<String, String>,
}

#[derive(Default)]
struct Step {
    name: String,
    shown: bool,
    error: String,
    /// Its last lines of output.
    lines: std::collections::VecDeque<String>,
}

impl<'m> Progress<'m> {
    fn new(mask: &'m Masker) -> Progress<'m> {
        Progress {
            mask,
            id: None,
            steps: HashMap::new(),
            order: Vec::new(),
            streams: HashMap::new(),
            partial: HashMap::new(),
        }
    }

    /// Reads one message; `Err` carries the build's failure, with the failing step's
    /// last lines (masked).
    fn message(&mut self, line: &[u8], on: &mut impl FnMut(BuildEvent<'_>)) -> Result<(), String> {
        let line = line.trim_ascii();
        if line.is_empty() {
            return Ok(());
        }
        let Ok(m) = serde_json::from_slice::<Message>(line) else {
            return Ok(());
        };
        if let Some(err) = m
            .error_detail
            .and_then(|d| d.message)
            .or(m.error)
            .filter(|e| !e.is_empty())
        {
            self.flush(on);
            let failure = format!("{err}{}", self.last_words());
            return Err(self.mask.mask_str(&failure).into_owned());
        }
        match (m.id.as_deref(), m.aux) {
            (Some("moby.buildkit.trace"), Some(serde_json::Value::String(b64))) => {
                use base64::Engine as _;
                let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(b64) else {
                    return Ok(());
                };
                if let Ok(status) = <StatusResponse as prost::Message>::decode(bytes.as_slice()) {
                    self.status(status, on);
                }
            }
            (Some("moby.image.id"), Some(aux)) => {
                if let Some(id) = aux["ID"].as_str() {
                    self.id = Some(id.to_string());
                }
            }
            _ => {
                if let Some(text) = m.stream.as_deref() {
                    self.log("", text.as_bytes(), on);
                }
            }
        }
        Ok(())
    }

    fn status(&mut self, status: StatusResponse, on: &mut impl FnMut(BuildEvent<'_>)) {
        for v in status.vertexes {
            let step = self.steps.entry(v.digest.clone()).or_insert_with(|| {
                self.order.push(v.digest.clone());
                Step::default()
            });
            step.name = self.mask.mask_str(&v.name).into_owned();
            if !v.error.is_empty() {
                step.error = v.error.clone();
            }
            // BuildKit's own steps (`[internal] load …`, unpacking the context the
            // request carried) are not the recipe's.
            let internal = v.name.starts_with("[internal]") || v.name == "copy /context /";
            if !step.shown && !internal && (v.started.is_some() || v.cached) {
                step.shown = true;
                on(BuildEvent::Step {
                    name: &step.name,
                    cached: v.cached,
                });
            }
        }
        for log in status.logs {
            self.log(&log.vertex, &log.msg, on);
        }
    }

    /// A piece of a step's output (`vertex`), through its mask stream.
    fn log(&mut self, vertex: &str, piece: &[u8], on: &mut impl FnMut(BuildEvent<'_>)) {
        let mask = self.mask;
        let shown = self
            .streams
            .entry(vertex.to_string())
            .or_insert_with(|| mask.stream())
            .push(piece);
        self.shown(vertex, &shown, on);
    }

    /// What each step's mask stream holds back, let out: the build ended.
    fn flush(&mut self, on: &mut impl FnMut(BuildEvent<'_>)) {
        let mut held: Vec<(String, Vec<u8>)> = self
            .streams
            .iter_mut()
            .map(|(vertex, stream)| (vertex.clone(), stream.finish()))
            .filter(|(_, rest)| !rest.is_empty())
            .collect();
        held.sort_by_key(|(v, _)| self.order.iter().position(|o| o == v));
        for (vertex, rest) in held {
            self.shown(&vertex, &rest, on);
        }
    }

    /// Output of step `vertex`, masked: shown, and its lines kept for a failure.
    fn shown(&mut self, vertex: &str, shown: &[u8], on: &mut impl FnMut(BuildEvent<'_>)) {
        if shown.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(shown);
        on(BuildEvent::Output(&text));
        let partial = self.partial.entry(vertex.to_string()).or_default();
        partial.push_str(&text);
        if let Some(end) = partial.rfind('\n') {
            let done: String = partial.drain(..=end).collect();
            if let Some(step) = self.steps.get_mut(vertex) {
                for l in done.lines() {
                    if step.lines.len() == KEPT_LINES {
                        step.lines.pop_front();
                    }
                    step.lines.push_back(l.to_string());
                }
            }
        }
        // A step that prints without an end of line is held to a bounded tail.
        if partial.len() > 64 << 10 {
            let cut = partial.len() - (16 << 10);
            let cut = (cut..partial.len())
                .find(|&i| partial.is_char_boundary(i))
                .unwrap_or(partial.len());
            partial.drain(..cut);
        }
    }

    /// The failed step and what it printed last, for a failure's message.
    fn last_words(&self) -> String {
        let failed = self
            .order
            .iter()
            .rev()
            .filter_map(|d| self.steps.get(d))
            .find(|s| !s.error.is_empty());
        match failed {
            Some(step) if !step.lines.is_empty() => format!(
                "\n  in step {}; its last lines:\n    {}",
                step.name,
                step.lines
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n    ")
            ),
            Some(step) => format!("\n  in step {}", step.name),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests;
