//! The life of one batch's container: create it (with its watchdog), start it, follow
//! its steps to their end (or its deadline, or a signal), copy `/reports` out while it
//! still lives, and remove it by the ID we created, whatever happened.

use std::os::unix::io::RawFd;
use std::time::Instant;

use crate::engine::{EndCause, EngineError, FollowEnd, Followed, Removal, Steps, Stop};
use crate::gpu::pool::PoolGpu;
use crate::labels::LABEL_VOLUME_OF;
use crate::nofollow::Folder;
use crate::plan::BatchPlan;
use crate::plan::container::snapshot::{FROM_SNAPSHOT, IN_WORK, mount_overlay, mount_snapshot};
use crate::report::event::{EventKind, Phase};
use crate::report::outcome::{ContainerEnd, Status};
use crate::run::copy;
use crate::run::error::RunError;
use crate::run::execute::batch::Watched;
use crate::run::execute::snapshot::Work;
use crate::run::execute::{Execution, Result};
use crate::signals;

/// How the source is in a batch's `/work`, once its container is started.
enum Source {
    /// An overlay over the run's snapshot, which lies there.
    Overlay(String),
    /// Written by cibox into its upper layer, in this time.
    Filled(std::time::Duration),
    /// The run's snapshot, which the batch copies in itself.
    Snapshot,
    /// Its own copy, uploaded through the archive API.
    Upload,
}

/// Why a container did not start.
enum Unstarted {
    /// The engine would not mount the overlay at `/work` (its reason): the batch goes
    /// again with a copy.
    Overlay(String),
    /// For good: the batch ended so.
    Ended(Result<ContainerEnd>),
}

/// Grace between SIGTERM and SIGKILL when a batch times out.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

impl Execution<'_> {
    /// Creates, starts, follows and removes the batch's container. Never leaves it
    /// behind.
    pub(super) fn container(
        &self,
        b: &BatchPlan,
        gpus: &[PoolGpu],
        lease_fds: &[RawFd],
        watched: &Watched,
        attempt: u32,
    ) -> Result<ContainerEnd> {
        // Kept with what is watched, so that the batch's end finishes them whatever
        // happens here.
        *watched.caches.borrow_mut() = self.prepare_caches(b)?;
        // What the leased units' vendor hands the container (device request, device
        // files, variables); one that cannot be told is handed to nobody.
        let handover = crate::gpu::vendor::handover(gpus, b.container.gpu_driver())?;
        loop {
            let work = self
                .snapshots
                .work(b.user, b.container.disk(), self.source, &mut |d| {
                    self.said(d)
                });
            // An engine that would not mount the overlay: the run's overlays are
            // refused, and the batch goes again with a copy.
            if let Some(end) =
                self.one_container(b, &handover, lease_fds, watched, attempt, work)?
            {
                return Ok(end);
            }
        }
    }

    /// Says `detail` of the run's source (a `copy` phase of no batch).
    pub(super) fn said(&self, detail: String) {
        // A reporter that fails here fails again, and counts, at the batch's end.
        let _ = self.emit(EventKind::Phase {
            batch: None,
            phase: Phase::Copy,
            at: self.clock.elapsed(),
            detail,
        });
    }

    /// One container of the batch, its source in `/work` by `work`; `None` when the
    /// engine would not mount the overlay `work` asked for (the container is gone).
    fn one_container(
        &self,
        b: &BatchPlan,
        handover: &crate::gpu::vendor::Handover,
        lease_fds: &[RawFd],
        watched: &Watched,
        attempt: u32,
        work: Work<'_>,
    ) -> Result<Option<ContainerEnd>> {
        let mut body =
            b.container
                .body(handover, self.git_masks, self.engine.recursive_read_only());
        // Which attempt this is (1 unless the batch runs again): the batch may say so.
        let env = body.env.get_or_insert_with(Vec::new);
        env.retain(|e| !e.starts_with("CIBOX_ATTEMPT="));
        env.push(format!("CIBOX_ATTEMPT={attempt}"));
        match &work {
            Work::Overlay { lower, layer, .. } => mount_overlay(
                &mut body,
                lower,
                &layer.upper().to_string_lossy(),
                &layer.work().to_string_lossy(),
            ),
            Work::Filled { layer, .. } => mount_overlay(
                &mut body,
                &layer.lower().to_string_lossy(),
                &layer.upper().to_string_lossy(),
                &layer.work().to_string_lossy(),
            ),
            Work::Copy { volume } => mount_snapshot(&mut body, volume),
            Work::Upload => {}
        }
        self.mount_artifacts(b, &mut body);
        let mut fds = lease_fds.to_vec();
        if let Some(caches) = watched.caches.borrow().as_ref()
            && let Some(hc) = body.host_config.as_mut()
        {
            hc.mounts
                .get_or_insert_with(Vec::new)
                .extend(caches.mounts());
            fds.extend(caches.fds());
        }
        let id = self
            .engine
            .create_container(&b.container.name, body)
            .map_err(
                |e| match b.container.refused_ulimit(&b.name, &e.to_string()) {
                    Some(refused) => crate::error::Error::from(refused),
                    None => e.into(),
                },
            )?;
        self.phase(
            b,
            Phase::Create,
            watched.started,
            format!(
                "container {} ({})",
                b.container.name,
                &id[..id.len().min(12)]
            ),
        )?;
        // From here on, if cibox dies the watchdog removes the container (and holds the
        // lease and the caches' generations until it has).
        let watchdog = match (self.start_watchdog)(&id, &fds) {
            Ok(w) => w,
            Err(e) => {
                let _ = self.engine.remove_container(&id);
                return Err(RunError::Watchdog(e).into());
            }
        };
        let mut again = false;
        let followed = match self.start(b, &id, work) {
            Ok(how) => self.follow(b, &id, watched, how),
            Err(Unstarted::Overlay(why)) => {
                self.snapshots.refuse_overlays(
                    format!("the engine would not mount one ({why})"),
                    &mut |d| self.said(d),
                );
                again = true;
                Ok(not_started(b, &why))
            }
            Err(Unstarted::Ended(end)) => end,
        };
        // The container still lives (its keeper waits): copy `/reports` out now, unless
        // the batch ended well saying it left it empty. Saying so falsely loses the batch
        // its own reports, nothing else: no reports is what it said it has.
        let said_empty = matches!(followed, Ok(ContainerEnd::Exited(0)))
            && watched.phases.borrow().said_reports_empty();
        if followed.is_ok() && !said_empty && !again {
            *watched.reports.borrow_mut() =
                self.copy_reports(b, &watched.dir, &id, watched.container_died.get());
        }
        // Its outputs, while it lives, when it ended well: refused, the batch fails.
        let followed = match followed {
            Ok(end) if !again => Ok(self.outputs_taken(b, &id, end)),
            other => other,
        };
        // Remove by the ID we created, whatever happened (cancel, timeout, engine error).
        let removed = self.engine.remove(&id);
        if removed.is_ok() {
            watchdog.dismiss();
        } else {
            watched.container_left.set(true);
        }
        if matches!(removed, Ok(Removal::ByOthers)) {
            self.remove_batch_volumes(b);
        }
        let ended = followed?;
        if removed? == Removal::ByOthers {
            // Someone removed it while it ran (a cleanup, a person): whatever its exit
            // code says, the batch did not fail by itself.
            return Ok(Some(ContainerEnd::Stopped {
                status: Status::InfraError,
                message: "the container was removed by someone else while the batch ran".into(),
                exit: ended.container_exit(),
            }));
        }
        Ok((!again).then_some(ended))
    }

    /// The batch's own volumes (`/work`, `/reports`): anonymous, they go with its
    /// container, but one removed by someone else without its volumes leaves them.
    /// Found by the label they carry (no engine call per batch to learn their names).
    fn remove_batch_volumes(&self, b: &BatchPlan) {
        let labels = [format!("{LABEL_VOLUME_OF}={}", b.container.name)];
        for v in self.engine.volumes_with_labels(&labels).unwrap_or_default() {
            let _ = self.engine.remove_volume(&v.name);
        }
    }

    /// What is safe of the container's `/reports`, copied into the batch's folder; `died`:
    /// the engine said the container was killed.
    fn copy_reports(
        &self,
        b: &BatchPlan,
        dir: &Folder,
        id: &str,
        died: bool,
    ) -> crate::report::record::Copied {
        let caps = copy::Caps::with_bytes(b.container.reports_size());
        let mut copied = crate::report::record::Copied::default();
        if self.engine.is_running(id) {
            let stop = copy::StopWhen::now();
            let archive = self
                .engine
                .download(id, "/reports", Box::new(move || stop.reason()));
            copied = copy::extract(archive, dir, &caps, stop);
        }
        // Checked after the copy too: one that raced the container's end read nothing
        // (a copy that found nothing in a live container is no loss). A container the
        // engine says was killed may still read as running for a moment.
        let nothing = copied.files == 0 && copied.skipped_count == 0;
        // A stopped container's volumes are mounted again for the copy; its `/work`
        // overlay cannot be (its upper layer went with it), so the copy breaks off
        // where an empty one came back before: the same loss, said the same.
        if nothing && (died || !self.engine.is_running(id)) {
            copied.stopped = Some("the container had stopped before /reports was copied: what the batch wrote there went with it".to_string());
        }
        copied
    }

    /// Starts the container; then the overlay, if `work` is one, holds the batch's
    /// upper layer, and the host lets its tmpfs go. How the source is in `/work`, and
    /// the Unix second (less one) it started at.
    fn start(&self, b: &BatchPlan, id: &str, work: Work<'_>) -> Result<(Source, u64), Unstarted> {
        // Whole seconds, as the engine's event filter takes them: one early, so the
        // start's own second is in.
        let started_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .saturating_sub(1);
        let started = self.engine.start_container(id);
        let source = match work {
            Work::Overlay { volume, layer, .. } => {
                layer.release();
                Source::Overlay(volume.map_or_else(
                    || "a tmpfs of this host".to_string(),
                    |v| format!("volume {v}"),
                ))
            }
            Work::Filled { layer, took } => {
                layer.release();
                Source::Filled(took)
            }
            Work::Copy { .. } => Source::Snapshot,
            Work::Upload => Source::Upload,
        };
        if let Err(why) = started {
            // A ulimit it cannot set is the manifest's mistake: the run stops (exit 2),
            // and the container goes like any other.
            if let Some(refused) = b.container.refused_ulimit(&b.name, &why) {
                return Err(Unstarted::Ended(Err(refused.into())));
            }
            if matches!(source, Source::Overlay(_) | Source::Filled(_))
                && why.contains("mounting volume")
            {
                return Err(Unstarted::Overlay(why));
            }
            return Err(Unstarted::Ended(Ok(not_started(b, &why))));
        }
        Ok((source, started_at))
    }

    /// Says how the source is in `/work` where cibox has nothing more to do for it
    /// (an overlay, or the run's snapshot that the batch copies in itself), with the
    /// word the batch's script is told; `None` for a source still to be uploaded.
    fn source_in_place(
        &self,
        b: &BatchPlan,
        watched: &Watched,
        how: &Source,
    ) -> Option<&'static str> {
        let n = self.source.count();
        let disk = b.container.disk();
        let (detail, word) = match how {
            Source::Overlay(over) => (
                format!(
                    "{n} files and folders of the source in /work as an overlay over the run's snapshot ({over}); what the batch writes goes to a tmpfs of {disk} bytes"
                ),
                IN_WORK,
            ),
            Source::Filled(took) => (
                format!(
                    "{n} files and folders of the source written by cibox into /work (an overlay whose upper layer is a tmpfs of {disk} bytes) in {}",
                    crate::units::human(*took)
                ),
                IN_WORK,
            ),
            // The batch copies the run's snapshot in itself, first thing.
            Source::Snapshot => (
                format!(
                    "{n} files and folders of the source from the run's snapshot, copied into /work by the batch"
                ),
                FROM_SNAPSHOT,
            ),
            Source::Upload => return None,
        };
        // A reporter that fails here fails again, and counts, at the end.
        let _ = self.phase(b, Phase::Copy, watched.started, detail);
        Some(word)
    }

    /// Follows the batch's steps in its started container to their end.
    fn follow(
        &self,
        b: &BatchPlan,
        id: &str,
        watched: &Watched,
        (how, started_at): (Source, u64),
    ) -> Result<ContainerEnd> {
        self.emit(EventKind::ContainerStarted {
            batch: b,
            container: &b.container.name,
        })?;
        let mut copy_failed = None;
        let mut signal = None;
        let mut report_failed = None;
        let followed = self.engine.follow_exec(
            id,
            Steps {
                cmd: b.container.steps(),
                user: b.container.user(),
                timeout: b.timeout.0,
                grace: STOP_GRACE,
            },
            // While the steps' process starts: its script runs nothing before the
            // source is in.
            &mut || {
                if let Some(word) = self.source_in_place(b, watched, &how) {
                    return Some(word);
                }
                let copying = Instant::now();
                let archive = self.source.archive(b.user.0, b.user.1);
                let copied = self.engine.upload(id, "/work", archive);
                copy_failed = copied.err();
                if copy_failed.is_none() {
                    // A reporter that fails here fails again, and counts, at the end.
                    let _ = self.phase(
                        b,
                        Phase::Copy,
                        watched.started,
                        format!(
                            "{} files and folders of the source into /work in {}",
                            self.source.count(),
                            crate::units::human(copying.elapsed())
                        ),
                    );
                }
                copy_failed.is_none().then_some(IN_WORK)
            },
            &mut || {
                signal = signal.or_else(signals::received);
                signal.is_some()
            },
            &mut |seen| {
                if let Err(e) = self.seen(b, watched, seen) {
                    report_failed.get_or_insert(e);
                }
            },
        );
        if let Some(e) = copy_failed {
            return Ok(ContainerEnd::Stopped {
                status: Status::InfraError,
                message: format!(
                    "could not copy the source ({} files and folders) into the container's /work: {e}",
                    self.source.count()
                ),
                exit: None,
            });
        }
        self.emit(EventKind::OutputEnded { batch: b })?;
        if let Some(e) = report_failed {
            return Err(e);
        }
        let FollowEnd { stopped, exit } = match followed {
            Ok(end) => end,
            // The batch could not be started or followed: if the container was killed
            // from outside meanwhile, that is what to say.
            Err(e) => {
                return match self.engine.end_cause(id, started_at) {
                    cause @ Ok(EndCause::KilledThroughEngine(_) | EndCause::OutOfMemory) => {
                        watched.container_died.set(true);
                        Ok(why_it_ended(b, cause, None))
                    }
                    _ => Err(e.into()),
                };
            }
        };
        Ok(match (stopped, exit) {
            (Some(Stop::Interrupted), _) => {
                let signal = signal.unwrap_or(nix::sys::signal::Signal::SIGTERM);
                ContainerEnd::Cancelled {
                    signal,
                    message: format!("cancelled by {signal}"),
                    exit,
                }
            }
            (Some(Stop::Deadline), _) => ContainerEnd::Stopped {
                status: Status::Timeout,
                message: format!("the batch hit its timeout of {}", b.timeout),
                exit,
            },
            (None, Some(0)) => ContainerEnd::Exited(0),
            (None, code) => {
                let cause = self.engine.end_cause(id, started_at);
                if matches!(
                    cause,
                    Ok(EndCause::KilledThroughEngine(_) | EndCause::OutOfMemory)
                ) {
                    watched.container_died.set(true);
                }
                why_it_ended(b, cause, code)
            }
        })
    }

    /// Reports what following the batch saw; its output is counted and fed to the
    /// step and phase trackers first, and the steps it announced follow it.
    fn seen(&self, b: &BatchPlan, watched: &Watched, seen: Followed<'_>) -> Result<()> {
        match seen {
            Followed::Output(bytes) => {
                let printed = &watched.printed;
                printed.set(printed.get() + bytes.len() as u64);
                if let Some(t) = watched.steps.borrow_mut().as_mut() {
                    t.feed(bytes);
                }
                let announced = watched.phases.borrow_mut().feed(bytes);
                // Each step's phase line right after its announcement: the output is
                // cut there (only there, so a loud batch is not cut per line). No more
                // than the script's own steps: what the batch prints alike is output.
                let mut from = 0;
                for (end, step, cmd) in announced {
                    let said = watched.phases_said.get();
                    if said >= b.container.steps_announced() {
                        break;
                    }
                    watched.phases_said.set(said + 1);
                    let cmd = short(&cmd);
                    self.emit(EventKind::Output {
                        batch: b,
                        bytes: &bytes[from..end],
                    })?;
                    from = end;
                    self.phase(b, step, watched.started, cmd)?;
                }
                if from < bytes.len() {
                    self.emit(EventKind::Output {
                        batch: b,
                        bytes: &bytes[from..],
                    })?;
                }
                Ok(())
            }
            Followed::DeadlinePassed => self.emit(EventKind::TimedOut { batch: b }),
            Followed::StreamBroke(error) => self.emit(EventKind::OutputBroke { batch: b, error }),
            Followed::Tick => self.emit(EventKind::Tick { batch: b }),
        }
    }
}

/// A step's command as its phase line shows it: its first 200 characters.
fn short(cmd: &str) -> String {
    match cmd.char_indices().nth(200) {
        Some((at, _)) => format!("{}…", &cmd[..at]),
        None => cmd.to_string(),
    }
}

/// The engine would not start the container: said with its reason, and what to install
/// when the reason is a missing GPU runtime.
fn not_started(b: &BatchPlan, why: &str) -> ContainerEnd {
    let gpu_hint = if b.gpus > 0
        && (why.contains("device driver") || why.contains("nvidia") || why.contains("cdi"))
    {
        "; the engine has no GPU runtime for this device request: install the NVIDIA Container Toolkit (see `cibox doctor`)"
    } else {
        ""
    };
    ContainerEnd::Stopped {
        status: Status::InfraError,
        message: format!("the engine could not start the container: {why}{gpu_hint}"),
        exit: None,
    }
}

/// A batch that ended by itself with a failing or unknown code: as the code says,
/// unless the engine (`cause`) says someone killed it from outside, or says the batch went
/// over its memory limit (which is the batch's failure, told plainly). When the
/// engine cannot be asked, the exit code stands.
fn why_it_ended(
    b: &BatchPlan,
    cause: Result<EndCause, EngineError>,
    code: Option<i64>,
) -> ContainerEnd {
    let shown = code.map_or("unknown".to_string(), |c| c.to_string());
    match cause {
        Ok(EndCause::OutOfMemory) => ContainerEnd::Stopped {
            status: Status::Failed,
            message: format!(
                "the batch went over its memory limit ({}) and the kernel killed it (exit {shown}); raise container.memory or make the tests use less",
                b.container.memory_text()
            ),
            exit: code,
        },
        Ok(EndCause::KilledThroughEngine(signal)) => ContainerEnd::Stopped {
            status: Status::InfraError,
            message: format!(
                "the container was killed from outside through the engine (signal {}: `docker kill`, `docker stop`, a cleanup script) while the batch ran",
                if signal.is_empty() {
                    "unknown"
                } else {
                    &signal
                }
            ),
            exit: code,
        },
        Ok(EndCause::Itself) | Err(_) => code.map_or(ContainerEnd::Unknown, ContainerEnd::Exited),
    }
}
