//! Access to the container engine (Docker API over its socket, through bollard). The rest
//! of cibox talks to the engine only through this module.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::{BuildImageOptionsBuilder, ImportImageOptionsBuilder};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;

use crate::image_id::ImageId;

/// A single-threaded runtime for engine I/O: cibox's concurrency is I/O (engine
/// streams, child processes), and one thread per runtime keeps signal handling and
/// ordering simple. Parallel batches each get their own thread and runtime.
pub fn runtime() -> Result<tokio::runtime::Runtime, crate::error::Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| crate::error::Error::Infra(format!("cannot start the async runtime: {e}")))
}

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
}

/// What cibox needs to know about a local image.
#[derive(Debug, Clone)]
pub struct ImageDetails {
    pub id: String,
    pub labels: HashMap<String, String>,
    pub repo_tags: Vec<String>,
    pub size: i64,
}

pub struct Engine {
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
    pub async fn connect() -> Result<Engine, EngineError> {
        let host = host();
        let unreachable = |reason: String| EngineError::Unreachable {
            host: host.clone(),
            reason,
        };
        let docker = Docker::connect_with_host(&host).map_err(|e| unreachable(reason(&e)))?;
        let docker = match tokio::time::timeout(CONNECT_TIMEOUT, docker.negotiate_version()).await {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => return Err(unreachable(reason(&e))),
            Err(_) => {
                return Err(unreachable(format!(
                    "no answer within {}s",
                    CONNECT_TIMEOUT.as_secs()
                )));
            }
        };
        Ok(Engine { docker, host })
    }

    fn api(action: &str, e: bollard::errors::Error) -> EngineError {
        EngineError::Api {
            action: action.to_string(),
            reason: reason(&e),
        }
    }

    pub async fn info(&self) -> Result<EngineInfo, EngineError> {
        let info = self
            .docker
            .info()
            .await
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
        })
    }

    /// Looks an image up by its full ID. Never pulls; `None` when it is not present.
    pub async fn image(&self, id: &ImageId) -> Result<Option<ImageDetails>, EngineError> {
        self.inspect(id.as_str()).await
    }

    /// Looks an image up by any reference the engine understands (used right after a
    /// load that reported a tag).
    pub async fn inspect(&self, reference: &str) -> Result<Option<ImageDetails>, EngineError> {
        match self.docker.inspect_image(reference).await {
            Ok(img) => Ok(Some(ImageDetails {
                id: img.id.unwrap_or_default(),
                labels: img.config.and_then(|c| c.labels).unwrap_or_default(),
                repo_tags: img.repo_tags.unwrap_or_default(),
                size: img.size.unwrap_or_default(),
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(Self::api("inspecting image", e)),
        }
    }

    /// Streams a docker-archive into the engine (`POST /images/load`) and returns what
    /// it reports loading: image IDs (`sha256:…`) or references (`name:tag`).
    pub async fn load<S, E>(&self, archive: S) -> Result<Vec<String>, EngineError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
    {
        let opts = ImportImageOptionsBuilder::default().quiet(true).build();
        let mut progress = self.docker.import_image_stream(opts, archive, None);
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
    }

    /// Builds a Dockerfile with the classic builder from a tar of its context, with the
    /// given labels, and tags the result so it is not garbage as a dangling image.
    /// Returns the new image's ID.
    pub async fn build(
        &self,
        context_tar: std::fs::File,
        dockerfile: &str,
        labels: &HashMap<String, String>,
        tag: &str,
        mut on_output: impl FnMut(&str),
    ) -> Result<String, EngineError> {
        let opts = BuildImageOptionsBuilder::default()
            .dockerfile(dockerfile)
            .t(tag)
            .labels(labels)
            .rm(true)
            .forcerm(true)
            .build();
        // Streamed from disk: a rootfs context can be hundreds of megabytes.
        let body = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(context_tar));
        let mut stream = self
            .docker
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
        let id = id.ok_or_else(|| EngineError::Rejected {
            action: "building the image".into(),
            reason: format!(
                "the engine reported no image ID; last output: {}",
                last_lines.last().map(String::as_str).unwrap_or("none")
            ),
        })?;
        // The classic builder's "Successfully built" gives a short ID; resolve it.
        match self.inspect(&id).await? {
            Some(img) => Ok(img.id),
            None => Err(EngineError::Rejected {
                action: "building the image".into(),
                reason: format!("built image {id} is not present afterwards"),
            }),
        }
    }

    /// Writes `docker save` of one image to `to`, atomically (a temp file renamed into
    /// place), and returns the number of bytes written.
    pub async fn save(&self, id: &ImageId, to: &Path) -> Result<u64, EngineError> {
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
        let result = async {
            let mut file = tokio::fs::File::create(&tmp).await.map_err(io)?;
            let mut stream = self.docker.export_image(id.as_str());
            let mut written = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| Self::api("saving the image", e))?;
                written += chunk.len() as u64;
                file.write_all(&chunk).await.map_err(io)?;
            }
            file.sync_all().await.map_err(io)?;
            tokio::fs::rename(&tmp, to).await.map_err(io)?;
            Ok(written)
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        result
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

/// How a container's main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerExit {
    pub code: i64,
}

impl Engine {
    /// Creates a container (never pulls: the image must be local, by ID).
    pub async fn create_container(
        &self,
        name: &str,
        body: bollard::models::ContainerCreateBody,
    ) -> Result<String, EngineError> {
        let opts = bollard::query_parameters::CreateContainerOptions {
            name: Some(name.to_string()),
            ..Default::default()
        };
        let r = self
            .docker
            .create_container(Some(opts), body)
            .await
            .map_err(|e| Self::api("creating the container", e))?;
        Ok(r.id)
    }

    /// Starts a container; the engine's reason when it cannot (a GPU request on an
    /// engine without a GPU runtime fails here).
    pub async fn start_container(&self, id: &str) -> Result<(), String> {
        self.docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| reason(&e))
    }

    /// Waits for the container to stop; a non-zero exit is data, not an error.
    pub async fn wait_container(&self, id: &str) -> Result<ContainerExit, EngineError> {
        let mut s = self
            .docker
            .wait_container(id, None::<bollard::query_parameters::WaitContainerOptions>);
        match s.next().await {
            Some(Ok(r)) => Ok(ContainerExit {
                code: r.status_code,
            }),
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => {
                Ok(ContainerExit { code })
            }
            Some(Err(e)) => Err(Self::api("waiting for the container", e)),
            None => Err(EngineError::Api {
                action: "waiting for the container".into(),
                reason: "the engine closed the wait stream".into(),
            }),
        }
    }

    /// The container's output (stdout and stderr interleaved), following until it ends.
    pub fn logs(&self, id: &str) -> impl Stream<Item = Result<Bytes, EngineError>> + use<> {
        let opts = bollard::query_parameters::LogsOptions {
            follow: true,
            stdout: true,
            stderr: true,
            ..Default::default()
        };
        self.docker.logs(id, Some(opts)).map(|item| {
            item.map(|o| o.into_bytes())
                .map_err(|e| Self::api("reading logs", e))
        })
    }

    /// SIGTERM, then SIGKILL after `grace` seconds (the engine kills every process of
    /// the container, not only its first).
    pub async fn stop_container(&self, id: &str, grace: i32) -> Result<(), EngineError> {
        let opts = bollard::query_parameters::StopContainerOptions {
            t: Some(grace),
            signal: None,
        };
        match self.docker.stop_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304 | 404,
                ..
            }) => Ok(()),
            Err(e) => Err(Self::api("stopping the container", e)),
        }
    }

    /// SIGKILL to every process of the container.
    pub async fn kill_container(&self, id: &str) -> Result<(), EngineError> {
        let opts = bollard::query_parameters::KillContainerOptions {
            signal: "KILL".into(),
        };
        match self.docker.kill_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            // Not running (409) or gone (404): nothing to kill.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404 | 409,
                ..
            }) => Ok(()),
            Err(e) => Err(Self::api("killing the container", e)),
        }
    }

    /// Removes a container (killing it if it runs) with its anonymous volumes.
    pub async fn remove_container(&self, id: &str) -> Result<(), EngineError> {
        let opts = bollard::query_parameters::RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        match self.docker.remove_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            // Removal already in progress (a concurrent cleanup): it will be gone.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                message,
            }) if message.contains("already in progress") => Ok(()),
            Err(e) => Err(Self::api("removing the container", e)),
        }
    }

    /// Containers (running or not) carrying all of `labels` (`key=value`).
    pub async fn containers_with_labels(
        &self,
        labels: &[String],
    ) -> Result<Vec<ContainerInfo>, EngineError> {
        let opts = bollard::query_parameters::ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_string(), labels.to_vec())])),
            ..Default::default()
        };
        let list = self
            .docker
            .list_containers(Some(opts))
            .await
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
