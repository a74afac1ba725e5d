//! The NVML backend: `libnvidia-ml.so.1` (or `CIBOX_NVML_LIB`) loaded at run time
//! through `nvml-wrapper`, so nothing links against the driver.
//!
//! One worker thread opens the library and keeps it open for the life of the process:
//! a waiter's probes then cost a few driver calls, not a process start and a driver
//! initialisation. A driver call cannot be interrupted, so every call is made on that
//! thread and waited for with the probe timeout; one that does not answer leaves the
//! thread stuck and the session wedged, and every later probe fails at once.

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use super::error::ProbeError;
use super::reading::{ComputeApp, GpuHardware, GpuState, Reading};
use crate::manifest::{is_gpu_uuid, is_mig_uuid};

/// The library NVML ships as with the driver (the unversioned name comes only with
/// development packages).
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";
const MIB: u64 = 1 << 20;

/// Set once a driver call of this process did not answer. Its thread is stuck inside
/// the driver or the loader, maybe holding the loader's lock, which the exit handlers
/// (`dlclose`, destructors) need: such a process must leave with `_exit`, or it hangs
/// at its exit for ever.
static STUCK: AtomicBool = AtomicBool::new(false);

/// Whether a driver call of this process is stuck (see [`STUCK`]).
pub fn stuck() -> bool {
    STUCK.load(Ordering::SeqCst)
}

/// `CIBOX_NVML_LIB`, else the driver's library.
pub fn library() -> String {
    library_named().unwrap_or_else(|| DEFAULT_LIBRARY.into())
}

/// The library `CIBOX_NVML_LIB` names, if any (then it must load).
pub fn library_named() -> Option<String> {
    std::env::var("CIBOX_NVML_LIB")
        .ok()
        .filter(|s| !s.is_empty())
}

/// Why NVML could not be used.
pub enum OpenError {
    /// The library could not be loaded at all (no such file, not a shared object).
    NotLoadable(String),
    /// It loaded but did not initialise, or did not answer.
    Failed(ProbeError),
}

impl From<OpenError> for ProbeError {
    fn from(e: OpenError) -> ProbeError {
        match e {
            OpenError::NotLoadable(message) => ProbeError::Nvml {
                lib: library(),
                call: "loading the library".into(),
                message: format!("{message} (set CIBOX_NVML_LIB, or gpu.probe: nvidia-smi)"),
            },
            OpenError::Failed(e) => e,
        }
    }
}

/// A question for the worker thread, which sends its own answer back.
type Job = Box<dyn FnOnce(&Nvml) + Send>;

/// What NVML refused, and in which call.
struct Refusal {
    call: String,
    message: String,
}

/// An open NVML, answering on its worker thread.
pub struct Session {
    lib: String,
    version: String,
    driver: String,
    /// One question at a time, so that a probe's timeout counts from when the worker
    /// takes it up, not from the end of another thread's queue.
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl Session {
    /// Loads and initialises NVML, waiting at most `timeout` for the driver.
    pub fn open(timeout: Duration) -> Result<Session, OpenError> {
        let lib = library();
        // A path must name a plain file: opening a FIFO would block the loader.
        if lib.contains('/') {
            match std::fs::metadata(&lib) {
                Ok(md) if md.is_file() => {}
                Ok(_) => return Err(OpenError::NotLoadable(format!("{lib} is not a plain file"))),
                Err(e) => return Err(OpenError::NotLoadable(format!("{lib}: {e}"))),
            }
        }
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(String, String), OpenError>>(1);
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let path = lib.clone();
        let spawned = std::thread::Builder::new()
            .name("nvml".into())
            .spawn(move || {
                let nvml = match Nvml::builder().lib_path(OsStr::new(&path)).init() {
                    Ok(nvml) => nvml,
                    Err(e) => {
                        let _ = ready_tx.send(Err(open_error(&path, e)));
                        return;
                    }
                };
                let version = nvml.sys_nvml_version().unwrap_or_else(|_| "?".into());
                let driver = nvml.sys_driver_version().unwrap_or_else(|_| "?".into());
                if ready_tx.send(Ok((version, driver))).is_err() {
                    return;
                }
                for job in job_rx {
                    job(&nvml);
                }
            });
        if let Err(e) = spawned {
            return Err(OpenError::Failed(ProbeError::Nvml {
                lib,
                call: "starting its thread".into(),
                message: e.to_string(),
            }));
        }
        match ready_rx.recv_timeout(timeout) {
            Ok(Ok((version, driver))) => Ok(Session {
                lib,
                version,
                driver,
                jobs: Mutex::new(jobs),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                STUCK.store(true, Ordering::SeqCst);
                Err(OpenError::Failed(ProbeError::NvmlTimeout {
                    lib,
                    call: "nvmlInit".into(),
                    secs: timeout.as_secs().max(1),
                }))
            }
        }
    }

    pub fn lib(&self) -> &str {
        &self.lib
    }

    pub fn describe(&self) -> String {
        format!(
            "NVML {} ({}), driver {}",
            self.version, self.lib, self.driver
        )
    }

    /// Reads every GPU and its compute processes.
    pub fn read(&self, timeout: Duration) -> Result<Reading, ProbeError> {
        self.ask(timeout, "reading the GPUs", read)
    }

    /// What each GPU is.
    pub fn hardware(&self, timeout: Duration) -> Result<Vec<GpuHardware>, ProbeError> {
        self.ask(timeout, "reading what the GPUs are", hardware)
    }

    /// Asks `question` of NVML on the worker thread, waiting at most `timeout`.
    fn ask<T: Send + 'static>(
        &self,
        timeout: Duration,
        what: &str,
        question: fn(&Nvml) -> Result<T, Refusal>,
    ) -> Result<T, ProbeError> {
        let wedged = || ProbeError::NvmlTimeout {
            lib: self.lib.clone(),
            call: "an earlier call".into(),
            secs: timeout.as_secs().max(1),
        };
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        if stuck() {
            return Err(wedged());
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |nvml| {
            let _ = tx.send(question(nvml));
        });
        if jobs.send(job).is_err() {
            return Err(wedged());
        }
        match rx.recv_timeout(timeout) {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(r)) => Err(ProbeError::Nvml {
                lib: self.lib.clone(),
                call: r.call,
                message: r.message,
            }),
            Err(_) => {
                STUCK.store(true, Ordering::SeqCst);
                Err(ProbeError::NvmlTimeout {
                    lib: self.lib.clone(),
                    call: what.into(),
                    secs: timeout.as_secs().max(1),
                })
            }
        }
    }
}

/// What each GPU is. The GPUs must answer as for a probe; a value NVML cannot give
/// (a call this library lacks, or one not supported) is `None`.
fn hardware(nvml: &Nvml) -> Result<Vec<GpuHardware>, Refusal> {
    let refused = |call: String| {
        move |e: NvmlError| Refusal {
            call,
            message: e.to_string(),
        }
    };
    let driver = nvml.sys_driver_version().ok();
    let cuda = nvml.sys_cuda_driver_version().ok().map(|v| {
        format!(
            "{}.{}",
            nvml_wrapper::cuda_driver_version_major(v),
            nvml_wrapper::cuda_driver_version_minor(v)
        )
    });
    let count = nvml
        .device_count()
        .map_err(refused("nvmlDeviceGetCount".into()))?;
    let mut gpus = Vec::with_capacity(count as usize);
    for i in 0..count {
        let at = |what: &str| format!("GPU {i}: {what}");
        let d = nvml
            .device_by_index(i)
            .map_err(refused(at("nvmlDeviceGetHandleByIndex")))?;
        let gpu = GpuHardware {
            index: d.index().map_err(refused(at("nvmlDeviceGetIndex")))?,
            uuid: d.uuid().map_err(refused(at("nvmlDeviceGetUUID")))?,
            name: d.name().ok(),
            memory_mib: d.memory_info().ok().map(|m| m.total / MIB),
            driver: driver.clone(),
            cuda: cuda.clone(),
            compute_capability: d
                .cuda_compute_capability()
                .ok()
                .map(|c| format!("{}.{}", c.major, c.minor)),
        };
        // A slice is named as NVML names it: its GPU's model and its profile
        // (`NVIDIA H200 MIG 1g.18gb`).
        for s in slices(&d).map_err(|(call, e)| refused(at(call))(e))? {
            gpus.push(GpuHardware {
                uuid: s.uuid().map_err(refused(at("MIG: nvmlDeviceGetUUID")))?,
                name: s.name().ok(),
                memory_mib: s.memory_info().ok().map(|m| m.total / MIB),
                ..gpu.clone()
            });
        }
        gpus.push(gpu);
    }
    Ok(gpus)
}

/// The MIG slices of GPU `d`: none when MIG mode is off, or when the GPU or the driver
/// does not know MIG (an old library lacks the call). On error, the call that failed.
fn slices<'n>(
    d: &nvml_wrapper::Device<'n>,
) -> Result<Vec<nvml_wrapper::Device<'n>>, (&'static str, NvmlError)> {
    match d.mig_mode() {
        Ok(mode) if mode.current == 1 => {}
        Ok(_) | Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {
            return Ok(Vec::new());
        }
        Err(e) => return Err(("nvmlDeviceGetMigMode", e)),
    }
    let max = d
        .mig_device_count()
        .map_err(|e| ("nvmlDeviceGetMaxMigDeviceCount", e))?;
    let mut out = Vec::new();
    for j in 0..max {
        match d.mig_device_by_index(j) {
            Ok(s) => out.push(s),
            // A slot without a slice.
            Err(NvmlError::NotFound) => {}
            Err(e) => return Err(("nvmlDeviceGetMigDeviceHandleByIndex", e)),
        }
    }
    Ok(out)
}

fn open_error(lib: &str, e: NvmlError) -> OpenError {
    match e {
        NvmlError::LibloadingError(e) => OpenError::NotLoadable(e.to_string()),
        NvmlError::FailedToLoadSymbol(s) => OpenError::Failed(ProbeError::Nvml {
            lib: lib.into(),
            call: "nvmlInit_v2".into(),
            message: format!("{s}: this library is not NVML"),
        }),
        e => OpenError::Failed(ProbeError::Nvml {
            lib: lib.into(),
            call: "nvmlInit_v2".into(),
            message: e.to_string(),
        }),
    }
}

/// Everything cibox asks, strictly: any error or value NVML cannot give is a refusal.
fn read(nvml: &Nvml) -> Result<Reading, Refusal> {
    let refused = |call: String| {
        move |e: NvmlError| Refusal {
            call,
            message: e.to_string(),
        }
    };
    let count = nvml
        .device_count()
        .map_err(refused("nvmlDeviceGetCount".into()))?;
    let mut gpus: Vec<GpuState> = Vec::with_capacity(count as usize);
    let mut apps = Vec::new();
    for i in 0..count {
        let at = |what: &str| format!("GPU {i}: {what}");
        let d = nvml
            .device_by_index(i)
            .map_err(refused(at("nvmlDeviceGetHandleByIndex")))?;
        let uuid = d.uuid().map_err(refused(at("nvmlDeviceGetUUID")))?;
        let index = d.index().map_err(refused(at("nvmlDeviceGetIndex")))?;
        let strange = |message: String| Refusal {
            call: at("its answer"),
            message,
        };
        if !is_gpu_uuid(&uuid) {
            return Err(strange(format!("`{uuid}` is not a GPU UUID")));
        }
        if let Some(other) = gpus
            .iter()
            .find(|g| g.uuid == uuid || (g.index == index && g.parent.is_none()))
        {
            return Err(strange(format!(
                "UUID {uuid} or index {index} is also GPU {}'s",
                other.index
            )));
        }
        let sick = health(&d).map_err(|e| refused(at("nvmlDeviceGetFieldValues"))(e))?;
        let slices = slices(&d).map_err(|(call, e)| refused(at(call))(e))?;
        if slices.is_empty() {
            // A whole GPU: its utilisation is part of the verdict.
            let utilization = d
                .utilization_rates()
                .map_err(refused(at("nvmlDeviceGetUtilizationRates")))?
                .gpu;
            if utilization > 100 {
                return Err(strange(format!("utilization {utilization} is over 100")));
            }
            gpus.push(
                unit(&d, (index, uuid, None), Some(utilization), sick, &mut apps).map_err(
                    |(call, message)| Refusal {
                        call: at(&call),
                        message,
                    },
                )?,
            );
            continue;
        }
        // In MIG mode each slice is a unit, judged by its own processes and memory (the
        // driver has no utilisation in that mode).
        for (j, s) in slices.iter().enumerate() {
            let mig = s
                .uuid()
                .map_err(refused(at(&format!("MIG slice {j}: nvmlDeviceGetUUID"))))?;
            if !is_mig_uuid(&mig) {
                return Err(strange(format!(
                    "slice {j}: `{mig}` is not a MIG UUID (MIG-xxxxxxxx-…: a driver of R470 or later)"
                )));
            }
            if gpus.iter().any(|g| g.uuid == mig) {
                return Err(strange(format!("MIG UUID {mig} appears twice")));
            }
            // A slice is as sick as its GPU: the memory and the bus are the GPU's.
            let named = (index, mig, Some(uuid.clone()));
            gpus.push(unit(s, named, None, sick.clone(), &mut apps).map_err(
                |(call, message)| Refusal {
                    call: at(&format!("MIG slice {j}: {call}")),
                    message,
                },
            )?);
        }
    }
    Ok((gpus, apps))
}

/// One unit to lease, a GPU or a MIG slice of GPU `index`, with its compute processes
/// added to `apps`. On a refusal: the call, and what it said.
fn unit(
    d: &nvml_wrapper::Device<'_>,
    (index, uuid, parent): (u32, String, Option<String>),
    utilization: Option<u32>,
    sick: Option<String>,
    apps: &mut Vec<ComputeApp>,
) -> Result<GpuState, (String, String)> {
    let refused = |call: &'static str| move |e: NvmlError| (call.to_string(), e.to_string());
    let memory = d
        .memory_info()
        .map_err(refused("nvmlDeviceGetMemoryInfo"))?;
    if memory.used > memory.total {
        return Err((
            "its answer".into(),
            format!("{} bytes used of {} in all", memory.used, memory.total),
        ));
    }
    for p in d
        .running_compute_processes()
        .map_err(refused("nvmlDeviceGetComputeRunningProcesses"))?
    {
        let used = match p.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => bytes / MIB,
            UsedGpuMemory::Unavailable => {
                return Err((
                    "its answer".into(),
                    format!(
                        "process {} uses an amount of memory NVML cannot give",
                        p.pid
                    ),
                ));
            }
        };
        apps.push(ComputeApp {
            gpu_uuid: uuid.clone(),
            pid: p.pid,
            used_memory_mib: used,
        });
    }
    Ok(GpuState {
        index,
        uuid,
        parent,
        memory_used_mib: memory.used / MIB,
        memory_total_mib: memory.total / MIB,
        utilization,
        sick,
    })
}

/// NVML's field IDs for the health signs (`nvml.h`: `NVML_FI_DEV_ECC_DBE_VOL_TOTAL`,
/// `NVML_FI_DEV_RETIRED_PENDING`, `NVML_FI_DEV_REMAPPED_PENDING`,
/// `NVML_FI_DEV_REMAPPED_FAILURE`), read in one call.
const HEALTH_FIELDS: [u32; 4] = [4, 31, 144, 145];

/// Why GPU `d` is sick, read in one `nvmlDeviceGetFieldValues` call; `None` when it is
/// healthy, or when the driver does not know the call or a field (`NOT_SUPPORTED`,
/// not sickness). A field the driver says its GPU is lost for makes it sick; any
/// other error refuses the probe.
fn health(d: &nvml_wrapper::Device<'_>) -> Result<Option<String>, NvmlError> {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    let ids = HEALTH_FIELDS.map(FieldId);
    let samples = match d.field_values_for(&ids) {
        Ok(s) => s,
        Err(NvmlError::NotSupported | NvmlError::FunctionNotFound) => return Ok(None),
        Err(NvmlError::FailedToLoadSymbol(_)) => return Ok(None),
        Err(NvmlError::GpuLost) => return Ok(Some("the driver reports it lost".into())),
        Err(e) => return Err(e),
    };
    let mut values: [Option<u64>; 4] = [None; 4];
    for (slot, sample) in values.iter_mut().zip(samples) {
        let value = match sample.map(|s| s.value) {
            Ok(Ok(v)) => v,
            Ok(Err(NvmlError::NotSupported)) | Err(NvmlError::NotSupported) => continue,
            Ok(Err(NvmlError::GpuLost)) | Err(NvmlError::GpuLost) => {
                return Ok(Some("the driver reports it lost".into()));
            }
            Ok(Err(e)) | Err(e) => return Err(e),
        };
        *slot = Some(match value {
            SampleValue::U32(v) => u64::from(v),
            SampleValue::U64(v) => v,
            SampleValue::I64(v) => v.max(0) as u64,
            SampleValue::F64(v) => v.max(0.0) as u64,
        });
    }
    let [ecc, retired, pending, failure] = values;
    Ok(super::health::NvidiaHealth {
        ecc_uncorrected_volatile: ecc,
        retired_pages_pending: retired.map(|v| v != 0),
        remapped_rows_pending: pending.map(|v| v != 0),
        remapped_rows_failure: failure.map(|v| v != 0),
    }
    .verdict())
}
