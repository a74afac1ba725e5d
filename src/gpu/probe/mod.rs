//! Asking the driver what the GPUs are doing (docs/interface.md §6), strictly: NVIDIA's
//! through NVML ([`nvml`]) when it can be loaded, else through nvidia-smi ([`smi`]);
//! AMD's through rocm-smi ([`rocm_smi`]); Ascend's through npu-smi ([`npu_smi`]),
//! Intel's through xpu-smi ([`xpu_smi`]), Moore Threads' through mthreads-gmi
//! ([`mthreads_gmi`]). Each backend gives the same reading (units
//! by identity, their memory, use and compute processes), so the idle verdict
//! (`pool::busy_reason`) is one for every vendor.
//!
//! Anything odd (an error, a hang, `N/A` where a number belongs, a malformed or
//! duplicate UUID, a process on an unknown GPU, a GPU that an earlier probe showed and
//! this one does not) is a probe failure: the caller treats every GPU as unavailable.
//! "Could not tell" never means "idle".

mod command;
mod error;
pub mod health;
pub mod mthreads_gmi;
pub mod npu_smi;
mod nvml;
pub mod reading;
pub mod rocm_ras;
pub mod rocm_smi;
mod shared;
pub mod smi;
mod unique_json;
pub mod xpu_health;
pub mod xpu_smi;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

pub use crate::manifest::ProbeChoice;
pub use error::ProbeError;
pub use reading::{GpuHardware, GpuState, HostInstant, Reading, Snapshot};

/// Whether a driver call of this process never returned: the process must then leave
/// with `_exit` (see `main`), since its exit handlers could wait for that call for ever.
pub fn stuck_in_driver() -> bool {
    nvml::stuck()
}

/// How long one probe may take; a wedged driver makes nvidia-smi hang for minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The probe timeout: `CIBOX_PROBE_TIMEOUT` (a duration such as `5s`) or 10 s.
pub fn timeout() -> Duration {
    std::env::var("CIBOX_PROBE_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<crate::units::Span>().ok())
        .map(|s| s.0)
        .filter(|d| !d.is_zero())
        .unwrap_or(DEFAULT_TIMEOUT)
}

/// The backend that answers, decided at the first probe.
enum Backend {
    Smi {
        program: String,
        /// Why NVML was not used, when `auto` fell back.
        fallback: Option<String>,
        /// A GPU in MIG mode was seen: later probes ask `-L` at once with the other
        /// queries rather than after them.
        mig: std::sync::atomic::AtomicBool,
    },
    Nvml(nvml::Session),
    /// AMD's GPUs, through rocm-smi.
    Rocm {
        program: String,
        /// Why NVML was not used, when `auto` chose AMD's.
        fallback: Option<String>,
    },
    /// Another vendor's units through its tool (Ascend's npu-smi, Intel's xpu-smi,
    /// Moore Threads' mthreads-gmi).
    Tool {
        tool: Tool,
        program: String,
        /// Why NVML was not used, when `auto` chose this vendor's.
        fallback: Option<String>,
    },
}

/// A vendor's tool, each a module here with `probe` and `hardware`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    NpuSmi,
    XpuSmi,
    MthreadsGmi,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::NpuSmi => "npu-smi",
            Tool::XpuSmi => "xpu-smi",
            Tool::MthreadsGmi => "mthreads-gmi",
        }
    }

    fn program(self) -> String {
        match self {
            Tool::NpuSmi => npu_smi::program(),
            Tool::XpuSmi => xpu_smi::program(),
            Tool::MthreadsGmi => mthreads_gmi::program(),
        }
    }

    fn named(self) -> bool {
        match self {
            Tool::NpuSmi => npu_smi::program_named().is_some(),
            Tool::XpuSmi => xpu_smi::program_named().is_some(),
            Tool::MthreadsGmi => mthreads_gmi::program_named().is_some(),
        }
    }

    /// Whether this vendor's driver is loaded here (`auto` without NVML).
    fn present(self) -> bool {
        match self {
            Tool::NpuSmi => npu_smi::present(),
            Tool::XpuSmi => xpu_smi::present(),
            Tool::MthreadsGmi => mthreads_gmi::present(),
        }
    }

    fn read(self, program: &str, timeout: Duration) -> Result<Reading, ProbeError> {
        match self {
            Tool::NpuSmi => npu_smi::probe(program, timeout),
            Tool::XpuSmi => xpu_smi::probe(program, timeout),
            Tool::MthreadsGmi => mthreads_gmi::probe(program, timeout),
        }
    }

    fn hardware(self, program: &str, timeout: Duration) -> Result<Vec<GpuHardware>, ProbeError> {
        match self {
            Tool::NpuSmi => npu_smi::hardware(program, timeout),
            Tool::XpuSmi => xpu_smi::hardware(program, timeout),
            Tool::MthreadsGmi => mthreads_gmi::hardware(program, timeout),
        }
    }
}

/// Every other vendor's tool, in the order `auto` tries them.
const TOOLS: [Tool; 3] = [Tool::NpuSmi, Tool::XpuSmi, Tool::MthreadsGmi];

impl Backend {
    fn describe(&self) -> String {
        match self {
            Backend::Smi {
                program, fallback, ..
            } => match fallback {
                Some(why) => format!("nvidia-smi ({program}); NVML not loaded: {why}"),
                None => format!("nvidia-smi ({program})"),
            },
            Backend::Nvml(s) => s.describe(),
            Backend::Rocm { program, fallback } => match fallback {
                Some(why) => format!("rocm-smi ({program}); NVML not loaded: {why}"),
                None => format!("rocm-smi ({program})"),
            },
            Backend::Tool {
                tool,
                program,
                fallback,
            } => match fallback {
                Some(why) => format!("{} ({program}); NVML not loaded: {why}", tool.name()),
                None => format!("{} ({program})", tool.name()),
            },
        }
    }

    /// Which results of other processes may serve ours: the same backend, asked the
    /// same way.
    fn key(&self) -> String {
        match self {
            Backend::Smi { program, .. } => format!("nvidia-smi {program}"),
            Backend::Nvml(s) => format!("nvml {}", s.lib()),
            Backend::Rocm { program, .. } => format!("rocm-smi {program}"),
            Backend::Tool { tool, program, .. } => format!("{} {program}", tool.name()),
        }
    }

    fn hardware(&self, timeout: Duration) -> Result<Vec<GpuHardware>, ProbeError> {
        let gpus = self.hardware_unchecked(timeout)?;
        let whole = |uuid: &str| !crate::manifest::is_mig_uuid(uuid);
        self.named_once(
            gpus.iter()
                .map(|g| (g.index, g.uuid.as_str(), whole(&g.uuid))),
        )?;
        Ok(gpus)
    }

    fn read(&self, timeout: Duration) -> Result<Reading, ProbeError> {
        let reading = self.read_unchecked(timeout)?;
        let units = reading.0.iter();
        self.named_once(units.map(|g| (g.index, g.uuid.as_str(), g.parent.is_none())))?;
        Ok(reading)
    }

    /// Every backend, whatever its own parser checks: no UUID twice, and no index of a
    /// whole GPU twice (a MIG slice has its GPU's). An answer that names one unit twice
    /// could hide a busy reading behind an idle one.
    fn named_once<'a>(
        &self,
        units: impl Iterator<Item = (u32, &'a str, bool)>,
    ) -> Result<(), ProbeError> {
        let mut uuids = std::collections::HashSet::new();
        let mut indices = std::collections::HashSet::new();
        for (index, uuid, whole) in units {
            let twice = if !uuids.insert(uuid) {
                Some(format!("UUID {uuid}"))
            } else if whole && !indices.insert(index) {
                Some(format!("index {index}"))
            } else {
                None
            };
            if let Some(what) = twice {
                return Err(ProbeError::Twice {
                    backend: self.describe(),
                    what,
                });
            }
        }
        Ok(())
    }

    fn hardware_unchecked(&self, timeout: Duration) -> Result<Vec<GpuHardware>, ProbeError> {
        match self {
            Backend::Smi { program, mig, .. } => {
                let gpus = smi::hardware(program, timeout)?;
                if gpus.iter().any(|g| crate::manifest::is_mig_uuid(&g.uuid)) {
                    mig.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(gpus)
            }
            Backend::Nvml(s) => s.hardware(timeout),
            Backend::Rocm { program, .. } => rocm_smi::hardware(program, timeout),
            Backend::Tool { tool, program, .. } => tool.hardware(program, timeout),
        }
    }

    fn read_unchecked(&self, timeout: Duration) -> Result<Reading, ProbeError> {
        match self {
            Backend::Smi {
                program,
                fallback,
                mig,
            } => {
                use std::sync::atomic::Ordering::Relaxed;
                let read = smi::probe(program, timeout, mig.load(Relaxed));
                if let Ok((gpus, _)) = &read
                    && gpus.iter().any(|g| g.parent.is_some())
                {
                    mig.store(true, Relaxed);
                }
                read.map_err(|e| match (e, fallback) {
                    // Neither backend is there: say both.
                    (
                        ProbeError::Spawn {
                            program,
                            reason,
                            knob,
                        },
                        Some(why),
                    ) => ProbeError::Spawn {
                        program,
                        reason: format!("{reason}; and NVML was not loaded: {why}"),
                        knob,
                    },
                    (e, _) => e,
                })
            }
            Backend::Nvml(s) => s.read(timeout),
            Backend::Rocm { program, .. } => rocm_smi::probe(program, timeout),
            Backend::Tool { tool, program, .. } => tool.read(program, timeout),
        }
    }
}

/// Probes the GPUs through the backend `gpu.probe` chooses, for the life of the process:
/// an NVML handle is opened once, so a waiter's probes cost milliseconds. Cheap to
/// clone; clones share the backend.
#[derive(Clone)]
pub struct Prober {
    inner: Arc<Inner>,
}

struct Inner {
    choice: ProbeChoice,
    backend: Mutex<Option<Arc<Backend>>>,
    /// Every GPU an earlier probe showed (index, UUID).
    seen: Mutex<Vec<(u32, String)>>,
    /// The lock dir through which hand-outs share one probe.
    share: Option<PathBuf>,
}

impl Prober {
    pub fn new(choice: ProbeChoice) -> Prober {
        Prober::with_share(choice, None)
    }

    /// A prober whose hand-out probes ([`Prober::probe_since`]) are shared with the other
    /// waiters of `lock_dir`.
    pub fn shared_through(choice: ProbeChoice, lock_dir: &Path) -> Prober {
        Prober::with_share(choice, Some(lock_dir.to_path_buf()))
    }

    fn with_share(choice: ProbeChoice, share: Option<PathBuf>) -> Prober {
        Prober {
            inner: Arc::new(Inner {
                choice,
                backend: Mutex::new(None),
                seen: Mutex::new(Vec::new()),
                share,
            }),
        }
    }

    /// Which backend answers, for `doctor` and `gpu status`: deciding it may load NVML.
    pub fn backend(&self) -> Result<String, ProbeError> {
        Ok(self.resolve()?.describe())
    }

    /// What each GPU is (model, memory, driver, CUDA, compute capability), for the
    /// records of the batches that run on them.
    pub fn hardware(&self) -> Result<Vec<GpuHardware>, ProbeError> {
        self.resolve()?.hardware(timeout())
    }

    /// Reads the GPUs now.
    pub fn probe(&self) -> Result<Snapshot, ProbeError> {
        let backend = self.resolve()?;
        let reading = backend.read(timeout())?;
        self.check_none_lost(&backend, reading)
    }

    /// A reading from a probe that started at `since` or later: with a lock dir to share
    /// through, another waiter's probe may serve, so N waiters served at once cost one
    /// probe.
    pub fn probe_since(&self, since: Option<HostInstant>) -> Result<Snapshot, ProbeError> {
        let (Some(dir), Some(since)) = (&self.inner.share, since) else {
            return self.probe();
        };
        let backend = self.resolve()?;
        let timeout = timeout();
        // Only a reading that shows the GPUs this process saw serves it (a lost GPU is
        // for our own probe to find); readings come only from processes that see the
        // same device files (the same mount namespace).
        let fits = |(gpus, _): &Reading| {
            let seen = self
                .inner
                .seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            seen.is_empty()
                || (gpus.len() == seen.len()
                    && gpus.iter().all(|g| seen.iter().any(|(_, u)| *u == g.uuid)))
        };
        let reading = shared::probe(dir, &backend.key(), since, timeout, fits, || {
            backend.read(timeout)
        })?;
        self.check_none_lost(&backend, reading)
    }

    fn resolve(&self) -> Result<Arc<Backend>, ProbeError> {
        let mut slot = self
            .inner
            .backend
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(b) = &*slot {
            return Ok(b.clone());
        }
        let smi = |fallback| Backend::Smi {
            program: smi::program(),
            fallback,
            mig: std::sync::atomic::AtomicBool::new(false),
        };
        let rocm = |fallback| Backend::Rocm {
            program: rocm_smi::program(),
            fallback,
        };
        let explicit_smi = smi::program_named().is_some();
        let explicit_rocm = rocm_smi::program_named().is_some();
        let fake = crate::gpu::fake::is_on().then(crate::gpu::fake::active_tool);
        let tool = |tool: Tool, fallback| Backend::Tool {
            tool,
            program: tool.program(),
            fallback,
        };
        let explicit_tool = TOOLS.into_iter().find(|t| t.named());
        let backend = match self.inner.choice {
            // Fake GPUs: their vendor's double whatever was chosen (none: it fails).
            _ if fake == Some(Some("rocm-smi")) => rocm(None),
            _ if fake.is_some() => smi(None),
            ProbeChoice::NvidiaSmi => smi(None),
            ProbeChoice::RocmSmi => rocm(None),
            ProbeChoice::NpuSmi => tool(Tool::NpuSmi, None),
            ProbeChoice::XpuSmi => tool(Tool::XpuSmi, None),
            ProbeChoice::MthreadsGmi => tool(Tool::MthreadsGmi, None),
            ProbeChoice::Auto if explicit_smi => smi(None),
            ProbeChoice::Auto if explicit_rocm => rocm(None),
            ProbeChoice::Auto if explicit_tool.is_some() => {
                tool(explicit_tool.expect("some"), None)
            }
            ProbeChoice::Nvml => {
                Backend::Nvml(nvml::Session::open(timeout()).map_err(ProbeError::from)?)
            }
            ProbeChoice::Auto => match nvml::Session::open(timeout()) {
                Ok(s) => Backend::Nvml(s),
                // Only the default library may be missing: a host without the driver's
                // NVML still has nvidia-smi's answer (or its failure).
                Err(nvml::OpenError::NotLoadable(why)) if nvml::library_named().is_none() => {
                    // The vendor present: AMD's, when its compute driver shows a GPU;
                    // another's, when its driver's device files are there.
                    if rocm_smi::amd_gpu_present() {
                        rocm(Some(why))
                    } else if let Some(t) = TOOLS.into_iter().find(|t| t.present()) {
                        tool(t, Some(why))
                    } else {
                        smi(Some(why))
                    }
                }
                Err(e) => return Err(e.into()),
            },
        };
        let backend = Arc::new(backend);
        *slot = Some(backend.clone());
        Ok(backend)
    }

    /// Fails when a GPU an earlier probe showed is missing; remembers the ones shown.
    fn check_none_lost(&self, backend: &Backend, reading: Reading) -> Result<Snapshot, ProbeError> {
        let (gpus, apps) = reading;
        let mut seen = self
            .inner
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((index, uuid)) = seen
            .iter()
            .find(|(_, uuid)| !gpus.iter().any(|g| &g.uuid == uuid))
        {
            return Err(ProbeError::Lost {
                backend: backend.describe(),
                index: *index,
                uuid: uuid.clone(),
            });
        }
        for g in &gpus {
            if !seen.iter().any(|(_, u)| *u == g.uuid) {
                seen.push((g.index, g.uuid.clone()));
            }
        }
        Ok(Snapshot {
            gpus,
            apps,
            claimed: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_named_twice_fails_every_backend() {
        let b = Backend::Rocm {
            program: "rocm-smi".into(),
            fallback: None,
        };
        let (g0, g1) = ("GPU-18f68e602b8a790f", "GPU-a1b2c3d4e5f60718");
        let mig = "MIG-11111111-2222-3333-4444-555555555555";
        assert!(
            b.named_once([(0, g0, true), (1, g1, true)].into_iter())
                .is_ok()
        );
        // A MIG slice has its GPU's index.
        assert!(
            b.named_once([(0, g0, true), (0, mig, false)].into_iter())
                .is_ok()
        );
        for (units, says) in [
            (
                [(0, g0, true), (1, g0, true)],
                "UUID GPU-18f68e602b8a790f appears twice",
            ),
            ([(0, g0, true), (0, g1, true)], "index 0 appears twice"),
            ([(0, mig, false), (1, mig, false)], "appears twice"),
        ] {
            let e = b.named_once(units.into_iter()).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
            assert!(e.contains("treating all GPUs as unavailable"), "{e}");
        }
    }

    #[test]
    fn host_instants_are_ordered_across_calls() {
        let a = HostInstant::now().unwrap();
        let b = HostInstant::now().unwrap();
        assert!(a <= b);
    }
}
