//! The engine's containers: created, started, followed to their end with a deadline,
//! their reports streamed out, removed, and asked why they ended.

use std::collections::HashMap;
use std::io::Read;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;

use super::{Engine, EngineError, is_not_found, reason};

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
    /// Time passed (every poll, 100 ms), whether or not the batch printed anything:
    /// what shows that a quiet batch still runs.
    Tick,
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

/// What [`Engine::follow_exec`] runs: `cmd` as `user`, stopped `timeout` after it goes
/// on (SIGTERM, then SIGKILL after `grace`).
pub struct Steps<'a> {
    pub cmd: Vec<String>,
    pub user: &'a str,
    pub timeout: Duration,
    pub grace: Duration,
}

/// A started exec: its ID, its output, and its standard input.
type StartedExec = (
    String,
    ExecOutput,
    std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
);

/// What an attached exec prints.
type ExecOutput = std::pin::Pin<
    Box<
        dyn futures_util::Stream<
                Item = Result<bollard::container::LogOutput, bollard::errors::Error>,
            > + Send,
    >,
>;

/// How often [`Engine::follow_exec`] asks whether it was interrupted.
const INTERRUPT_POLL: Duration = Duration::from_millis(100);
/// How long a command whose output has closed gets to report its exit.
const EXIT_WAIT: Duration = Duration::from_secs(30);
/// How long a batch's output may stay open after its processes were sent SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long the output of a command that has ended may stay open (held by a worker it
/// left in the background) before it is no longer followed.
const OUTPUT_DRAIN: Duration = Duration::from_secs(1);

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

/// A volume cibox created, as listed by the engine.
#[derive(Debug, Clone)]
pub struct VolumeInfo {
    pub name: String,
    pub labels: HashMap<String, String>,
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

    /// Runs a batch's steps in a running container and follows them to their end. The
    /// steps' process is started first, and `prepare` runs while it starts (outside the
    /// runtime, so it may call the engine): only when it returns a word, and
    /// `interrupted` does not say otherwise then, does the process's standard input get
    /// that word on a line, then its end; otherwise nothing more is done. A script whose first command reads
    /// that line runs nothing before `prepare` is done. From then on: their output goes
    /// to `on`, their `timeout` is enforced (SIGTERM to every process of `user` in the
    /// container, then SIGKILL after `grace`), and `interrupted` is asked every 100 ms
    /// (true: SIGKILL to all of them at once). Returns once the command has ended and
    /// its exit code is known (`None` when the engine cannot say, as when the container
    /// itself died). The container lives on, so that what the batch left in its mounts
    /// can still be copied out.
    ///
    /// From the word on, `interrupted` and `on` run inside the engine's runtime: they
    /// must be quick and must not call the engine (that would nest `block_on`).
    pub fn follow_exec(
        &self,
        id: &str,
        run: Steps<'_>,
        mut prepare: impl FnMut() -> Option<&'static str>,
        mut interrupted: impl FnMut() -> bool,
        on: impl FnMut(Followed<'_>),
    ) -> Result<FollowEnd, EngineError> {
        let (exec, output, mut input) = self.rt.block_on(self.start_exec(id, &run))?;
        let Some(word) = prepare() else {
            return Err(EngineError::Api {
                action: "starting the batch in its container".into(),
                reason: "what it needs first could not be made ready".into(),
            });
        };
        // Interrupted meanwhile: the steps never go on (their input just ends).
        if interrupted() {
            return Ok(FollowEnd {
                stopped: Some(Stop::Interrupted),
                exit: None,
            });
        }
        self.rt.block_on(async {
            use tokio::io::AsyncWriteExt;
            // A process that ended already (an image without a shell) reads nothing:
            // what it printed and its exit code say why.
            let _ = async {
                input.write_all(format!("{word}\n").as_bytes()).await?;
                input.shutdown().await
            }
            .await;
            self.follow_output(id, &exec, &run, output, interrupted, on)
                .await
        })
    }

    /// Creates and starts the steps' exec, its output and standard input attached.
    async fn start_exec(&self, id: &str, run: &Steps<'_>) -> Result<StartedExec, EngineError> {
        let failed = |e| Self::api("starting the batch in its container", e);
        let exec = self
            .docker
            .create_exec(
                id,
                bollard::exec::CreateExecOptions {
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(run.cmd.clone()),
                    user: Some(run.user.to_string()),
                    working_dir: Some("/".to_string()),
                    ..Default::default()
                },
            )
            .await
            .map_err(failed)?
            .id;
        let started = self.docker.start_exec(&exec, None).await.map_err(failed)?;
        let bollard::exec::StartExecResults::Attached { output, input } = started else {
            return Err(EngineError::Api {
                action: "starting the batch in its container".into(),
                reason: "the engine did not attach its output".into(),
            });
        };
        Ok((exec, output, input))
    }

    /// Follows the output of an exec whose steps have just gone on to its end, with
    /// their timeout and `interrupted` (see [`Engine::follow_exec`]), and waits for its
    /// exit code.
    async fn follow_output(
        &self,
        id: &str,
        exec: &str,
        run: &Steps<'_>,
        mut output: ExecOutput,
        mut interrupted: impl FnMut() -> bool,
        mut on: impl FnMut(Followed<'_>),
    ) -> Result<FollowEnd, EngineError> {
        let (user, grace) = (run.user, run.grace);
        let deadline = tokio::time::Instant::now() + run.timeout;
        // First after one period: the steps have just gone on, so asking at once whether
        // they ended would only cost a round trip before their first output.
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + INTERRUPT_POLL, INTERRUPT_POLL);
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
                    on(Followed::Tick);
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
                        None => if self.exec_exit(exec).await.is_some() {
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
            match self.exec_exit(exec).await {
                Some(code) => break Some(code),
                None if tokio::time::Instant::now() >= until || !self.running(id).await => {
                    break None;
                }
                None => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        Ok(FollowEnd { stopped, exit })
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

    /// The mount at `target` in a container, as the engine describes it.
    fn mount_at(&self, id: &str, target: &str) -> Option<bollard::models::MountPoint> {
        let details = self
            .rt
            .block_on(self.docker.inspect_container(id, None))
            .ok()?;
        details
            .mounts?
            .into_iter()
            .find(|m| m.destination.as_deref() == Some(target))
    }

    /// Where on the engine's host the mount at `target` of a container comes from (a
    /// volume's folder), if it has one.
    pub fn mount_source(&self, id: &str, target: &str) -> Option<String> {
        self.mount_at(id, target)?.source.filter(|s| !s.is_empty())
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
                Err(e) => return Err(Self::api(&format!("removing volume {name}"), e)),
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

    /// Extracts a tar archive into `path` of a running container (the engine's archive
    /// API; the folder must be a volume, which it sees, not a tmpfs mount), its entries
    /// owned as their headers say. The archive is read on a thread of
    /// its own, in 256 KiB chunks, as the engine takes it.
    pub fn upload(
        &self,
        id: &str,
        path: &str,
        archive: Box<dyn Read + Send>,
    ) -> Result<(), EngineError> {
        let body = super::streamed(archive);
        // Owners as the archive's headers say (without `copyUIDGID`, which would make
        // everything the container's configured user's, root for the keeper).
        let opts = bollard::query_parameters::UploadToContainerOptions {
            path: path.to_string(),
            ..Default::default()
        };
        self.rt
            .block_on(self.docker.upload_to_container(
                id,
                Some(opts),
                bollard::body_try_stream(body),
            ))
            .map_err(|e| Self::api("copying the source in", e))
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
    /// Creates a named volume of the engine's `local` driver with `labels`.
    pub fn create_volume(
        &self,
        name: &str,
        labels: HashMap<String, String>,
    ) -> Result<String, EngineError> {
        let body = bollard::models::VolumeCreateRequest {
            name: Some(name.to_string()),
            driver: Some("local".into()),
            labels: Some(labels),
            ..Default::default()
        };
        self.rt
            .block_on(self.docker.create_volume(body))
            .map(|v| v.mountpoint)
            .map_err(|e| Self::api("creating the source's volume", e))
    }

    /// Volumes carrying all of `labels` (`key=value`).
    pub fn volumes_with_labels(&self, labels: &[String]) -> Result<Vec<VolumeInfo>, EngineError> {
        let opts = bollard::query_parameters::ListVolumesOptions {
            filters: Some(HashMap::from([("label".to_string(), labels.to_vec())])),
        };
        let list = self
            .rt
            .block_on(self.docker.list_volumes(Some(opts)))
            .map_err(|e| Self::api("listing volumes", e))?;
        Ok(list
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| VolumeInfo {
                name: v.name,
                labels: v.labels,
            })
            .collect())
    }

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
