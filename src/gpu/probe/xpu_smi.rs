//! The Intel backend: Intel XPU Manager's command-line tool, `xpu-smi` (what SGLang's
//! `intel-bmg` runners and Intel's Data Center GPU hosts ship), asked four things
//! (three at once, then the sample) and parsed strictly (its user guide, intel/xpumanager `doc/smi_user_guide.md`:
//! "Discover the devices", "Dump the device statistics in CSV format"):
//!
//! - `xpu-smi discovery -j`: each GPU's `device_id`, `device_name`, `pci_bdf_address`
//!   and `drm_device`, as JSON (`{"device_list": [{…}]}`);
//! - `xpu-smi dump -d 0,1 -m 0,18 -n 1`: one sample of each GPU's utilisation (metric
//!   0, `GPU Utilization (%)`) and memory used (metric 18, `GPU Memory Used (MiB)`), as
//!   CSV with a heading (`Timestamp, DeviceId, GPU Utilization (%), GPU Memory Used
//!   (MiB)`);
//! - `xpu-smi health -l -j` and `xpu-smi ps -j`, at once with the discovery: each
//!   GPU's memory health and the processes on it (see `xpu_health`).
//!
//! An Intel GPU is named by its PCI address (`XPU-0000:29:00.0`): stable across
//! reboots, and what its render and card nodes are found by in sysfs at the hand-over.
//! It is judged idle by its processes, its memory in use and its utilisation, as every
//! vendor's. `N/A` where a number belongs fails the probe, as for every backend.

use std::time::{Duration, Instant};

use super::command::Query;
use super::error::ProbeError;
use super::reading::{GpuHardware, GpuState, Reading};
use super::xpu_health::{QUERY_HEALTH, QUERY_PS, parse_health, parse_ps};

pub const QUERY_DISCOVERY: &str = "discovery -j";
/// The metrics asked of `dump` (the device list is added).
pub const QUERY_DUMP: &str = "dump -m 0,18 -n 1";
const KNOB: &str = "CIBOX_XPU_SMI";

pub fn program() -> String {
    program_named().unwrap_or_else(|| "xpu-smi".into())
}

pub fn program_named() -> Option<String> {
    std::env::var(KNOB).ok().filter(|s| !s.is_empty())
}

/// Whether Intel's GPU driver shows a GPU here (a DRM node whose driver is `i915` or
/// `xe`): under `auto`, without NVML, it chooses xpu-smi.
pub fn present() -> bool {
    let class = crate::util::sysfs_root().join("class/drm");
    let Ok(entries) = std::fs::read_dir(class) else {
        return false;
    };
    entries.flatten().any(|e| {
        std::fs::read_link(e.path().join("device/driver"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
            .is_some_and(|d| d == "i915" || d == "xe")
    })
}

pub use crate::manifest::is_xpu_id;

/// One GPU of the discovery.
struct Device {
    id: u32,
    name: String,
    uuid: String,
}

fn err(program: &str, query: &'static str, line: usize, reason: String) -> ProbeError {
    ProbeError::Parse {
        program: program.into(),
        query,
        line,
        reason,
    }
}

fn start(program: &str, query: &'static str) -> Result<Query, ProbeError> {
    let args: Vec<&str> = query.split(' ').collect();
    Query::start(program, query, &args, KNOB)
}

fn discover(
    program: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<Device>, ProbeError> {
    let out = start(program, QUERY_DISCOVERY)?.finish(deadline, timeout)?;
    parse_discovery(program, &out)
}

/// The answer of [`QUERY_DISCOVERY`].
fn parse_discovery(program: &str, out: &str) -> Result<Vec<Device>, ProbeError> {
    let fail = |reason: String| err(program, QUERY_DISCOVERY, 1, reason);
    let json = super::unique_json::parse(out.trim()).map_err(|e| fail(format!("not JSON: {e}")))?;
    let list = json
        .get("device_list")
        .and_then(|l| l.as_array())
        .ok_or_else(|| fail("no device_list".into()))?;
    let mut devices: Vec<Device> = Vec::new();
    for d in list {
        let id = d
            .get("device_id")
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| fail("a device without a device_id".into()))?;
        let text = |key: &str| d.get(key).and_then(|v| v.as_str()).map(str::trim);
        let pci = text("pci_bdf_address")
            .ok_or_else(|| fail(format!("device {id}: no pci_bdf_address")))?;
        let uuid = format!("XPU-{}", pci.to_ascii_lowercase());
        if !is_xpu_id(&uuid) {
            return Err(fail(format!(
                "device {id}: `{}` is not a PCI address",
                crate::util::escape(pci)
            )));
        }
        if devices.iter().any(|o| o.id == id || o.uuid == uuid) {
            return Err(fail(format!("device {id} ({uuid}) appears twice")));
        }
        let name = text("device_name").unwrap_or("").to_string();
        devices.push(Device { id, name, uuid });
    }
    Ok(devices)
}

/// Runs the discovery with the health reading and the process list (all three at
/// once), then one sample of the discovered GPUs.
pub fn probe(program: &str, timeout: Duration) -> Result<Reading, ProbeError> {
    let deadline = Instant::now() + timeout;
    let mut queries = Vec::new();
    for q in [QUERY_DISCOVERY, QUERY_HEALTH, QUERY_PS] {
        match start(program, q) {
            Ok(query) => queries.push(query),
            Err(e) => {
                queries.into_iter().for_each(Query::kill);
                return Err(e);
            }
        }
    }
    let mut queries = queries.into_iter();
    let (discovery, health, ps) = (
        queries.next().expect("three queries"),
        queries.next().expect("three queries"),
        queries.next().expect("three queries"),
    );
    // The sample needs the device IDs: it starts once the discovery answered, while
    // the health reading and the process list may still run.
    let found = discovery
        .finish(deadline, timeout)
        .and_then(|out| parse_discovery(program, &out));
    let devices = match found {
        Ok(d) => d,
        Err(e) => {
            health.kill();
            ps.kill();
            return Err(e);
        }
    };
    let ids: Vec<u32> = devices.iter().map(|d| d.id).collect();
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    let list = list.join(",");
    let mut args = vec!["dump", "-d", list.as_str()];
    args.extend(QUERY_DUMP.split(' ').skip(1));
    let dump = if devices.is_empty() {
        None
    } else {
        match Query::start(program, QUERY_DUMP, &args, KNOB) {
            Ok(q) => Some(q),
            Err(e) => {
                health.kill();
                ps.kill();
                return Err(e);
            }
        }
    };
    let health = health.finish(deadline, timeout);
    let ps = ps.finish(deadline, timeout);
    let dump = dump.map(|q| q.finish(deadline, timeout));
    let sick = parse_health(program, &health?, &ids)?;
    let apps = parse_ps(program, &ps?, |id| {
        devices.iter().find(|d| d.id == id).map(|d| d.uuid.clone())
    })?;
    let Some(dump) = dump else {
        return Ok((Vec::new(), apps));
    };
    let mut gpus = parse_dump(program, &dump?, &devices)?;
    for g in &mut gpus {
        g.sick = sick.get(&g.index).cloned().flatten();
    }
    Ok((gpus, apps))
}

/// The answer of `dump`: its heading, then one line a GPU.
fn parse_dump(program: &str, out: &str, devices: &[Device]) -> Result<Vec<GpuState>, ProbeError> {
    let q = QUERY_DUMP;
    let mut lines = out
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, heading)) = lines.next() else {
        return Err(err(program, q, 0, "no heading".into()));
    };
    let cols: Vec<&str> = heading.split(',').map(str::trim).collect();
    if cols
        != [
            "Timestamp",
            "DeviceId",
            "GPU Utilization (%)",
            "GPU Memory Used (MiB)",
        ]
    {
        return Err(err(
            program,
            q,
            1,
            format!("unexpected heading `{}`", heading.trim()),
        ));
    }
    let mut gpus: Vec<GpuState> = Vec::new();
    for (i, line) in lines {
        let n = i + 1;
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let [_, id, util, used] = f.as_slice() else {
            return Err(err(
                program,
                q,
                n,
                format!("expected 4 columns: `{}`", line.trim()),
            ));
        };
        let id: u32 = id
            .parse()
            .map_err(|_| err(program, q, n, format!("DeviceId `{id}` is not a number")))?;
        let dev = devices.iter().find(|d| d.id == id).ok_or_else(|| {
            err(
                program,
                q,
                n,
                format!("device {id} is not in the discovery"),
            )
        })?;
        let number = |what: &str, v: &str| -> Result<f64, ProbeError> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| err(program, q, n, format!("{what} is `{v}`, not a number")))
        };
        let util = number("GPU Utilization (%)", util)?;
        if util > 100.0 {
            return Err(err(
                program,
                q,
                n,
                format!("utilization {util}% is over 100"),
            ));
        }
        let used = number("GPU Memory Used (MiB)", used)?;
        if gpus.iter().any(|g| g.index == id) {
            return Err(err(program, q, n, format!("device {id} appears twice")));
        }
        gpus.push(GpuState {
            index: id,
            uuid: dev.uuid.clone(),
            parent: None,
            memory_used_mib: used.ceil() as u64,
            memory_total_mib: 0,
            utilization: Some(util.ceil() as u32),
            sick: None,
        });
    }
    if let Some(d) = devices
        .iter()
        .find(|d| !gpus.iter().any(|g| g.index == d.id))
    {
        return Err(err(program, q, 0, format!("no sample of device {}", d.id)));
    }
    gpus.sort_by_key(|g| g.index);
    Ok(gpus)
}

/// What each GPU is: its name, as the discovery gives it.
pub fn hardware(program: &str, timeout: Duration) -> Result<Vec<GpuHardware>, ProbeError> {
    let deadline = Instant::now() + timeout;
    Ok(discover(program, deadline, timeout)?
        .into_iter()
        .map(|d| GpuHardware {
            index: d.id,
            uuid: d.uuid,
            name: (!d.name.is_empty()).then_some(d.name),
            memory_mib: None,
            driver: None,
            cuda: None,
            compute_capability: None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the user guide shows it (spread here), two GPUs.
    const DISCOVERY: &str = r#"{"device_list": [{"device_function_type": "physical", "device_id": 0, "device_name": "Intel(R) Data Center GPU Max 1100", "device_type": "GPU", "drm_device": "/dev/dri/card1", "pci_bdf_address": "0000:29:00.0", "pci_device_id": "0xbda", "uuid": "00000000-0000-0029-0000-002f0bda8086", "vendor_name": "Intel(R) Corporation"}, {"device_function_type": "physical", "device_id": 1, "device_name": "Intel(R) Data Center GPU Max 1100", "device_type": "GPU", "drm_device": "/dev/dri/card2", "pci_bdf_address": "0000:9a:00.0", "pci_device_id": "0xbda", "uuid": "00000000-0000-009a-0000-002f0bda8086", "vendor_name": "Intel(R) Corporation"}]}"#;
    const DUMP: &str = "Timestamp, DeviceId, GPU Utilization (%), GPU Memory Used (MiB)\n14:32:57.448,    0, 0.00, 28.02\n14:32:57.449,    1, 37.5, 4096.00\n";

    #[test]
    fn reads_each_gpu_by_pci_address() {
        let d = parse_discovery("x", DISCOVERY).unwrap();
        assert_eq!(d[1].uuid, "XPU-0000:9a:00.0");
        let g = parse_dump("x", DUMP, &d).unwrap();
        assert_eq!((g[0].memory_used_mib, g[0].utilization), (29, Some(0)));
        assert_eq!((g[1].memory_used_mib, g[1].utilization), (4096, Some(38)));
        for (bad, says) in [
            (DUMP.replace("37.5", "N/A"), "not a number"),
            (DUMP.replace("    1,", "    7,"), "not in the discovery"),
            (
                DUMP.replace("14:32:57.449,    1, 37.5, 4096.00\n", ""),
                "no sample of device 1",
            ),
            (
                DUMP.replace("GPU Memory Used (MiB)", "GPU Power (W)"),
                "unexpected heading",
            ),
        ] {
            let e = parse_dump("x", &bad, &d).unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
        }
        let twice = DISCOVERY.replace("0000:9a:00.0", "0000:29:00.0");
        assert!(parse_discovery("x", &twice).is_err());
    }
}
