//! Access to the container engine (Docker API over its socket, through bollard). The rest
//! of cibox talks to the engine only through this module, and only synchronously: the
//! [`Engine`] owns the one async runtime cibox has, and tokio lives only behind it. The
//! domain code around it is flock, processes and files; what is asynchronous (engine
//! streams, a deadline racing a log stream) stays in here.

mod api;
pub mod auth;
mod buildkit;
mod capture;
mod containers;
mod host_view;
mod images;

pub use api::ContainerEngine;
pub use buildkit::{BuildEvent, BuildSecret};
pub use capture::{CaptureBounds, CaptureEnd};
pub use containers::{
    ContainerInfo, EndCause, FollowEnd, Followed, Removal, Steps, Stop, VolumeInfo,
};
pub use host_view::{HostFolder, HostView, report_host_folders};
pub use images::BuildSpec;

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;

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
    /// An error whose text ran to many lines (a failed build and its failed step's
    /// last lines): its first line, and the others to print under it.
    #[error("{headline}")]
    InLines {
        headline: String,
        details: Vec<String>,
        failure: Failure,
    },
}

impl EngineError {
    /// The same error, a text of many lines said as a headline and the lines under
    /// it (each one escaped where it is printed, so a newline the engine's text holds
    /// is a line under the headline, never a `\n` in it). Their indent is kept, less
    /// the two spaces the lines under a headline get.
    pub fn in_lines(self) -> EngineError {
        let text = self.to_string();
        let Some((headline, rest)) = text.split_once('\n') else {
            return self;
        };
        let details = rest
            .trim_end()
            .lines()
            .map(|l| l.trim_end_matches('\r'))
            .map(|l| l.strip_prefix("  ").unwrap_or(l).to_string())
            .collect();
        EngineError::InLines {
            headline: headline.trim_end().to_string(),
            details,
            failure: crate::error::ErrorKind::failure(&self),
        }
    }
}

impl crate::error::ErrorKind for EngineError {
    fn failure(&self) -> Failure {
        match self {
            // It would not take what we gave it, or the image is gone: the image's fault.
            EngineError::Rejected { .. } | EngineError::ImageMissing { .. } => {
                Failure::ImageRefused
            }
            EngineError::InLines { failure, .. } => *failure,
            _ => Failure::Infra,
        }
    }

    fn details(&self) -> &[String] {
        match self {
            EngineError::InLines { details, .. } => details,
            _ => &[],
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
    /// Containers' root is mapped to an unprivileged host uid (`userns-remap`): uid 0
    /// in a container is nobody on the host's files.
    pub userns: bool,
}

/// What cibox needs to know about a local image.
#[derive(Debug, Clone)]
pub struct ImageDetails {
    pub id: String,
    pub labels: HashMap<String, String>,
    pub repo_tags: Vec<String>,
    /// Its layers' digests (`sha256:…` of each uncompressed layer), bottom first.
    pub layers: Vec<String>,
    /// Its platform: `os`, `architecture` and `variant` (empty where not said).
    pub platform: (String, String, String),
    /// How many `ONBUILD` triggers its config holds (each a step a build `FROM` it runs).
    pub onbuild: usize,
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

impl Engine {
    /// Connects to `DOCKER_HOST` (default the local socket) and negotiates the API
    /// version down to what the engine speaks.
    pub fn connect() -> Result<Engine, EngineError> {
        Self::connect_limited(None)
    }

    /// [`Engine::connect`], with every call to the engine, the handshake included,
    /// given up after `limit` (whole seconds, at least one) instead of the client's
    /// two-minute default: for who must not wait on a hung engine (the watchdog).
    pub fn connect_within(limit: Duration) -> Result<Engine, EngineError> {
        Self::connect_limited(Some(limit.max(Duration::from_secs(1))))
    }

    fn connect_limited(limit: Option<Duration>) -> Result<Engine, EngineError> {
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
            let docker = Docker::connect_with_host(&host).map_err(|e| unreachable(reason(&e)))?;
            match limit {
                Some(limit) => docker.with_timeout(limit),
                None => docker,
            }
        };
        let handshake = limit.map_or(CONNECT_TIMEOUT, |l| l.min(CONNECT_TIMEOUT));
        let docker = rt.block_on(async {
            match tokio::time::timeout(handshake, docker.negotiate_version()).await {
                Ok(Ok(d)) => Ok(d),
                Ok(Err(e)) => Err(unreachable(reason(&e))),
                Err(_) => Err(unreachable(format!(
                    "no answer within {}s",
                    handshake.as_secs()
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

    /// The engine's version (empty when it cannot say), from its `/version`: `/info`
    /// says it too, but gathers the whole engine's state first (tens of milliseconds of
    /// a trivial batch's run, more on a busy host).
    pub fn server_version(&self) -> String {
        self.rt
            .block_on(self.docker.version())
            .ok()
            .and_then(|v| v.version)
            .unwrap_or_default()
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
            userns: info
                .security_options
                .unwrap_or_default()
                .iter()
                .any(|o| o.split(',').any(|kv| kv == "name=userns")),
        })
    }
}

/// A request body read from `archive` on a thread of its own, in 256 KiB chunks, as the
/// engine takes it. The thread is not joined: if the engine refuses the body midway,
/// the reader may sit in a read of a stalled producer; it ends at its next send (the
/// body is gone) or at the producer's end.
fn streamed(
    archive: Box<dyn std::io::Read + Send>,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    std::thread::spawn(move || {
        let mut archive = archive;
        loop {
            let mut buf = vec![0u8; 256 * 1024];
            let item = match archive.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    Ok(bytes::Bytes::from(buf))
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            let failed = item.is_err();
            // The engine stopped reading (it refused the body): stop too.
            if tx.blocking_send(item).is_err() || failed {
                return;
            }
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn an_error_of_many_lines_is_a_headline_and_the_lines_under_it() {
        let e = EngineError::Rejected {
            action: "building the image (BuildKit)".into(),
            reason: "exit code: 1\n  in step [2/2] RUN x; its last lines:\n    one\n      two\r\n"
                .into(),
        }
        .in_lines();
        assert_eq!(e.to_string(), "building the image (BuildKit): exit code: 1");
        assert_eq!(
            e.details(),
            ["in step [2/2] RUN x; its last lines:", "  one", "    two"]
        );
        assert_eq!(e.failure(), Failure::ImageRefused);
        let printed = crate::console::error_lines(&e, e.details());
        assert!(!printed.contains("\\n"), "{printed}");
        assert_eq!(printed.lines().count(), 4, "{printed}");
        // One line stays as it was; an infrastructure failure stays one.
        let one = EngineError::Api {
            action: "x".into(),
            reason: "y".into(),
        }
        .in_lines();
        assert!(matches!(one, EngineError::Api { .. }));
        let api = EngineError::Api {
            action: "x".into(),
            reason: "y\nz".into(),
        }
        .in_lines();
        assert_eq!(
            (api.failure(), api.details()),
            (Failure::Infra, &["z".to_string()][..])
        );
    }
}
