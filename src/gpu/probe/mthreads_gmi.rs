//! The Moore Threads backend: `mthreads-gmi`, the MTT S4000/S5000 driver's tool,
//! asked in its nvidia-smi-compatible query mode (MUSA driver 2.7 and later:
//! `--query-gpu=… --format=csv,noheader,nounits`, `--query-compute-apps=…`; Moore
//! Threads' "mthreads-gmi User Guide", and the field names public MUSA tooling queries),
//! two queries at once, parsed strictly:
//!
//! - `--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu`;
//! - `--query-compute-apps=gpu_uuid,pid,used_memory`.
//!
//! A GPU is named `MTT-` and its UUID (stable across reboots). `N/A` where a number
//! belongs, a UUID that is not hex groups, one named twice, a process on a GPU the list
//! does not show: a probe failure.

use std::time::{Duration, Instant};

use super::command::Query;
use super::error::ProbeError;
use super::reading::{ComputeApp, GpuHardware, GpuState, Reading};

pub const QUERY_GPUS: &str = "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu";
pub const QUERY_APPS: &str = "--query-compute-apps=gpu_uuid,pid,used_memory";
const FORMAT: &str = "--format=csv,noheader,nounits";
const KNOB: &str = "CIBOX_MTHREADS_GMI";

pub fn program() -> String {
    program_named().unwrap_or_else(|| "mthreads-gmi".into())
}

pub fn program_named() -> Option<String> {
    std::env::var(KNOB).ok().filter(|s| !s.is_empty())
}

/// Whether Moore Threads' driver is loaded here (`/dev/mtgpu.0`).
pub fn present() -> bool {
    crate::util::dev_root().join("mtgpu.0").exists()
}

pub use crate::manifest::is_mtt_id;

fn err(program: &str, query: &'static str, line: usize, reason: String) -> ProbeError {
    ProbeError::Parse {
        program: program.into(),
        query,
        line,
        reason,
    }
}

fn number(
    program: &str,
    q: &'static str,
    n: usize,
    what: &str,
    v: &str,
) -> Result<u64, ProbeError> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(program, q, n, format!("{what} is `{v}`, not a number")));
    }
    v.parse()
        .map_err(|_| err(program, q, n, format!("{what} `{v}` is out of range")))
}

/// Both queries at once.
pub fn probe(program: &str, timeout: Duration) -> Result<Reading, ProbeError> {
    let deadline = Instant::now() + timeout;
    let gpus = Query::start(program, QUERY_GPUS, &[QUERY_GPUS, FORMAT], KNOB)?;
    let apps = match Query::start(program, QUERY_APPS, &[QUERY_APPS, FORMAT], KNOB) {
        Ok(q) => q,
        Err(e) => {
            gpus.kill();
            return Err(e);
        }
    };
    let gpus_out = gpus.finish(deadline, timeout);
    let apps_out = apps.finish(deadline, timeout);
    let gpus: Vec<GpuState> = parse_gpus(program, &gpus_out?)?
        .into_iter()
        .map(|(_, g)| g)
        .collect();
    let apps = parse_apps(program, &apps_out?, &gpus)?;
    Ok((gpus, apps))
}

/// What each GPU is: its name as the tool gives it, its memory.
pub fn hardware(program: &str, timeout: Duration) -> Result<Vec<GpuHardware>, ProbeError> {
    let deadline = Instant::now() + timeout;
    let out = Query::start(program, QUERY_GPUS, &[QUERY_GPUS, FORMAT], KNOB)?
        .finish(deadline, timeout)?;
    Ok(parse_gpus(program, &out)?
        .into_iter()
        .map(|(name, g)| GpuHardware {
            index: g.index,
            uuid: g.uuid,
            name: Some(name),
            memory_mib: Some(g.memory_total_mib),
            driver: None,
            cuda: None,
            compute_capability: None,
        })
        .collect())
}

/// The answer of [`QUERY_GPUS`]: each GPU with its name.
pub fn parse_gpus(program: &str, out: &str) -> Result<Vec<(String, GpuState)>, ProbeError> {
    let q = QUERY_GPUS;
    let mut gpus: Vec<(String, GpuState)> = Vec::new();
    for (i, line) in out
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let n = i + 1;
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let [index, uuid, name, used, total, util] = f.as_slice() else {
            return Err(err(
                program,
                q,
                n,
                format!("expected 6 columns, got {}: `{}`", f.len(), line.trim()),
            ));
        };
        let id = format!("MTT-{}", uuid.strip_prefix("GPU-").unwrap_or(uuid));
        if !is_mtt_id(&id) {
            return Err(err(
                program,
                q,
                n,
                format!("`{}` is not a GPU UUID", crate::util::escape(uuid)),
            ));
        }
        let g = GpuState {
            index: u32::try_from(number(program, q, n, "index", index)?)
                .map_err(|_| err(program, q, n, "index out of range".into()))?,
            uuid: id,
            parent: None,
            memory_used_mib: number(program, q, n, "memory.used", used)?,
            memory_total_mib: number(program, q, n, "memory.total", total)?,
            utilization: Some(number(program, q, n, "utilization.gpu", util)? as u32),
            sick: None,
        };
        if g.utilization.is_some_and(|u| u > 100) || g.memory_used_mib > g.memory_total_mib {
            return Err(err(
                program,
                q,
                n,
                format!("impossible use: `{}`", line.trim()),
            ));
        }
        if gpus
            .iter()
            .any(|(_, o)| o.uuid == g.uuid || o.index == g.index)
        {
            return Err(err(
                program,
                q,
                n,
                format!("GPU {} ({}) appears twice", g.index, g.uuid),
            ));
        }
        gpus.push((name.to_string(), g));
    }
    Ok(gpus)
}

/// The answer of [`QUERY_APPS`].
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
        if line.trim() == "No running processes found" {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let [uuid, pid, used] = f.as_slice() else {
            return Err(err(
                program,
                q,
                n,
                format!("expected 3 columns: `{}`", line.trim()),
            ));
        };
        let id = format!("MTT-{}", uuid.strip_prefix("GPU-").unwrap_or(uuid));
        if !gpus.iter().any(|g| g.uuid == id) {
            return Err(err(
                program,
                q,
                n,
                format!("a process on {id}, which the GPU list does not show"),
            ));
        }
        apps.push(ComputeApp {
            gpu_uuid: id,
            pid: u32::try_from(number(program, q, n, "pid", pid)?)
                .map_err(|_| err(program, q, n, "pid out of range".into()))?,
            used_memory_mib: number(program, q, n, "used_memory", used)?,
        });
    }
    Ok(apps)
}

#[cfg(test)]
mod tests {
    use super::*;

    const U0: &str = "GPU-2b1a0c3d-6f5e-4a7b-8c9d-0e1f2a3b4c5d";

    #[test]
    fn reads_gpus_and_processes_strictly() {
        let out = format!("0, {U0}, MTT S5000, 1024, 81920, 0\n");
        let g = parse_gpus("x", &out).unwrap();
        assert_eq!(g[0].0, "MTT S5000");
        assert_eq!(g[0].1.uuid, "MTT-2b1a0c3d-6f5e-4a7b-8c9d-0e1f2a3b4c5d");
        let states: Vec<GpuState> = g.into_iter().map(|(_, s)| s).collect();
        let apps = parse_apps("x", &format!("{U0}, 77, 512\n"), &states).unwrap();
        assert_eq!(apps[0].pid, 77);
        for bad in [
            format!("0, {U0}, MTT S5000, N/A, 81920, 0"),
            format!("0, {U0}, MTT S5000, 1024, 81920"),
            "0, GPU-zz, MTT S5000, 1024, 81920, 0".to_string(),
            format!("0, {U0}, X, 0, 1, 0\n1, {U0}, X, 0, 1, 0"),
        ] {
            assert!(parse_gpus("x", &bad).is_err(), "{bad}");
        }
        assert!(parse_apps("x", "GPU-0000-1111, 1, 1\n", &states).is_err());
    }
}
