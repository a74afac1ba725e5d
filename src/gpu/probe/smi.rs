//! The nvidia-smi backend: two CSV queries, run at once, parsed strictly.

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::error::ProbeError;
use super::reading::{ComputeApp, GpuHardware, GpuState};
use crate::manifest::is_gpu_uuid;

pub const QUERY_GPUS: &str = "--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu";
pub const QUERY_APPS: &str = "--query-compute-apps=gpu_uuid,pid,used_memory";
/// What each GPU is; `compute_cap` needs a driver of 2022 or later (R510).
pub const QUERY_HARDWARE: &str =
    "--query-gpu=index,uuid,name,memory.total,driver_version,compute_cap";
const QUERY_HARDWARE_OLD: &str = "--query-gpu=index,uuid,name,memory.total,driver_version";
/// Prints the versions, the CUDA version among them (R525 and later).
pub const QUERY_VERSION: &str = "--version";
const FORMAT: &str = "--format=csv,noheader,nounits";

/// The program to run: `CIBOX_NVIDIA_SMI`, else `nvidia-smi` from `PATH`.
pub fn program() -> String {
    program_named().unwrap_or_else(|| "nvidia-smi".into())
}

/// The program `CIBOX_NVIDIA_SMI` names, if any (under `auto` it chooses nvidia-smi).
pub fn program_named() -> Option<String> {
    std::env::var("CIBOX_NVIDIA_SMI")
        .ok()
        .filter(|s| !s.is_empty())
}

/// Runs both queries of `program` and parses them.
pub fn probe(
    program: &str,
    timeout: Duration,
) -> Result<(Vec<GpuState>, Vec<ComputeApp>), ProbeError> {
    let deadline = Instant::now() + timeout;
    // Both queries at once: a real nvidia-smi spends most of a call starting up and
    // initialising the driver's view, so two in a row cost twice that.
    let gpus_query = Query::start(program, QUERY_GPUS)?;
    let apps_query = match Query::start(program, QUERY_APPS) {
        Ok(q) => q,
        Err(e) => {
            gpus_query.kill();
            return Err(e);
        }
    };
    let gpus_out = gpus_query.finish(deadline, timeout);
    let apps_out = apps_query.finish(deadline, timeout);
    let gpus = parse_gpus(program, &gpus_out?)?;
    let apps = parse_apps(program, &apps_out?, &gpus)?;
    Ok((gpus, apps))
}

/// One nvidia-smi query, running.
struct Query {
    program: String,
    query: &'static str,
    child: std::process::Child,
    out_reader: std::thread::JoinHandle<Vec<u8>>,
    err_reader: std::thread::JoinHandle<Vec<u8>>,
}

impl Query {
    fn start(program: &str, query: &'static str) -> Result<Query, ProbeError> {
        let args: &[&str] = if query == QUERY_VERSION {
            &[query]
        } else {
            &[query, FORMAT]
        };
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a timeout kills a wrapper script and its children.
            .process_group(0)
            .spawn()
            .map_err(|e| ProbeError::Spawn {
                program: program.into(),
                reason: e.to_string(),
            })?;
        // Read both pipes on threads so a chatty child cannot block on a full pipe.
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let out_reader = std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = stdout.read_to_end(&mut s);
            s
        });
        let err_reader = std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = stderr.read_to_end(&mut s);
            s
        });
        Ok(Query {
            program: program.into(),
            query,
            child,
            out_reader,
            err_reader,
        })
    }

    /// Kills the query's whole process group and reaps it.
    fn kill(mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// Waits for the query until `deadline`; its output, or why there is none.
    fn finish(mut self, deadline: Instant, timeout: Duration) -> Result<String, ProbeError> {
        let (program, query) = (self.program.clone(), self.query);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    self.kill();
                    return Err(ProbeError::Timeout {
                        program,
                        query,
                        secs: timeout.as_secs().max(1),
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    self.kill();
                    return Err(ProbeError::Spawn {
                        program,
                        reason: e.to_string(),
                    });
                }
            }
        };
        let stdout = self.out_reader.join().unwrap_or_default();
        let stderr = self.err_reader.join().unwrap_or_default();
        if !status.success() {
            let stderr = String::from_utf8_lossy(&stderr);
            let first = stderr
                .lines()
                .chain(std::str::from_utf8(&stdout).unwrap_or("").lines())
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output")
                .trim()
                .to_string();
            return Err(ProbeError::Failed {
                program,
                query,
                status: status.to_string(),
                stderr: first,
            });
        }
        String::from_utf8(stdout).map_err(|_| ProbeError::Parse {
            program,
            query,
            line: 0,
            reason: "output is not UTF-8".into(),
        })
    }
}

/// What each GPU is: one query for the GPUs (without `compute_cap` when the driver is
/// too old to know it) and `--version` for the CUDA version, both at once. A value
/// nvidia-smi cannot give (`[N/A]`) is `None`; a GPU list that does not parse, or a
/// program that fails both ways, is an error.
pub fn hardware(program: &str, timeout: Duration) -> Result<Vec<GpuHardware>, ProbeError> {
    let deadline = Instant::now() + timeout;
    let gpus_query = Query::start(program, QUERY_HARDWARE)?;
    let version_query = Query::start(program, QUERY_VERSION);
    let (out, with_cap) = match gpus_query.finish(deadline, timeout) {
        Ok(out) => (out, true),
        Err(_) => {
            let deadline = Instant::now() + timeout;
            let old = Query::start(program, QUERY_HARDWARE_OLD)?.finish(deadline, timeout);
            (old?, false)
        }
    };
    let cuda = version_query
        .ok()
        .and_then(|q| q.finish(deadline, timeout).ok())
        .and_then(|v| cuda_version(&v));
    parse_hardware(program, &out, with_cap, cuda.as_deref())
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

pub fn parse_gpus(program: &str, out: &str) -> Result<Vec<GpuState>, ProbeError> {
    let q = QUERY_GPUS;
    let mut gpus = Vec::new();
    let mut uuids = HashSet::new();
    let mut indices = HashSet::new();
    for (i, line) in out
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let n = i + 1;
        let f = fields(program, q, n, line, 5)?;
        let err = |reason: String| ProbeError::Parse {
            program: program.into(),
            query: q,
            line: n,
            reason,
        };
        if !is_gpu_uuid(f[1]) {
            return Err(err(format!("`{}` is not a GPU UUID", f[1])));
        }
        let gpu = GpuState {
            index: number(program, q, n, "index", f[0])?,
            uuid: f[1].to_string(),
            memory_used_mib: number(program, q, n, "memory.used", f[2])?,
            memory_total_mib: number(program, q, n, "memory.total", f[3])?,
            utilization: number(program, q, n, "utilization.gpu", f[4])?,
        };
        if gpu.utilization > 100 {
            return Err(err(format!(
                "utilization.gpu {} is over 100",
                gpu.utilization
            )));
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
        if !is_gpu_uuid(f[0]) {
            return Err(err(format!("`{}` is not a GPU UUID", f[0])));
        }
        if !gpus.iter().any(|g| g.uuid == f[0]) {
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
