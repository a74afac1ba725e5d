//! The nvidia-smi backend: two CSV queries, run at once, parsed strictly; and for a GPU
//! in MIG mode (its utilisation reads `[N/A]`, as the driver reports none in that
//! mode), `nvidia-smi -L` for its slices, each then a unit of its own.
//!
//! nvidia-smi does not say which slice a compute process runs in (its process query
//! names the GPU): such a process keeps every slice of its GPU busy, and a slice's
//! memory is judged by its whole GPU's. The NVML backend knows each slice's own.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::command::Query;
use super::error::ProbeError;
use super::health::NvidiaHealth;
use super::reading::{ComputeApp, GpuHardware, GpuState};
use crate::manifest::{is_gpu_uuid, is_mig_uuid};

/// Each GPU's use and its health (see `super::health`), in one call.
pub const QUERY_GPUS: &str = "--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure";
/// The same without the health fields, for a driver that does not know them (its
/// answer: `Field "remapped_rows.pending" is not a valid field to query.`): the
/// GPUs' health is then not read.
pub const QUERY_GPUS_NO_HEALTH: &str =
    "--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu";
pub const QUERY_APPS: &str = "--query-compute-apps=gpu_uuid,pid,used_memory";
/// What each GPU is; `compute_cap` needs a driver of 2022 or later (R510).
pub const QUERY_HARDWARE: &str =
    "--query-gpu=index,uuid,name,memory.total,driver_version,compute_cap";
const QUERY_HARDWARE_OLD: &str = "--query-gpu=index,uuid,name,memory.total,driver_version";
/// Prints the versions, the CUDA version among them (R525 and later).
pub const QUERY_VERSION: &str = "--version";
/// Lists the GPUs and, under each in MIG mode, its slices with their profiles.
pub const QUERY_LIST: &str = "-L";
const FORMAT: &str = "--format=csv,noheader,nounits";
/// The variable that names the program.
const KNOB: &str = "CIBOX_NVIDIA_SMI";

/// The program to run: `CIBOX_NVIDIA_SMI`, else `nvidia-smi` from `PATH`.
pub fn program() -> String {
    program_named().unwrap_or_else(|| "nvidia-smi".into())
}

/// The program `CIBOX_NVIDIA_SMI` names, if any (under `auto` it chooses nvidia-smi).
/// Fake GPUs (`CIBOX_FAKE_GPUS`) come first: their double, never the real tool.
pub fn program_named() -> Option<String> {
    crate::gpu::fake::program("nvidia-smi")
        .or_else(|| std::env::var(KNOB).ok().filter(|s| !s.is_empty()))
}

/// Starts one query: the CSV ones with their format, `--version` and `-L` bare.
fn start(program: &str, query: &'static str) -> Result<Query, ProbeError> {
    if query.starts_with("--query") {
        Query::start(program, query, &[query, FORMAT], KNOB)
    } else {
        Query::start(program, query, &[query], KNOB)
    }
}

/// Runs both queries of `program` and parses them (and `-L`, when a GPU is in MIG
/// mode: at once with the others where `mig_seen`, a GPU in MIG mode seen before).
pub fn probe(
    program: &str,
    timeout: Duration,
    mig_seen: bool,
) -> Result<(Vec<GpuState>, Vec<ComputeApp>), ProbeError> {
    let deadline = Instant::now() + timeout;
    // The queries at once: a real nvidia-smi spends most of a call starting up and
    // initialising the driver's view, so two in a row cost twice that.
    let gpus_query = start(program, QUERY_GPUS)?;
    let apps_query = match start(program, QUERY_APPS) {
        Ok(q) => q,
        Err(e) => {
            gpus_query.kill();
            return Err(e);
        }
    };
    let list_query = mig_seen.then(|| start(program, QUERY_LIST));
    let gpus_out = gpus_query.finish(deadline, timeout);
    let apps_out = apps_query.finish(deadline, timeout);
    let list_out = list_query.map(|q| q.and_then(|q| q.finish(deadline, timeout)));
    let read = match gpus_out {
        Err(ProbeError::Failed { stderr, .. }) if stderr.contains("is not a valid field") => {
            let out = start(program, QUERY_GPUS_NO_HEALTH)?.finish(deadline, timeout)?;
            parse_gpu_lines(program, &out, false)?
        }
        out => parse_gpu_lines(program, &out?, true)?,
    };
    // Only a host with a GPU in MIG mode pays for the list.
    let slices = if read.iter().any(|g| g.utilization.is_none()) {
        let out = match list_out {
            Some(out) => out?,
            None => start(program, QUERY_LIST)?.finish(deadline, timeout)?,
        };
        parse_list(program, &out)?
    } else {
        Vec::new()
    };
    let gpus = with_slices(program, read, &slices)?;
    let apps = parse_apps(program, &apps_out?, &gpus)?;
    Ok((gpus, apps))
}

/// What each GPU is: one query for the GPUs (without `compute_cap` when the driver is
/// too old to know it), `--version` for the CUDA version and `-L` for MIG slices, all
/// at once. A value nvidia-smi cannot give (`[N/A]`) is `None`; a GPU list that does
/// not parse, or a program that fails both ways, is an error. A slice is named by its
/// GPU's model and its profile (`NVIDIA H200 MIG 1g.18gb`), as NVML names it.
pub fn hardware(program: &str, timeout: Duration) -> Result<Vec<GpuHardware>, ProbeError> {
    let deadline = Instant::now() + timeout;
    let gpus_query = start(program, QUERY_HARDWARE)?;
    let version_query = start(program, QUERY_VERSION);
    let list_query = start(program, QUERY_LIST);
    let (out, with_cap) = match gpus_query.finish(deadline, timeout) {
        Ok(out) => (out, true),
        Err(_) => {
            let deadline = Instant::now() + timeout;
            let old = start(program, QUERY_HARDWARE_OLD)?.finish(deadline, timeout);
            (old?, false)
        }
    };
    let cuda = version_query
        .ok()
        .and_then(|q| q.finish(deadline, timeout).ok())
        .and_then(|v| cuda_version(&v));
    let mut gpus = parse_hardware(program, &out, with_cap, cuda.as_deref())?;
    // Slices only describe here: a list that cannot be read leaves them unnamed, and a
    // request for a slice's model then finds none (fail closed).
    let slices = list_query
        .ok()
        .and_then(|q| q.finish(deadline, timeout).ok())
        .and_then(|out| parse_list(program, &out).ok())
        .unwrap_or_default();
    for slice in slices {
        let Some(parent) = gpus.iter().find(|g| g.uuid == slice.parent).cloned() else {
            continue;
        };
        gpus.push(GpuHardware {
            uuid: slice.uuid,
            name: parent
                .name
                .as_ref()
                .map(|n| format!("{n} MIG {}", slice.profile)),
            memory_mib: None,
            ..parent
        });
    }
    Ok(gpus)
}

/// A MIG slice as `nvidia-smi -L` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedSlice {
    /// The UUID of the GPU it is a slice of.
    pub parent: String,
    pub uuid: String,
    /// Its profile (`1g.18gb`).
    pub profile: String,
}

/// The slices `nvidia-smi -L` lists, each under its GPU:
///
/// ```text
/// GPU 0: NVIDIA H200 (UUID: GPU-…)
///   MIG 1g.18gb     Device  0: (UUID: MIG-…)
/// ```
pub fn parse_list(program: &str, out: &str) -> Result<Vec<ListedSlice>, ProbeError> {
    let err = |line: usize, reason: String| ProbeError::Parse {
        program: program.into(),
        query: QUERY_LIST,
        line,
        reason,
    };
    let uuid_in = |l: &str| {
        l.split_once("(UUID: ")
            .and_then(|(_, rest)| rest.split_once(')'))
            .map(|(u, _)| u.trim().to_string())
    };
    let mut parent: Option<String> = None;
    let mut slices: Vec<ListedSlice> = Vec::new();
    for (i, line) in out.lines().enumerate() {
        let n = i + 1;
        let t = line.trim();
        if t.starts_with("GPU ") {
            let uuid = uuid_in(t).ok_or_else(|| err(n, format!("no UUID in `{t}`")))?;
            if !is_gpu_uuid(&uuid) {
                return Err(err(n, format!("`{uuid}` is not a GPU UUID")));
            }
            parent = Some(uuid);
        } else if let Some(rest) = t.strip_prefix("MIG ") {
            let profile = rest.split_whitespace().next().unwrap_or_default();
            let uuid = uuid_in(t).ok_or_else(|| err(n, format!("no UUID in `{t}`")))?;
            if !is_mig_uuid(&uuid) {
                return Err(err(
                    n,
                    format!(
                        "`{uuid}` is not a MIG UUID (MIG-xxxxxxxx-…: a driver of R470 or later)"
                    ),
                ));
            }
            let profile_ok = !profile.is_empty()
                && profile.len() <= 32
                && profile
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'_' | b'-'));
            if !profile_ok {
                return Err(err(n, format!("`{profile}` is not a MIG profile")));
            }
            let Some(parent) = parent.clone() else {
                return Err(err(n, "a MIG slice before any GPU".into()));
            };
            if slices.iter().any(|s| s.uuid == uuid) {
                return Err(err(n, format!("UUID {uuid} appears twice")));
            }
            slices.push(ListedSlice {
                parent,
                uuid,
                profile: profile.to_string(),
            });
        } else if !t.is_empty() {
            return Err(err(n, format!("unexpected line `{t}`")));
        }
    }
    Ok(slices)
}

/// The units to lease: each GPU as read, but a GPU in MIG mode (no utilisation) as its
/// slices, each judged by its GPU's memory. A GPU without utilisation and without
/// slices cannot be judged: the probe fails.
fn with_slices(
    program: &str,
    read: Vec<GpuState>,
    slices: &[ListedSlice],
) -> Result<Vec<GpuState>, ProbeError> {
    let mut units = Vec::with_capacity(read.len());
    for gpu in read {
        if gpu.utilization.is_some() {
            units.push(gpu);
            continue;
        }
        let own: Vec<&ListedSlice> = slices.iter().filter(|s| s.parent == gpu.uuid).collect();
        if own.is_empty() {
            return Err(ProbeError::Parse {
                program: program.into(),
                query: QUERY_GPUS,
                line: 0,
                reason: format!(
                    "GPU {} ({}) reports no utilization.gpu, and `{program} -L` lists no MIG slice of it",
                    gpu.index, gpu.uuid
                ),
            });
        }
        units.extend(own.into_iter().map(|s| GpuState {
            uuid: s.uuid.clone(),
            parent: Some(gpu.uuid.clone()),
            utilization: None,
            ..gpu.clone()
        }));
    }
    Ok(units)
}

/// The CUDA version `nvidia-smi --version` names (`CUDA Version        : 12.4`).
pub fn cuda_version(out: &str) -> Option<String> {
    out.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim().eq_ignore_ascii_case("CUDA Version") && !value.trim().is_empty())
            .then(|| value.trim().to_string())
    })
}

/// The answer of [`QUERY_HARDWARE`] (or the query without `compute_cap`).
pub fn parse_hardware(
    program: &str,
    out: &str,
    with_cap: bool,
    cuda: Option<&str>,
) -> Result<Vec<GpuHardware>, ProbeError> {
    let q = if with_cap {
        QUERY_HARDWARE
    } else {
        QUERY_HARDWARE_OLD
    };
    let known = |v: &str| {
        let v = v.trim();
        (!v.is_empty() && !v.starts_with('[')).then(|| v.to_string())
    };
    let mut gpus = Vec::new();
    for (i, line) in out
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let n = i + 1;
        let f = fields(program, q, n, line, if with_cap { 6 } else { 5 })?;
        if !is_gpu_uuid(f[1]) {
            return Err(ProbeError::Parse {
                program: program.into(),
                query: q,
                line: n,
                reason: format!("`{}` is not a GPU UUID", f[1]),
            });
        }
        gpus.push(GpuHardware {
            index: number(program, q, n, "index", f[0])?,
            uuid: f[1].to_string(),
            name: known(f[2]),
            memory_mib: known(f[3]).and_then(|m| m.parse().ok()),
            driver: known(f[4]),
            cuda: cuda.map(str::to_string),
            compute_capability: if with_cap { known(f[5]) } else { None },
        });
    }
    Ok(gpus)
}

fn fields<'a>(
    program: &str,
    query: &'static str,
    line_no: usize,
    line: &'a str,
    n: usize,
) -> Result<Vec<&'a str>, ProbeError> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() != n {
        return Err(ProbeError::Parse {
            program: program.into(),
            query,
            line: line_no,
            reason: format!("expected {n} columns, got {}: `{line}`", f.len()),
        });
    }
    Ok(f)
}

fn number<T: std::str::FromStr>(
    program: &str,
    query: &'static str,
    line_no: usize,
    what: &str,
    s: &str,
) -> Result<T, ProbeError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ProbeError::Parse {
            program: program.into(),
            query,
            line: line_no,
            reason: format!("{what} is `{s}`, not a number"),
        });
    }
    s.parse().map_err(|_| ProbeError::Parse {
        program: program.into(),
        query,
        line: line_no,
        reason: format!("{what} `{s}` is out of range"),
    })
}

/// The answer of [`QUERY_GPUS_NO_HEALTH`] on a host without MIG: every GPU reports its
/// utilisation.
#[cfg(test)]
pub fn parse_gpus(program: &str, out: &str) -> Result<Vec<GpuState>, ProbeError> {
    with_slices(program, parse_gpu_lines(program, out, false)?, &[])
}

/// The answer of [`QUERY_GPUS`] (of [`QUERY_GPUS_NO_HEALTH`] without `health`): a
/// GPU's utilisation is `None` where it reads `[N/A]` (a GPU in MIG mode:
/// [`with_slices`] decides).
fn parse_gpu_lines(program: &str, out: &str, health: bool) -> Result<Vec<GpuState>, ProbeError> {
    let q = if health {
        QUERY_GPUS
    } else {
        QUERY_GPUS_NO_HEALTH
    };
    let mut gpus = Vec::new();
    let mut uuids = HashSet::new();
    let mut indices = HashSet::new();
    for (i, line) in out
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let n = i + 1;
        let f = fields(program, q, n, line, if health { 9 } else { 5 })?;
        let err = |reason: String| ProbeError::Parse {
            program: program.into(),
            query: q,
            line: n,
            reason,
        };
        let sick = match health {
            true => NvidiaHealth::from_smi(&f[5..9]).map_err(err)?.verdict(),
            false => None,
        };
        if !is_gpu_uuid(f[1]) {
            return Err(err(format!("`{}` is not a GPU UUID", f[1])));
        }
        let utilization = match f[4] {
            "[N/A]" => None,
            u => Some(number(program, q, n, "utilization.gpu", u)?),
        };
        let gpu = GpuState {
            index: number(program, q, n, "index", f[0])?,
            uuid: f[1].to_string(),
            parent: None,
            memory_used_mib: number(program, q, n, "memory.used", f[2])?,
            memory_total_mib: number(program, q, n, "memory.total", f[3])?,
            utilization,
            sick,
        };
        if let Some(u) = gpu.utilization.filter(|u| *u > 100) {
            return Err(err(format!("utilization.gpu {u} is over 100")));
        }
        if !uuids.insert(gpu.uuid.clone()) {
            return Err(err(format!("UUID {} appears twice", gpu.uuid)));
        }
        if !indices.insert(gpu.index) {
            return Err(err(format!("index {} appears twice", gpu.index)));
        }
        gpus.push(gpu);
    }
    Ok(gpus)
}

pub fn parse_apps(
    program: &str,
    out: &str,
    gpus: &[GpuState],
) -> Result<Vec<ComputeApp>, ProbeError> {
    let q = QUERY_APPS;
    let mut apps = Vec::new();
    for (i, line) in out
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let n = i + 1;
        // Some drivers print this instead of an empty list.
        if line.trim() == "No running processes found" {
            continue;
        }
        let f = fields(program, q, n, line, 3)?;
        let err = |reason: String| ProbeError::Parse {
            program: program.into(),
            query: q,
            line: n,
            reason,
        };
        if !is_gpu_uuid(f[0]) && !is_mig_uuid(f[0]) {
            return Err(err(format!("`{}` is not a GPU UUID", f[0])));
        }
        // A process on a GPU in MIG mode is named by the GPU: it keeps the GPU's
        // slices busy (see `pool::busy_reason`).
        if !gpus
            .iter()
            .any(|g| g.uuid == f[0] || g.parent.as_deref() == Some(f[0]))
        {
            return Err(err(format!(
                "process on GPU {} that the GPU list does not show",
                f[0]
            )));
        }
        apps.push(ComputeApp {
            gpu_uuid: f[0].to_string(),
            pid: number(program, q, n, "pid", f[1])?,
            used_memory_mib: number(program, q, n, "used_memory", f[2])?,
        });
    }
    Ok(apps)
}

#[cfg(test)]
mod tests {
    use super::*;

    const U0: &str = "GPU-2f8b7c1e-0000-4a4a-9c9c-000000000000";
    const U1: &str = "GPU-2f8b7c1e-0000-4a4a-9c9c-000000000001";

    #[test]
    fn parses_real_csv() {
        let out = format!("0, {U0}, 0, 81559, 0\n1, {U1}, 1024, 81559, 37\n");
        let gpus = parse_gpus("x", &out).unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1].memory_used_mib, 1024);
        let apps = parse_apps("x", &format!("{U1}, 4242, 1000\n"), &gpus).unwrap();
        assert_eq!(apps[0].pid, 4242);
        assert!(parse_apps("x", "", &gpus).unwrap().is_empty());
    }

    #[test]
    fn reads_what_each_gpu_is() {
        let out = format!(
            "0, {U0}, NVIDIA H200, 143771, 550.90.07, 9.0\n1, {U1}, NVIDIA H200, [N/A], 550.90.07, [N/A]\n"
        );
        let hw = parse_hardware("x", &out, true, Some("12.4")).unwrap();
        assert_eq!(hw[0].name.as_deref(), Some("NVIDIA H200"));
        assert_eq!(hw[0].memory_mib, Some(143_771));
        assert_eq!(hw[0].driver.as_deref(), Some("550.90.07"));
        assert_eq!(hw[0].cuda.as_deref(), Some("12.4"));
        assert_eq!(hw[0].compute_capability.as_deref(), Some("9.0"));
        assert_eq!(
            (hw[1].memory_mib, hw[1].compute_capability.as_deref()),
            (None, None)
        );
        let old = parse_hardware(
            "x",
            &format!("0, {U0}, Tesla V100, 16160, 470.1"),
            false,
            None,
        )
        .unwrap();
        assert_eq!(old[0].compute_capability, None);
        assert!(parse_hardware("x", "0, not-a-uuid, x, 1, 2, 3", true, None).is_err());
        let version = "NVIDIA-SMI version  : 550.54.15\nNVML version        : 550.54\nDRIVER version      : 550.54.15\nCUDA Version        : 12.4\n";
        assert_eq!(cuda_version(version).as_deref(), Some("12.4"));
        assert_eq!(cuda_version("nvidia-smi: unknown option"), None);
    }

    #[test]
    fn a_gpu_in_mig_mode_is_its_slices() {
        let m0 = "MIG-aaaaaaaa-0000-5b6c-8d7e-000000000000";
        let m1 = "MIG-aaaaaaaa-0000-5b6c-8d7e-000000000001";
        let list = format!(
            "GPU 0: NVIDIA H200 (UUID: {U0})\n  MIG 1g.18gb     Device  0: (UUID: {m0})\n  MIG 3g.71gb     Device  1: (UUID: {m1})\nGPU 1: NVIDIA H200 (UUID: {U1})\n"
        );
        let slices = parse_list("x", &list).unwrap();
        assert_eq!(slices.len(), 2);
        assert_eq!(
            (slices[1].profile.as_str(), slices[1].parent.as_str()),
            ("3g.71gb", U0)
        );
        let read = parse_gpu_lines(
            "x",
            &format!("0, {U0}, 40, 143771, [N/A]\n1, {U1}, 0, 143771, 0\n"),
            false,
        )
        .unwrap();
        let units = with_slices("x", read.clone(), &slices).unwrap();
        let ids: Vec<(&str, Option<&str>)> = units
            .iter()
            .map(|g| (g.uuid.as_str(), g.parent.as_deref()))
            .collect();
        assert_eq!(ids, [(m0, Some(U0)), (m1, Some(U0)), (U1, None)]);
        // Judged by the GPU's memory; no utilisation.
        assert_eq!((units[0].memory_used_mib, units[0].utilization), (40, None));
        // A process named by the GPU is the GPU's (and so its slices').
        let apps = parse_apps("x", &format!("{U0}, 7, 30\n"), &units).unwrap();
        assert_eq!(apps[0].gpu_uuid, U0);
        // No utilisation and no slice: nothing can judge it.
        let err = with_slices("x", read, &[]).unwrap_err().to_string();
        assert!(err.contains("lists no MIG slice of it"), "{err}");
        for bad in [
            format!("  MIG 1g.18gb Device 0: (UUID: {m0})"),
            format!(
                "GPU 0: X (UUID: {U0})\n  MIG 1g.18gb Device 0: (UUID: MIG-GPU-{}/1/0)",
                &U0[4..]
            ),
            format!("GPU 0: X (UUID: {U0})\n  MIG 1g/18gb Device 0: (UUID: {m0})"),
            format!(
                "GPU 0: X (UUID: {U0})\n  MIG 1g.18gb Device 0: (UUID: {m0})\n  MIG 1g.18gb Device 1: (UUID: {m0})"
            ),
            "something else".to_string(),
        ] {
            assert!(parse_list("x", &bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_each_gpus_health_in_the_same_query() {
        let out = format!(
            "0, {U0}, 0, 81559, 0, 0, [N/A], No, No\n1, {U1}, 0, 81559, 0, 3, [N/A], No, No\n"
        );
        let gpus = parse_gpu_lines("x", &out, true).unwrap();
        assert_eq!(gpus[0].sick, None);
        assert_eq!(
            gpus[1].sick.as_deref(),
            Some("3 uncorrected ECC errors since the driver loaded")
        );
        let odd = format!("0, {U0}, 0, 81559, 0, 0, [N/A], Perhaps, No\n");
        let err = parse_gpu_lines("x", &odd, true).unwrap_err().to_string();
        assert!(err.contains("remapped_rows.pending is `Perhaps`"), "{err}");
        // Five columns where nine belong: refused.
        assert!(parse_gpu_lines("x", &format!("0, {U0}, 0, 81559, 0"), true).is_err());
    }

    #[test]
    fn refuses_odd_fields() {
        for bad in [
            format!("0, {U0}, [N/A], 81559, 0"),
            format!("0, {U0}, 0, 81559, [Not Supported]"),
            format!("0, {U0}, 0, 81559"),
            "0, GPU-nothex, 0, 81559, 0".to_string(),
            format!("0, {U0}, 0, 81559, 0\n1, {U0}, 0, 81559, 0"),
            format!("0, {U0}, -1, 81559, 0"),
        ] {
            assert!(parse_gpus("x", &bad).is_err(), "{bad}");
        }
        let gpus = parse_gpus("x", &format!("0, {U0}, 0, 81559, 0")).unwrap();
        assert!(parse_apps("x", &format!("{U1}, 1, 1"), &gpus).is_err());
        assert!(parse_apps("x", &format!("{U0}, 1, [N/A]"), &gpus).is_err());
    }
}
