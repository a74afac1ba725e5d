//! A test double for NVML (`libnvidia-ml.so.1`): the entry points cibox calls through
//! `nvml-wrapper`, answering from the same state folder as the `tests/fixtures/nvidia-smi`
//! fixture, named by `CIBOX_FAKE_SMI_STATE` and read afresh on every call so a test can
//! change the machine under a running cibox.
//!
//! Files read there:
//! - `mode`: `ok` (default) | `hang` (sleep 600 s first) | `fail` (driver not loaded, 9) |
//!   `mismatch` (driver/library version mismatch, 18) | `lost` (per-device queries say 15).
//! - `gpus.csv`: `index, uuid, memory.used, memory.total, utilization.gpu`, one line a GPU.
//! - `apps.csv`: `gpu_uuid, pid, used_memory`, one line a compute process.
//! - `nvml_init_latency`, `nvml_latency`: seconds that init, and every other query, take.
//! - `calls.log`: when present, gets `nvml init` and `nvml count` lines as those calls start.
//! - What the GPUs are, as the nvidia-smi fixture reads them: `gpu_name` (default `NVIDIA
//!   H100 80GB HBM3`; `gpu_name.<index>` names one GPU's, for a mixed host), `compute_cap` (`9.0`; `old` answers Not Supported), `driver_version`
//!   (`550.54.15`), `cuda_version` (`12.4`).
//!
//! - MIG: `mig.csv`, as the nvidia-smi fixture reads it (`gpu_index, uuid, profile,
//!   memory.used, memory.total`, one line a slice): a GPU with slices there is in MIG
//!   mode, its slices reached through `nvmlDeviceGetMigDeviceHandleByIndex`, each named
//!   `<its GPU's name> MIG <profile>`, with its own memory and processes (`apps.csv`
//!   rows naming its UUID); neither a slice nor a GPU in MIG mode has a utilisation.
//!
//! - Health: `health.csv` (see [`nvmlDeviceGetFieldValues`]), as the nvidia-smi fixture
//!   reads it.
//!
//! Under an emulated Slurm node (`SLURMD_NODENAME` set), `nodes/<node>/` in the folder,
//! when it exists, is that node's own state folder.
//!
//! Numbers in the csv files are MiB or percent, as nvidia-smi prints them with `nounits`.
//!
//! # Safety
//! Every export is an NVML C entry point: pointers must be valid as NVML documents.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

type Ret = c_uint;
type Device = *mut c_void;

// nvmlReturn_t values, as in nvml-wrapper-sys 0.10 bindings.rs.
const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const DRIVER_NOT_LOADED: Ret = 9;
const GPU_IS_LOST: Ret = 15;
const LIB_RM_VERSION_MISMATCH: Ret = 18;
const ARGUMENT_VERSION_MISMATCH: Ret = 25;
const UNKNOWN: Ret = 999;

const MIB: u64 = 1 << 20;
const NOT_AVAILABLE: u64 = u64::MAX; // NVML_VALUE_NOT_AVAILABLE (-1) as u64

#[repr(C)]
pub struct Memory {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// nvmlProcessInfo_t (the v2 layout), filled by the `_v2` and `_v3` process queries.
#[repr(C)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// nvmlProcessInfo_v1_t, which the unversioned process query fills.
#[repr(C)]
pub struct ProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: u64,
}

/// Successful inits not yet matched by a shutdown, as NVML counts them.
static INITS: AtomicU32 = AtomicU32::new(0);

/// One line of gpus.csv, or of mig.csv for a slice; a `None` field is one nvidia-smi
/// could not report.
struct Gpu {
    index: Option<c_uint>,
    uuid: String,
    used: Option<u64>,
    total: Option<u64>,
    util: Option<c_uint>,
    /// A slice's profile; `None` for a whole GPU.
    profile: Option<String>,
}

/// A handle: the GPU's line in gpus.csv + 1 in the low 16 bits, and for a MIG slice its
/// place among its GPU's slices + 1 above them.
fn handle(gpu: usize, slice: Option<usize>) -> Device {
    ((gpu + 1) | slice.map_or(0, |s| (s + 1) << 16)) as Device
}

/// The slices of the GPU whose index (gpus.csv's first field) is `index`.
fn slices_of(dir: &Path, index: &str) -> Vec<Vec<String>> {
    rows(dir, "mig.csv")
        .into_iter()
        .filter(|r| r.len() == 5 && r[0] == index)
        .collect()
}

/// The state folder; on an emulated Slurm node (`SLURMD_NODENAME` set), its own
/// `nodes/<node>` folder when there is one, so the nodes of one machine have GPUs apart.
fn state_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("CIBOX_FAKE_SMI_STATE")?);
    match std::env::var_os("SLURMD_NODENAME") {
        Some(node) if dir.join("nodes").join(&node).is_dir() => Some(dir.join("nodes").join(node)),
        _ => Some(dir),
    }
}

/// The non-blank lines of a csv file in the folder, split into trimmed fields.
fn rows(dir: &Path, name: &str) -> Vec<Vec<String>> {
    let text = fs::read_to_string(dir.join(name)).unwrap_or_default();
    let lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    lines
        .map(|l| l.split(',').map(|f| f.trim().to_owned()).collect())
        .collect()
}

fn sleep_for(dir: &Path, name: &str) {
    let text = fs::read_to_string(dir.join(name)).unwrap_or_default();
    if let Ok(secs) = text.trim().parse::<f64>()
        && let Ok(pause) = Duration::try_from_secs_f64(secs)
    {
        std::thread::sleep(pause);
    }
}

/// Appends one line with a single write, so concurrent callers never interleave.
fn log(dir: &Path, line: &str) {
    if let Ok(mut file) = OpenOptions::new().append(true).open(dir.join("calls.log")) {
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

/// Applies `mode`: Ok(true) when the GPUs are lost, Err for a driver that will not answer.
fn apply_mode(dir: &Path) -> Result<bool, Ret> {
    let mode = fs::read_to_string(dir.join("mode")).unwrap_or_default();
    match mode.trim() {
        "hang" => std::thread::sleep(Duration::from_secs(600)),
        "fail" => return Err(DRIVER_NOT_LOADED),
        "mismatch" => return Err(LIB_RM_VERSION_MISMATCH),
        "lost" => return Ok(true),
        _ => {}
    }
    Ok(false)
}

/// What every query but init, shutdown and the error string goes through first.
fn enter(log_line: Option<&str>) -> Result<(PathBuf, bool), Ret> {
    let Some(dir) = state_dir() else {
        return Err(if INITS.load(Ordering::SeqCst) == 0 {
            UNINITIALIZED
        } else {
            UNKNOWN
        });
    };
    if let Some(line) = log_line {
        log(&dir, line);
    }
    sleep_for(&dir, "nvml_latency");
    let lost = apply_mode(&dir)?;
    if INITS.load(Ordering::SeqCst) == 0 {
        return Err(UNINITIALIZED);
    }
    Ok((dir, lost))
}

/// The GPU or slice behind a handle (see [`handle`]), read from the files now.
fn gpu(dir: &Path, lost: bool, device: Device) -> Result<Gpu, Ret> {
    let raw = device as usize;
    let line = (raw & 0xffff).checked_sub(1).ok_or(INVALID_ARGUMENT)?;
    let row = rows(dir, "gpus.csv")
        .into_iter()
        .nth(line)
        .ok_or(INVALID_ARGUMENT)?;
    if lost {
        return Err(GPU_IS_LOST);
    }
    let [index, uuid, used, total, util] = <[String; 5]>::try_from(row).map_err(|_| UNKNOWN)?;
    let slices = slices_of(dir, &index);
    if let Some(slice) = (raw >> 16).checked_sub(1) {
        let [_, uuid, profile, used, total] =
            <[String; 5]>::try_from(slices.into_iter().nth(slice).ok_or(INVALID_ARGUMENT)?)
                .map_err(|_| UNKNOWN)?;
        return Ok(Gpu {
            index: index.parse().ok(),
            uuid,
            used: used.parse().ok(),
            total: total.parse().ok(),
            util: None,
            profile: Some(profile),
        });
    }
    Ok(Gpu {
        index: index.parse().ok(),
        uuid,
        used: used.parse().ok(),
        total: total.parse().ok(),
        // In MIG mode the driver has no utilisation.
        util: if slices.is_empty() {
            util.parse().ok()
        } else {
            None
        },
        profile: None,
    })
}

/// Runs a per-device query, folding its result into an nvmlReturn_t.
fn query(device: Device, answer: impl FnOnce(&Path, Gpu) -> Result<(), Ret>) -> Ret {
    code(enter(None).and_then(|(dir, lost)| answer(&dir, gpu(&dir, lost, device)?)))
}

fn code(result: Result<(), Ret>) -> Ret {
    result.err().unwrap_or(SUCCESS)
}

/// Copies a string and its NUL into a caller's buffer.
unsafe fn put_str(buf: *mut c_char, len: c_uint, text: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if (len as usize) <= text.len() {
        return Err(INSUFFICIENT_SIZE);
    }
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast(), buf, text.len());
        *buf.add(text.len()) = 0;
    }
    Ok(())
}

/// Stores a value through an output pointer, refusing a null one.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), Ret> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    unsafe { out.write(value) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    let Some(dir) = state_dir() else {
        return UNKNOWN;
    };
    log(&dir, "nvml init");
    sleep_for(&dir, "nvml_init_latency");
    match apply_mode(&dir) {
        Ok(_) => {
            INITS.fetch_add(1, Ordering::SeqCst);
            SUCCESS
        }
        Err(code) => code,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    unsafe { nvmlInit_v2() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> Ret {
    let drop_one = INITS.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    code(drop_one.map(drop).map_err(|_| UNINITIALIZED))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(code: Ret) -> *const c_char {
    let text = match code {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        DRIVER_NOT_LOADED => c"Driver Not Loaded",
        GPU_IS_LOST => c"GPU is lost",
        LIB_RM_VERSION_MISMATCH => c"RM has detected an NVML/RM version mismatch.",
        ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

/// A value of what the GPUs are: the state folder's file `name`, else `default`.
fn fact(dir: &Path, name: &str, default: &str) -> String {
    fs::read_to_string(dir.join(name))
        .map(|t| t.trim().to_owned())
        .unwrap_or_else(|_| default.to_owned())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> Ret {
    code(enter(None).and_then(|(dir, _)| unsafe {
        put_str(buf, len, &fact(&dir, "driver_version", "550.54.15"))
    }))
}

/// The CUDA version as NVML gives it: 1000 × major + 10 × minor (12.4 is 12040).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Ret {
    code(enter(None).and_then(|(dir, _)| {
        let text = fact(&dir, "cuda_version", "12.4");
        let (major, minor) = text.split_once('.').unwrap_or((&text, "0"));
        let major: c_int = major.parse().map_err(|_| UNKNOWN)?;
        let minor: c_int = minor.parse().map_err(|_| UNKNOWN)?;
        unsafe { put(version, major * 1000 + minor * 10) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> Ret {
    unsafe { nvmlSystemGetCudaDriverVersion_v2(version) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(device: Device, buf: *mut c_char, len: c_uint) -> Ret {
    query(device, |dir, gpu| unsafe {
        // A mixed host: `gpu_name.<index>` names that GPU's model.
        let all = fact(dir, "gpu_name", "NVIDIA H100 80GB HBM3");
        let own = gpu.index.map(|i| fact(dir, &format!("gpu_name.{i}"), &all));
        let name = own.unwrap_or(all);
        match &gpu.profile {
            Some(profile) => put_str(buf, len, &format!("{name} MIG {profile}")),
            None => put_str(buf, len, &name),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: Device,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    query(device, |dir, _| {
        let text = fact(dir, "compute_cap", "9.0");
        let (ma, mi) = text.split_once('.').ok_or(NOT_SUPPORTED)?;
        let ma: c_int = ma.parse().map_err(|_| NOT_SUPPORTED)?;
        let mi: c_int = mi.parse().map_err(|_| NOT_SUPPORTED)?;
        unsafe {
            put(major, ma)?;
            put(minor, mi)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(buf: *mut c_char, len: c_uint) -> Ret {
    code(enter(None).and_then(|_| unsafe { put_str(buf, len, "12.550.54.15") }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    code(enter(Some("nvml count")).and_then(|(dir, _)| {
        let n = rows(&dir, "gpus.csv").len() as c_uint;
        unsafe { put(count, n) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut Device) -> Ret {
    code(enter(None).and_then(|(dir, lost)| {
        if index as usize >= rows(&dir, "gpus.csv").len() {
            return Err(INVALID_ARGUMENT);
        }
        // A real NVML already fails the handle lookup of a lost GPU, as nvidia-smi reports.
        if lost {
            return Err(GPU_IS_LOST);
        }
        unsafe { put(device, handle(index as usize, None)) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: Device,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    query(device, |dir, gpu| {
        if gpu.profile.is_some() {
            return Err(INVALID_ARGUMENT);
        }
        let index = gpu.index.map(|i| i.to_string()).unwrap_or_default();
        let mode = c_uint::from(!slices_of(dir, &index).is_empty());
        unsafe {
            put(current, mode)?;
            put(pending, mode)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: Device, count: *mut c_uint) -> Ret {
    query(device, |_, _| unsafe { put(count, 7) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: Device,
    index: c_uint,
    mig: *mut Device,
) -> Ret {
    query(device, |dir, gpu| {
        if gpu.profile.is_some() {
            return Err(INVALID_ARGUMENT);
        }
        let own = gpu.index.map(|i| i.to_string()).unwrap_or_default();
        if index as usize >= slices_of(dir, &own).len() {
            return Err(NOT_FOUND);
        }
        let line = (device as usize & 0xffff) - 1;
        unsafe { put(mig, handle(line, Some(index as usize))) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: Device, is_mig: *mut c_uint) -> Ret {
    query(device, |_, gpu| unsafe {
        put(is_mig, c_uint::from(gpu.profile.is_some()))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: Device, index: *mut c_uint) -> Ret {
    query(device, |_, gpu| unsafe {
        put(index, gpu.index.ok_or(NOT_SUPPORTED)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: Device, buf: *mut c_char, len: c_uint) -> Ret {
    query(device, |_, gpu| unsafe { put_str(buf, len, &gpu.uuid) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: Device, memory: *mut Memory) -> Ret {
    query(device, |_, gpu| {
        if memory.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // NVML_STRUCT_VERSION(Memory, 2): the caller must say which layout it passed.
        let version = size_of::<Memory>() as c_uint | (2 << 24);
        let memory = unsafe { &mut *memory };
        if memory.version != version {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let total = gpu.total.ok_or(NOT_SUPPORTED)?.saturating_mul(MIB);
        let used = gpu.used.ok_or(NOT_SUPPORTED)?.saturating_mul(MIB);
        let free = total.saturating_sub(used);
        *memory = Memory {
            version,
            total,
            reserved: 0,
            free,
            used,
        };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: Device,
    out: *mut Utilization,
) -> Ret {
    query(device, |_, gpu| {
        let gpu = gpu.util.ok_or(NOT_SUPPORTED)?;
        unsafe { put(out, Utilization { gpu, memory: 0 }) }
    })
}

/// The compute processes on a device, filled into the caller's array of `T`.
unsafe fn processes<T>(
    device: Device,
    count: *mut c_uint,
    infos: *mut T,
    make: fn(c_uint, u64) -> T,
) -> Ret {
    query(device, |dir, gpu| {
        if count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let mut mine = Vec::new();
        for row in rows(dir, "apps.csv") {
            if row.len() == 1 && row[0] == "No running processes found" {
                continue;
            }
            let [uuid, pid, used] = <[String; 3]>::try_from(row).map_err(|_| UNKNOWN)?;
            let pid: c_uint = pid.parse().map_err(|_| UNKNOWN)?;
            let used = match used.as_str() {
                "[N/A]" | "[Not Supported]" => NOT_AVAILABLE,
                mib => mib.parse::<u64>().map_err(|_| UNKNOWN)?.saturating_mul(MIB),
            };
            if uuid == gpu.uuid {
                mine.push(make(pid, used));
            }
        }
        let n = mine.len() as c_uint;
        let room = unsafe { count.replace(n) };
        // As NVML: a null or short array learns the count, and only a non-zero one is an error.
        if infos.is_null() || room < n {
            return if n > 0 {
                Err(INSUFFICIENT_SIZE)
            } else {
                Ok(())
            };
        }
        unsafe { std::ptr::copy_nonoverlapping(mine.as_ptr(), infos, mine.len()) };
        Ok(())
    })
}

fn process_v2(pid: c_uint, used_gpu_memory: u64) -> ProcessInfo {
    let (gpu_instance_id, compute_instance_id) = (c_uint::MAX, c_uint::MAX);
    ProcessInfo {
        pid,
        used_gpu_memory,
        gpu_instance_id,
        compute_instance_id,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    unsafe { processes(device, count, infos, process_v2) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    unsafe { processes(device, count, infos, process_v2) }
}

/// The unversioned query, whose array has the shorter v1 layout.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> Ret {
    unsafe {
        processes(device, count, infos, |pid, used_gpu_memory| ProcessInfoV1 {
            pid,
            used_gpu_memory,
        })
    }
}

/// nvmlFieldValue_t.
#[repr(C)]
pub struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: Ret,
    value: u64,
}

/// `health.csv`, one line a GPU: `index, ecc.errors.uncorrected.volatile.total,
/// retired_pages.pending, remapped_rows.pending, remapped_rows.failure`, as the nvidia-smi
/// fixture reads it (numbers, `Yes`/`No`, `[N/A]` for a field the card does not support;
/// `lost` as the ECC count: the driver reports that GPU lost on these fields). A GPU without
/// a line reads as a healthy H100: `0, [N/A], No, No`.
fn health_of(dir: &Path, index: &str) -> [String; 4] {
    let row = rows(dir, "health.csv")
        .into_iter()
        .find(|r| r.len() == 5 && r[0] == index);
    match row {
        Some(r) => [r[1].clone(), r[2].clone(), r[3].clone(), r[4].clone()],
        None => ["0", "[N/A]", "No", "No"].map(String::from),
    }
}

/// The health fields cibox asks (`NVML_FI_DEV_ECC_DBE_VOL_TOTAL`, `_RETIRED_PENDING`,
/// `_REMAPPED_PENDING`, `_REMAPPED_FAILURE`), each answered with its own return code, as
/// NVML does; any other field is Not Supported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: Device,
    count: c_int,
    values: *mut FieldValue,
) -> Ret {
    query(device, |dir, gpu| {
        if values.is_null() || count < 0 {
            return Err(INVALID_ARGUMENT);
        }
        let index = gpu.index.map(|i| i.to_string()).unwrap_or_default();
        let health = health_of(dir, &index);
        let values = unsafe { std::slice::from_raw_parts_mut(values, count as usize) };
        for v in values {
            let text = match v.field_id {
                4 => Some(&health[0]),
                31 => Some(&health[1]),
                144 => Some(&health[2]),
                145 => Some(&health[3]),
                _ => None,
            };
            let (ret, value) = match text.map(String::as_str) {
                _ if health[0] == "lost" => (GPU_IS_LOST, 0),
                None => (NOT_SUPPORTED, 0),
                Some(t) if t.starts_with('[') => (NOT_SUPPORTED, 0),
                Some("Yes") => (SUCCESS, 1),
                Some("No") => (SUCCESS, 0),
                Some(t) => match t.parse::<u64>() {
                    Ok(n) => (SUCCESS, n),
                    Err(_) => (UNKNOWN, 0),
                },
            };
            v.nvml_return = ret;
            v.value_type = 3; // NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            v.value = value;
        }
        Ok(())
    })
}
