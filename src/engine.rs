//! Access to the container engine (Docker API over its socket, through bollard). The rest
//! of cibox talks to the engine only through this module, and only synchronously: the
//! [`Engine`] owns the one async runtime cibox has, and tokio lives only behind it. The
//! domain code around it is flock, processes and files; what is asynchronous (engine
//! streams, a deadline racing a log stream) stays in here.

mod api;
pub use api::ContainerEngine;

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::{
    BuildImageOptionsBuilder, CreateImageOptionsBuilder, ImportImageOptionsBuilder,
};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::exit::Failure;

/// How long to wait for the engine to answer the first request.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "container engine unreachable at {host}: {reason}; start dockerd (or point DOCKER_HOST at a running engine) and retry"
    )]
    Unreachable { host: String, reason: String },
    #[error("container engine: {action} failed: {reason}")]
    Api { action: String, reason: String },
    /// The engine refused what we gave it (a corrupt archive, a failing build step).
    #[error("{action}: {reason}")]
    Rejected { action: String, reason: String },
    #[error("{action}: {reason}")]
    Io { action: String, reason: String },
    /// The image a container was to be made from is not (or no longer) in the engine.
    #[error("{image} is not present in the local engine (removed since it was verified?)")]
    ImageMissing { image: String },
    #[error("cannot start the async runtime for the engine: {0}")]
    Runtime(String),
}

impl EngineError {
    pub fn failure(&self) -> Failure {
        match self {
            // It would not take what we gave it, or the image is gone: the image's fault.
            EngineError::Rejected { .. } | EngineError::ImageMissing { .. } => {
                Failure::ImageRefused
            }
            _ => Failure::Infra,
        }
    }
}

/// What the engine's image IDs are a digest of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdSemantics {
    /// Classic storage drivers (overlay2, …): the ID is the sha256 of the image config
    /// JSON; it survives save/load and covers the labels.
    ConfigDigest,
    /// containerd image store: the ID is the manifest (or index) digest.
    ManifestDigest,
}

impl IdSemantics {
    pub fn describe(self) -> &'static str {
        match self {
            IdSemantics::ConfigDigest => {
                "image IDs are config digests (classic storage driver): the ID covers the config and its labels and survives save/load"
            }
            IdSemantics::ManifestDigest => {
                "image IDs are manifest/index digests (containerd image store): the ID covers the config through the manifest"
            }
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct EngineInfo {
    pub host: String,
    pub server_version: String,
    pub api_version: String,
    pub storage_driver: String,
    pub id_semantics: IdSemantics,
    pub runtimes: Vec<String>,
    pub default_runtime: String,
    pub cdi_spec_dirs: Vec<String>,
    /// Where the engine keeps its state (`DockerRootDir`: images, containers and their
    /// configs, environment secrets included).
    pub root_dir: Option<String>,
}

/// What cibox needs to know about a local image.
#[derive(Debug, Clone)]
pub struct ImageDetails {
    pub id: String,
    pub labels: HashMap<String, String>,
    pub repo_tags: Vec<String>,
    pub size: i64,
    /// Its layers' digests (`sha256:…` of each uncompressed layer), bottom first.
    pub layers: Vec<String>,
}

/// A connection to the engine with the runtime that drives it. One per process: it is
/// `Sync`, so parallel batches share it and its connection pool. The runtime is a
/// current-thread one: each blocking call runs on the caller's thread, and whichever
/// caller is inside the runtime drives the sockets for all of them. (A worker thread
/// would cost a cross-thread wake-up per log frame: a batch printing 500 MB in short
/// lines took several times longer that way.)
pub struct Engine {
    rt: tokio::runtime::Runtime,
    docker: Docker,
    host: String,
}

fn host() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unix:///var/run/docker.sock".to_string())
}

fn reason(e: &bollard::errors::Error) -> String {
    use bollard::errors::Error as E;
    match e {
        E::DockerResponseServerError { message, .. } => message.trim().to_string(),
        E::DockerStreamError { error } => error.trim().to_string(),
        other => {
            // Walk to the innermost cause: "No such file or directory" says more than
            // "error trying to connect".
            let mut s = other.to_string();
            let mut src = std::error::Error::source(other);
            while let Some(inner) = src {
                s = inner.to_string();
                src = inner.source();
            }
            s
        }
    }
}

fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// How a followed container ended, or why cibox stopped following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Its deadline passed: stopped (SIGTERM, then SIGKILL after the grace).
    Deadline,
    /// `interrupted` said so (a signal to cibox): killed at once.
    Interrupted,
}

/// What [`Engine::follow_exec`] reports while it follows a batch.
pub enum Followed<'a> {
    /// A chunk of the container's output (stdout and stderr interleaved).
    Output(&'a [u8]),
    /// The deadline passed; the container is being stopped.
    DeadlinePassed,
    /// The log stream broke before the container ended.
    StreamBroke(&'a EngineError),
}

/// The end of a followed container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowEnd {
    /// Why cibox ended it, if it did.
    pub stopped: Option<Stop>,
    /// The container's exit code; `None` when it did not end within the wait after
    /// its output closed (it was then killed).
    pub exit: Option<i64>,
}

/// What [`Engine::follow_exec`] runs: `cmd` as `user`, stopped at `deadline` (SIGTERM,
/// then SIGKILL after `grace`).
pub struct Steps<'a> {
    pub cmd: Vec<String>,
    pub user: &'a str,
    pub deadline: Instant,
    pub grace: Duration,
}

/// How often [`Engine::follow_exec`] asks whether it was interrupted.
const INTERRUPT_POLL: Duration = Duration::from_millis(100);
/// How long a command whose output has closed gets to report its exit.
const EXIT_WAIT: Duration = Duration::from_secs(30);
/// How long a batch's output may stay open after its processes were sent SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long the output of a command that has ended may stay open (held by a worker it
/// left in the background) before it is no longer followed.
const OUTPUT_DRAIN: Duration = Duration::from_secs(1);

impl Engine {
    /// Connects to `DOCKER_HOST` (default the local socket) and negotiates the API
    /// version down to what the engine speaks.
    pub fn connect() -> Result<Engine, EngineError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| EngineError::Runtime(e.to_string()))?;
        let host = host();
        let unreachable = |reason: String| EngineError::Unreachable {
            host: host.clone(),
            reason,
        };
        let docker = {
            // bollard registers the connector with the runtime it is made in.
            let _in_rt = rt.enter();
            Docker::connect_with_host(&host).map_err(|e| unreachable(reason(&e)))?
        };
        let docker = rt.block_on(async {
            match tokio::time::timeout(CONNECT_TIMEOUT, docker.negotiate_version()).await {
                Ok(Ok(d)) => Ok(d),
                Ok(Err(e)) => Err(unreachable(reason(&e))),
                Err(_) => Err(unreachable(format!(
                    "no answer within {}s",
                    CONNECT_TIMEOUT.as_secs()
                ))),
            }
        })?;
        Ok(Engine { rt, docker, host })
    }

    /// The API version agreed with the engine (`1.41` for Docker 20.10).
    pub fn api_version(&self) -> String {
        self.docker.client_version().to_string()
    }

    /// Whether the engine can make a bind mount read-only all the way down
    /// (`ReadOnlyForceRecursive`, API 1.44, Docker 25); older ones ignore the option.
    pub fn recursive_read_only(&self) -> bool {
        let v = self.docker.client_version();
        (v.major_version, v.minor_version) >= (1, 44)
    }

    fn api(action: &str, e: bollard::errors::Error) -> EngineError {
        EngineError::Api {
            action: action.to_string(),
            reason: reason(&e),
        }
    }

    pub fn info(&self) -> Result<EngineInfo, EngineError> {
        let info = self
            .rt
            .block_on(self.docker.info())
            .map_err(|e| Self::api("reading engine info", e))?;
        let driver_status = info.driver_status.unwrap_or_default();
        let containerd_store = info
            .driver
            .as_deref()
            .is_some_and(|d| d.contains("snapshotter"))
            || driver_status
                .iter()
                .flatten()
                .any(|s| s.contains("io.containerd.snapshotter.v1"));
        let mut runtimes: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
        runtimes.sort();
        Ok(EngineInfo {
            host: self.host.clone(),
            server_version: info.server_version.unwrap_or_default(),
            api_version: self.docker.client_version().to_string(),
            storage_driver: info.driver.unwrap_or_default(),
            id_semantics: if containerd_store {
                IdSemantics::ManifestDigest
            } else {
                IdSemantics::ConfigDigest
            },
            runtimes,
            default_runtime: info.default_runtime.unwrap_or_default(),
            cdi_spec_dirs: info.cdi_spec_dirs.unwrap_or_default(),
            root_dir: info.docker_root_dir,
        })
    }

    /// Looks an image up by its full ID, or by any reference the engine understands
    /// (right after a load that reported a tag). Never pulls; `None` when it is not
    /// present.
    pub fn inspect(&self, reference: &str) -> Result<Option<ImageDetails>, EngineError> {
        match self.rt.block_on(self.docker.inspect_image(reference)) {
            Ok(img) => Ok(Some(ImageDetails {
                id: img.id.unwrap_or_default(),
                labels: img.config.and_then(|c| c.labels).unwrap_or_default(),
                repo_tags: img.repo_tags.unwrap_or_default(),
                size: img.size.unwrap_or_default(),
                layers: img.root_fs.and_then(|r| r.layers).unwrap_or_default(),
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(Self::api("inspecting image", e)),
        }
    }

    /// Pulls `repository@digest` from its registry (`POST /images/create`), as the
    /// docker CLI asks for a digest: the repository, and the digest as the tag. A
    /// registry that does not have it, or refuses, is `Rejected`; one that cannot be
    /// reached is an `Api` failure.
    pub fn pull(&self, repository: &str, digest: &str) -> Result<(), EngineError> {
        let action = format!("pulling {repository}@{digest}");
        self.rt.block_on(async {
            let opts = CreateImageOptionsBuilder::default()
                .from_image(repository)
                .tag(digest)
                .build();
            let mut progress = self.docker.create_image(Some(opts), None, None);
            while let Some(item) = progress.next().await {
                match item {
                    Ok(info) => {
                        if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                            return Err(EngineError::Rejected {
                                action: action.clone(),
                                reason: detail,
                            });
                        }
                    }
                    Err(e) => {
                        let text = reason(&e);
                        let missing = is_not_found(&e)
                            || text.contains("manifest unknown")
                            || text.contains("not found");
                        return Err(if missing {
                            EngineError::Rejected {
                                action: action.clone(),
                                reason: text,
                            }
                        } else {
                            EngineError::Api {
                                action: action.clone(),
                                reason: text,
                            }
                        });
                    }
                }
            }
            Ok(())
        })
    }

    /// Streams a docker-archive into the engine (`POST /images/load`) and returns what
    /// it reports loading: image IDs (`sha256:…`) or references (`name:tag`). The
    /// archive is read on a thread of its own, in 256 KiB chunks, as the engine takes it.
    pub fn load(&self, archive: Box<dyn Read + Send>) -> Result<Vec<String>, EngineError> {
        let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
        // Not joined: if the engine refuses the archive midway, the reader may sit in
        // a read of a stalled producer; it ends at its next send (the body is gone)
        // or at the producer's end.
        std::thread::spawn(move || {
            let mut archive = archive;
            loop {
                let mut buf = vec![0u8; 256 * 1024];
                let item = match archive.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        buf.truncate(n);
                        Ok(Bytes::from(buf))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                let failed = item.is_err();
                // The engine stopped reading (it refused the archive): stop too.
                if tx.blocking_send(item).is_err() || failed {
                    return;
                }
            }
        });
        let body = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        self.rt.block_on(async {
            let opts = ImportImageOptionsBuilder::default().quiet(true).build();
            let mut progress = self.docker.import_image_stream(opts, body, None);
            let mut loaded = Vec::new();
            while let Some(item) = progress.next().await {
                let info = item.map_err(|e| EngineError::Rejected {
                    action: "loading the archive".into(),
                    reason: reason(&e),
                })?;
                for text in info.stream.iter().chain(info.status.iter()) {
                    for line in text.lines() {
                        if let Some(id) = line.trim().strip_prefix("Loaded image ID: ") {
                            loaded.push(id.trim().to_string());
                        } else if let Some(r) = line.trim().strip_prefix("Loaded image: ") {
                            loaded.push(r.trim().to_string());
                        }
                    }
                }
            }
            Ok(loaded)
        })
    }

    /// Builds a Dockerfile with the classic builder from a tar of its context, with the
    /// given labels, and tags the result so it is not garbage as a dangling image.
    /// Returns the new image's ID.
    pub fn build(
        &self,
        context_tar: std::fs::File,
        dockerfile: &str,
        labels: &HashMap<String, String>,
        tag: &str,
        no_cache: bool,
        mut on_output: impl FnMut(&str),
    ) -> Result<String, EngineError> {
        let opts = BuildImageOptionsBuilder::default()
            .dockerfile(dockerfile)
            .t(tag)
            .labels(labels)
            .rm(true)
            .forcerm(true)
            .nocache(no_cache)
            .build();
        let id = self.rt.block_on(async {
            // Streamed from disk: a rootfs context can be hundreds of megabytes.
            let body = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(context_tar));
            let mut stream =
                self.docker
                    .build_image(opts, None, Some(bollard::body_try_stream(body)));
            let mut id = None;
            let mut last_lines: Vec<String> = Vec::new();
            while let Some(item) = stream.next().await {
                let info = item.map_err(|e| EngineError::Rejected {
                    action: "building the image".into(),
                    reason: reason(&e),
                })?;
                if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                    return Err(EngineError::Rejected {
                        action: "building the image".into(),
                        reason: detail,
                    });
                }
                if let Some(text) = info.stream.as_deref() {
                    on_output(text);
                    last_lines.extend(text.lines().map(str::to_string));
                    if let Some(rest) = text.trim().strip_prefix("Successfully built ") {
                        id.get_or_insert(rest.trim().to_string());
                    }
                }
                if let Some(aux) = info.aux.and_then(|a| a.id) {
                    id = Some(aux);
                }
            }
            id.ok_or_else(|| EngineError::Rejected {
                action: "building the image".into(),
                reason: format!(
                    "the engine reported no image ID; last output: {}",
                    last_lines.last().map(String::as_str).unwrap_or("none")
                ),
            })
        })?;
        // The classic builder's "Successfully built" gives a short ID; resolve it.
        match self.inspect(&id)? {
            Some(img) => Ok(img.id),
            None => Err(EngineError::Rejected {
                action: "building the image".into(),
                reason: format!("built image {id} is not present afterwards"),
            }),
        }
    }

    /// Removes an image by ID (not forced: an image a container uses stays).
    pub fn remove_image(&self, id: &str) -> Result<(), EngineError> {
        self.rt
            .block_on(self.docker.remove_image(
                id,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            ))
            .map(|_| ())
            .map_err(|e| Self::api("removing an image", e))
    }

    /// Writes `docker save` of one image to `to`, atomically (a temp file renamed into
    /// place), and returns the number of bytes written.
    pub fn save(&self, id: &str, to: &Path) -> Result<u64, EngineError> {
        let io = |e: std::io::Error| EngineError::Io {
            action: format!("writing {}", to.display()),
            reason: e.to_string(),
        };
        let dir = to
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let tmp = dir.join(format!(
            ".{}.cibox-partial-{}",
            to.file_name().and_then(|n| n.to_str()).unwrap_or("image"),
            std::process::id()
        ));
        let result = self.rt.block_on(async {
            let mut file = tokio::fs::File::create(&tmp).await.map_err(io)?;
            let mut stream = self.docker.export_image(id);
            let mut written = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| Self::api("saving the image", e))?;
                written += chunk.len() as u64;
                file.write_all(&chunk).await.map_err(io)?;
            }
            file.sync_all().await.map_err(io)?;
            tokio::fs::rename(&tmp, to).await.map_err(io)?;
            Ok(written)
        });
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

/// Why a container ended, when cibox did not stop it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndCause {
    /// The kernel killed it for going over its memory limit.
    OutOfMemory,
    /// Someone killed it through the engine, with this signal (a number, or empty
    /// when the engine did not say).
    KilledThroughEngine(String),
    /// Nothing says it was not its own doing.
    Itself,
}

/// Who removed a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Removed,
    /// It was gone, or going, already: someone else removed it.
    ByOthers,
}

/// A tar archive streamed from a container, read as a plain [`Read`]: each read waits
/// for the next chunk (up to [`CHUNK_WAIT`]), asking `stop` every 100 ms meanwhile (its
/// reason ends the read).
pub struct Download<'a> {
    rt: &'a tokio::runtime::Runtime,
    stream: std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<Bytes, bollard::errors::Error>> + 'a>,
    >,
    chunk: Bytes,
    stop: Box<dyn Fn() -> Option<String> + 'a>,
}

/// How long one chunk of a download may take.
const CHUNK_WAIT: Duration = Duration::from_secs(30);

impl Read for Download<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let give_up = Instant::now() + CHUNK_WAIT;
        while self.chunk.is_empty() {
            if let Some(why) = (self.stop)() {
                return Err(std::io::Error::other(why));
            }
            let next = self
                .rt
                .block_on(async { tokio::time::timeout(INTERRUPT_POLL, self.stream.next()).await });
            match next {
                Err(_) if Instant::now() >= give_up => {
                    return Err(std::io::Error::other(format!(
                        "no data from the engine within {} s",
                        CHUNK_WAIT.as_secs()
                    )));
                }
                Err(_) => {}
                Ok(None) => return Ok(0),
                Ok(Some(Err(e))) => return Err(std::io::Error::other(reason(&e))),
                Ok(Some(Ok(b))) => self.chunk = b,
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

/// A container cibox created, as listed by the engine.
#[derive(Debug, Clone)]
pub struct ContainerInfo {
    pub id: String,
    pub name: String,
    pub labels: HashMap<String, String>,
    pub running: bool,
}

impl Engine {
    /// Creates a container (never pulls: the image must be local, by ID).
    pub fn create_container(
        &self,
        name: &str,
        body: bollard::models::ContainerCreateBody,
    ) -> Result<String, EngineError> {
        let image = body.image.clone().unwrap_or_default();
        let opts = bollard::query_parameters::CreateContainerOptions {
            name: Some(name.to_string()),
            ..Default::default()
        };
        match self
            .rt
            .block_on(self.docker.create_container(Some(opts), body))
        {
            Ok(r) => Ok(r.id),
            // 404 on create: the image is gone (the name cannot be "not found").
            Err(e) if is_not_found(&e) => Err(EngineError::ImageMissing { image }),
            Err(e) => Err(Self::api("creating the container", e)),
        }
    }

    /// Starts a container; the engine's reason when it cannot (a GPU request on an
    /// engine without a GPU runtime fails here).
    pub fn start_container(&self, id: &str) -> Result<(), String> {
        self.rt
            .block_on(
                self.docker
                    .start_container(id, None::<bollard::query_parameters::StartContainerOptions>),
            )
            .map_err(|e| reason(&e))
    }

    /// Runs a batch's steps in a running container and follows them to their end: their
    /// output goes to `on`, its `deadline` is enforced (SIGTERM to every process of
    /// `user` in the container, then SIGKILL after `grace`), and `interrupted` is asked
    /// every 100 ms (true: SIGKILL to all of them at once). Returns once the command has
    /// ended and its exit code is known (`None` when the engine cannot say, as when the
    /// container itself died). The container lives on, so that what the batch left in
    /// its mounts can still be copied out.
    ///
    /// Both callbacks run inside the engine's runtime: they must be quick and must not
    /// call the engine (that would nest `block_on`).
    pub fn follow_exec(
        &self,
        id: &str,
        run: Steps<'_>,
        mut interrupted: impl FnMut() -> bool,
        mut on: impl FnMut(Followed<'_>),
    ) -> Result<FollowEnd, EngineError> {
        let Steps {
            cmd,
            user,
            deadline,
            grace,
        } = run;
        self.rt.block_on(async {
            let exec = self
                .docker
                .create_exec(
                    id,
                    bollard::exec::CreateExecOptions {
                        attach_stdout: Some(true),
                        attach_stderr: Some(true),
                        cmd: Some(cmd),
                        user: Some(user.to_string()),
                        working_dir: Some("/".to_string()),
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| Self::api("starting the batch in its container", e))?
                .id;
            let started = self
                .docker
                .start_exec(&exec, None)
                .await
                .map_err(|e| Self::api("starting the batch in its container", e))?;
            let bollard::exec::StartExecResults::Attached { mut output, .. } = started else {
                return Err(EngineError::Api {
                    action: "starting the batch in its container".into(),
                    reason: "the engine did not attach its output".into(),
                });
            };
            let deadline = tokio::time::Instant::from_std(deadline);
            let mut tick = tokio::time::interval(INTERRUPT_POLL);
            let mut stopped = None;
            let mut kill_at: Option<tokio::time::Instant> = None;
            // When the last SIGKILL went out: a process stuck where no signal reaches
            // (in a driver, say) must not hold cibox past KILL_WAIT after it.
            let mut killed_at: Option<tokio::time::Instant> = None;
            // When the command ended while a process it left holds its output open.
            let mut ended_at: Option<tokio::time::Instant> = None;
            loop {
                tokio::select! {
                    chunk = output.next() => match chunk {
                        Some(Ok(out)) => on(Followed::Output(&out.into_bytes())),
                        Some(Err(e)) => {
                            on(Followed::StreamBroke(&Self::api("reading the batch's output", e)));
                            break;
                        }
                        None => break,
                    },
                    _ = tokio::time::sleep_until(deadline), if stopped.is_none() => {
                        stopped = Some(Stop::Deadline);
                        on(Followed::DeadlinePassed);
                        self.signal_all(id, user, "TERM").await?;
                        kill_at = Some(tokio::time::Instant::now() + grace);
                    }
                    _ = async { tokio::time::sleep_until(kill_at.unwrap_or(deadline)).await }, if kill_at.is_some() => {
                        kill_at = None;
                        killed_at = Some(tokio::time::Instant::now());
                        self.signal_all(id, user, "KILL").await?;
                    }
                    _ = tick.tick() => {
                        if stopped != Some(Stop::Interrupted) && interrupted() {
                            stopped = Some(Stop::Interrupted);
                            kill_at = None;
                            killed_at = Some(tokio::time::Instant::now());
                            self.signal_all(id, user, "KILL").await?;
                        }
                        if killed_at.is_some_and(|t| tokio::time::Instant::now() >= t + KILL_WAIT) {
                            break;
                        }
                        // A worker the command left in the background can keep its
                        // output open after it ended: give that a moment, then go on.
                        match ended_at {
                            Some(t) if tokio::time::Instant::now() >= t + OUTPUT_DRAIN => break,
                            Some(_) => {}
                            None => if self.exec_exit(&exec).await.is_some() {
                                ended_at = Some(tokio::time::Instant::now());
                            },
                        }
                    }
                }
            }
            // The output closes a moment before the engine reports the exit.
            let until = tokio::time::Instant::now()
                + if killed_at.is_some() {
                    OUTPUT_DRAIN
                } else {
                    EXIT_WAIT
                };
            let exit = loop {
                match self.exec_exit(&exec).await {
                    Some(code) => break Some(code),
                    None if tokio::time::Instant::now() >= until || !self.running(id).await => {
                        break None;
                    }
                    None => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            };
            Ok(FollowEnd { stopped, exit })
        })
    }

    /// The exit code of an exec that has ended; `None` while it runs or when the
    /// engine cannot say.
    async fn exec_exit(&self, exec: &str) -> Option<i64> {
        match self.docker.inspect_exec(exec).await {
            Ok(r) if r.running != Some(true) => r.exit_code,
            _ => None,
        }
    }

    /// Whether a container still runs (false when it is gone or cannot be asked).
    pub fn is_running(&self, id: &str) -> bool {
        self.rt.block_on(self.running(id))
    }

    /// The name of the volume mounted at `target` in a container, if any.
    pub fn volume_at(&self, id: &str, target: &str) -> Option<String> {
        let details = self
            .rt
            .block_on(self.docker.inspect_container(id, None))
            .ok()?;
        details
            .mounts?
            .into_iter()
            .find(|m| m.destination.as_deref() == Some(target))?
            .name
    }

    /// Removes a volume; one already gone is no error. A volume still in use (its
    /// container being removed by someone else) is tried again for up to 5 s.
    pub fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            match self.rt.block_on(
                self.docker
                    .remove_volume(name, None::<bollard::query_parameters::RemoveVolumeOptions>),
            ) {
                Ok(())
                | Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => return Ok(()),
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 409, ..
                }) if Instant::now() < until => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => return Err(Self::api("removing the reports volume", e)),
            }
        }
    }

    /// Whether a container still runs (false when it is gone).
    async fn running(&self, id: &str) -> bool {
        self.docker
            .inspect_container(id, None)
            .await
            .is_ok_and(|c| c.state.and_then(|s| s.running) == Some(true))
    }

    /// Sends `signal` to every process of `user` in the container (`kill -1` from a
    /// shell of that user; the container's keeper belongs to root and stays).
    async fn signal_all(&self, id: &str, user: &str, signal: &str) -> Result<(), EngineError> {
        let created = self
            .docker
            .create_exec(
                id,
                bollard::exec::CreateExecOptions {
                    cmd: Some(vec![
                        "/bin/sh".to_string(),
                        "-c".to_string(),
                        format!("kill -{signal} -1"),
                    ]),
                    user: Some(user.to_string()),
                    ..Default::default()
                },
            )
            .await;
        let exec = match created {
            Ok(r) => r.id,
            // The container is gone or stopped: nothing is left to signal.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404 | 409,
                ..
            }) => return Ok(()),
            Err(e) => return Err(Self::api("signalling the batch", e)),
        };
        let opts = bollard::exec::StartExecOptions {
            detach: true,
            ..Default::default()
        };
        match self.docker.start_exec(&exec, Some(opts)).await {
            Ok(_)
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404 | 409,
                ..
            }) => Ok(()),
            Err(e) => Err(Self::api("signalling the batch", e)),
        }
    }

    /// Streams the tar archive of `path` in a container (the engine's archive API),
    /// until `stop` gives a reason.
    pub fn download<'a>(
        &'a self,
        id: &str,
        path: &str,
        stop: impl Fn() -> Option<String> + 'a,
    ) -> Download<'a> {
        let opts = bollard::query_parameters::DownloadFromContainerOptions {
            path: path.to_string(),
        };
        Download {
            rt: &self.rt,
            stream: Box::pin(self.docker.download_from_container(id, Some(opts))),
            chunk: Bytes::new(),
            stop: Box::new(stop),
        }
    }

    /// Removes a container (killing it if it runs) with its anonymous volumes.
    pub fn remove_container(&self, id: &str) -> Result<(), EngineError> {
        self.remove(id).map(|_| ())
    }

    /// Removes a container as [`Engine::remove_container`] does, and says whether
    /// someone else had removed it (or was removing it) first.
    pub fn remove(&self, id: &str) -> Result<Removal, EngineError> {
        let opts = bollard::query_parameters::RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        match self
            .rt
            .block_on(self.docker.remove_container(id, Some(opts)))
        {
            Ok(()) => Ok(Removal::Removed),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(Removal::ByOthers),
            // Removal already in progress (a concurrent cleanup): it will be gone.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                message,
            }) if message.contains("already in progress") => Ok(Removal::ByOthers),
            Err(e) => Err(Self::api("removing the container", e)),
        }
    }

    /// Why a container that ended by itself (cibox did not stop it) ended, as far as
    /// the engine knows: the out-of-memory flag of its state, and its `oom` and `kill`
    /// events (`docker kill`, `docker stop`) since `since_unix`. A kill from the host that
    /// bypasses the engine leaves no trace and reads as [`EndCause::Itself`].
    pub fn end_cause(&self, id: &str, since_unix: u64) -> Result<EndCause, EngineError> {
        let details = self
            .rt
            .block_on(self.docker.inspect_container(id, None))
            .map_err(|e| Self::api("inspecting the container", e))?;
        if details.state.and_then(|s| s.oom_killed) == Some(true) {
            return Ok(EndCause::OutOfMemory);
        }
        // Now, to the nanosecond: a whole second in the future would hold the stream
        // open until then.
        let until = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or("0".to_string(), |d| {
                format!("{}.{:09}", d.as_secs(), d.subsec_nanos())
            });
        let opts = bollard::query_parameters::EventsOptions {
            since: Some(since_unix.to_string()),
            until: Some(until),
            filters: Some(HashMap::from([
                ("type".to_string(), vec!["container".to_string()]),
                ("container".to_string(), vec![id.to_string()]),
                (
                    "event".to_string(),
                    vec!["kill".to_string(), "oom".to_string()],
                ),
            ])),
        };
        // With `until` the engine ends the stream itself; the timeout is for an engine
        // that does not.
        let events = self
            .rt
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(10),
                    self.docker.events(Some(opts)).take(64).collect::<Vec<_>>(),
                )
                .await
            })
            .map_err(|_| EngineError::Api {
                action: "reading the container's events".into(),
                reason: "no answer within 10 s".into(),
            })?;
        // Out of memory wins: the kernel's kill is the cause, any other kill came after.
        let mut cause = EndCause::Itself;
        for event in events {
            let event = event.map_err(|e| Self::api("reading the container's events", e))?;
            if event.action.as_deref() == Some("oom") {
                return Ok(EndCause::OutOfMemory);
            }
            let signal = event
                .actor
                .and_then(|a| a.attributes)
                .and_then(|a| a.get("signal").cloned())
                .unwrap_or_default();
            cause = EndCause::KilledThroughEngine(signal);
        }
        Ok(cause)
    }

    /// Containers (running or not) carrying all of `labels` (`key=value`).
    pub fn containers_with_labels(
        &self,
        labels: &[String],
    ) -> Result<Vec<ContainerInfo>, EngineError> {
        let opts = bollard::query_parameters::ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_string(), labels.to_vec())])),
            ..Default::default()
        };
        let list = self
            .rt
            .block_on(self.docker.list_containers(Some(opts)))
            .map_err(|e| Self::api("listing containers", e))?;
        Ok(list
            .into_iter()
            .map(|c| ContainerInfo {
                id: c.id.unwrap_or_default(),
                name: c
                    .names
                    .unwrap_or_default()
                    .first()
                    .map(|n| n.trim_start_matches('/').to_string())
                    .unwrap_or_default(),
                labels: c.labels.unwrap_or_default(),
                running: c.state.is_some_and(|s| {
                    matches!(
                        s,
                        bollard::models::ContainerSummaryStateEnum::RUNNING
                            | bollard::models::ContainerSummaryStateEnum::RESTARTING
                            | bollard::models::ContainerSummaryStateEnum::PAUSED
                            | bollard::models::ContainerSummaryStateEnum::CREATED
                    )
                }),
            })
            .collect())
    }
}
