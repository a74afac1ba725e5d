//! GPUs held by running cibox containers.
//!
//! A batch's lease names its container, and dies with its cibox. If cibox is
//! SIGKILLed the container may run on, between steps (a `pip install`) showing no
//! process on its GPUs. So everything that hands out or judges GPUs (`batch run`,
//! `gpu exec`, `gpu status`, `capacity`) adds what the engine says to the GPU probe's
//! view: a GPU named in the `org.cibox.gpus` label of a running cibox container is
//! busy. Not being able to list the containers fails closed, like a probe failure.
//! The GPU layer gets these claims as data, in the [`Snapshot`]; it never asks the
//! engine itself.
//!
//! Such an orphan exists only while the record of a dead run does ([`runs`]), so
//! outside `batch run` (which talks to the engine anyway) the engine is asked only
//! then: a hundred waiting `gpu exec`s must not each poll the engine for nothing. And
//! then it must answer: an engine that cannot be reached fails closed, like a probe.

use crate::console;
use crate::engine::{ContainerEngine, ContainerInfo, Engine, EngineError};
use crate::exit::Failure;
use crate::gpu::probe::{HostInstant, ProbeError, Prober, Snapshot};
use crate::labels::{LABEL_GPUS, LABEL_OWNER};
use crate::lockdir::{LockDir, runs};

/// Why the GPUs' state, claims included, is unknown.
#[derive(Debug, thiserror::Error)]
pub enum ClaimsError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// The engine answered but would not list cibox's containers, so which GPUs they
    /// hold is unknown.
    #[error(
        "cannot list cibox containers to see which GPUs they hold: {0}; treating all GPUs as unavailable"
    )]
    Containers(#[source] EngineError),
    /// The engine cannot be reached while a dead run's container may hold GPUs.
    #[error(
        "a cibox run on this host died and its containers may still hold GPUs, but the engine cannot be asked: {0}; treating all GPUs as unavailable (start the engine, or run `cibox cleanup` where it can be reached)"
    )]
    Unreachable(#[source] EngineError),
}

impl crate::error::ErrorKind for ClaimsError {
    fn failure(&self) -> Failure {
        Failure::Infra
    }
}

/// Probes GPUs, adding the claims of cibox containers.
pub struct ContainerClaims<'e> {
    prober: Prober,
    runs: LockDir,
    engine: Asked<'e>,
    /// Whether the warning about another user's record was given (once per command).
    warned: bool,
}

/// Which engine is asked, and when.
enum Asked<'e> {
    /// Connected on first need: only when an orphan can exist (a dead run's record).
    WhenRunsDied(Option<Engine>),
    /// A run's own engine, asked every time: a run talks to the engine anyway, and its
    /// own batches' containers are claims too.
    Always(&'e dyn ContainerEngine),
}

impl ContainerClaims<'static> {
    /// For the runs recorded in `lock_dir`, probing with `prober`; the engine is asked
    /// only while a dead run is on record.
    pub fn new(lock_dir: LockDir, prober: Prober) -> ContainerClaims<'static> {
        ContainerClaims {
            prober,
            runs: lock_dir,
            engine: Asked::WhenRunsDied(None),
            warned: false,
        }
    }
}

impl<'e> ContainerClaims<'e> {
    /// Probing with `prober`, asking `engine` every time.
    pub fn asking(
        lock_dir: LockDir,
        prober: Prober,
        engine: &'e dyn ContainerEngine,
    ) -> ContainerClaims<'e> {
        ContainerClaims {
            prober,
            runs: lock_dir,
            engine: Asked::Always(engine),
            warned: false,
        }
    }

    /// The driver's view with the GPUs of running cibox containers marked busy.
    pub fn probe(&mut self) -> Result<Snapshot, ClaimsError> {
        self.probe_since(None)
    }

    /// The same, from a probe that started at `since` or later (see
    /// [`Prober::probe_since`]).
    pub fn probe_since(&mut self, since: Option<HostInstant>) -> Result<Snapshot, ClaimsError> {
        let mut snap = self.prober.probe_since(since)?;
        let engine = match &mut self.engine {
            Asked::Always(engine) => *engine,
            Asked::WhenRunsDied(connected) => {
                match Self::engine_for_orphans(&self.runs, connected, &mut self.warned)? {
                    Some(engine) => engine,
                    None => return Ok(snap),
                }
            }
        };
        mark(&mut snap, engine)?;
        Ok(snap)
    }

    /// The engine to ask when a dead run's containers may hold GPUs (connected on first
    /// need), or `None` when none can, or when only another user's record says so and
    /// the engine cannot be reached (then the probe alone decides, with a warning).
    fn engine_for_orphans<'c>(
        runs_dir: &LockDir,
        connected: &'c mut Option<Engine>,
        warned: &mut bool,
    ) -> Result<Option<&'c Engine>, ClaimsError> {
        // A record that cannot be read is one whose run died before it made any
        // container (the record is written first). An unreadable runs/ folder counts as
        // a dead run of root's: ask.
        let (vouched, hearsay) = match runs::dead_runs(runs_dir) {
            Ok(dead) => dead
                .iter()
                .filter(|d| d.info.is_some())
                .fold((false, false), |(v, h), d| {
                    (v || d.vouched_for(), h || !d.vouched_for())
                }),
            Err(_) => (true, false),
        };
        if !vouched && !hearsay {
            return Ok(None);
        }
        // Fail closed: an engine that cannot be asked cannot say the GPUs are free. But
        // any local user can write into runs/: another user's record alone makes cibox
        // ask, not stop.
        if connected.is_none() {
            let engine = match Engine::connect() {
                Ok(engine) => engine,
                Err(e) if !vouched => {
                    if !std::mem::replace(warned, true) {
                        console::warn(format!(
                            "the runs/ folder holds another user's record of a dead run, but the engine cannot be asked ({e}); going by the GPU probe alone"
                        ));
                    }
                    return Ok(None);
                }
                Err(e) => return Err(ClaimsError::Unreachable(e)),
            };
            console::debug(
                "a dead run is on record: asking the engine which GPUs its containers hold",
            );
            *connected = Some(engine);
        }
        Ok(connected.as_ref())
    }
}

/// Marks the GPUs of running cibox containers in `snap` as claimed.
pub fn mark(snap: &mut Snapshot, engine: &dyn ContainerEngine) -> Result<(), ClaimsError> {
    let labels = vec![format!("{LABEL_OWNER}=cibox")];
    let running = engine
        .containers_with_labels(&labels)
        .map_err(ClaimsError::Containers)?;
    mark_running(snap, &running);
    Ok(())
}

fn mark_running(snap: &mut Snapshot, containers: &[ContainerInfo]) {
    for c in containers.iter().filter(|c| c.running) {
        for uuid in c
            .labels
            .get(LABEL_GPUS)
            .map(|s| s.split(','))
            .into_iter()
            .flatten()
        {
            if snap.gpus.iter().any(|g| g.uuid == uuid) {
                snap.claimed.push((
                    uuid.to_string(),
                    format!("running cibox container {}", c.name),
                ));
            }
        }
    }
}
