//! What xpu-smi says of each Intel GPU besides its use: its health (`xpu-smi health -l
//! -j`) and the processes on it (`xpu-smi ps -j`), both asked at once with the
//! discovery, so they add no time to a probe but the longest of the three. From
//! intel/xpumanager at 980fe92e (the last tree with xpu-smi's CLI, before the 2025
//! redesign):
//!
//! - `-j` prints any command's JSON (`cli/src/cli_wrapper.cpp` line 53,
//!   `cli/src/comlet_base.h` lines 34-41); a failure is `{"error": …, "errno": …}`.
//! - `health -l`: `{"device_list": [{"device_id": 0, "core_temperature": {"status": …,
//!   "description": …}, "memory_temperature": …, "power": …, "memory": …,
//!   "xe_link_port": …, "frequency": …}]}`, a device whose reading failed an object
//!   with `error` (`cli/src/core_stub/lib_core_stub.cpp` `getAllHealth`, lines
//!   665-694, `getHealth`, lines 696-732); each `status` is `OK`, `Warning`,
//!   `Critical` or `Unknown` (`healthStatusEnumToString`, lines 617-636).
//! - What cibox trusts is `memory` alone: Level Zero's memory-module health
//!   (`core/src/device/gpu/gpu_device_stub.cpp` lines 3735-3784, the descriptions at
//!   lines 1417-1431): `Critical` is "operating with reduced memory to cover banks with
//!   too many uncorrectable errors" or "should be replaced due to excessive
//!   uncorrectable errors", `Warning` is "excessive correctable errors … Device should
//!   be reset": both sick, as NVIDIA's uncorrected errors and pending retirements are.
//!   `Unknown` (the module does not say) is not sickness. Temperatures, power and
//!   frequency are states of the load a batch puts on the GPU, not of the GPU, and Xe
//!   Link ports matter only to multi-GPU fabrics: read, not judged.
//! - `ps`: `{"device_util_by_proc_list": [{"process_id", "process_name", "device_id",
//!   "mem_size", "shared_mem_size"}]}`, sizes in kB (`lib_core_stub.cpp`
//!   `getAllDeviceUtilizationByProcess`, lines 1867-1900). xpu-smi lists itself (its
//!   user guide's `xpu-smi ps` example, `doc/smi_user_guide.md` lines 1119-1122: PID
//!   12961 `xpu-smi` on both GPUs): a process named `xpu-smi` is not counted (cibox's
//!   own concurrent queries, another cibox's probe); it is still judged by the memory
//!   it holds, which `dump` reads.
//!
//! Anything else (an `error`, a device of the discovery without a health reading, a
//! process on a device the discovery does not show, a status none of the four) fails
//! the probe closed.

use std::collections::BTreeMap;

use super::error::ProbeError;
use super::reading::ComputeApp;

pub const QUERY_HEALTH: &str = "health -l -j";
pub const QUERY_PS: &str = "ps -j";

fn err(program: &str, query: &'static str, reason: String) -> ProbeError {
    ProbeError::Parse {
        program: program.into(),
        query,
        line: 1,
        reason,
    }
}

/// The JSON answer of `query`, refused when it is an error.
fn json(program: &str, query: &'static str, out: &str) -> Result<serde_json::Value, ProbeError> {
    let v = super::unique_json::parse(out.trim())
        .map_err(|e| err(program, query, format!("not JSON: {e}")))?;
    if let Some(e) = v.get("error") {
        return Err(err(program, query, format!("xpu-smi says: {e}")));
    }
    Ok(v)
}

/// The answer of [`QUERY_HEALTH`]: why each device (by its device ID) is sick, `None`
/// for a healthy one. Each of `ids` must have its reading.
pub fn parse_health(
    program: &str,
    out: &str,
    ids: &[u32],
) -> Result<BTreeMap<u32, Option<String>>, ProbeError> {
    let q = QUERY_HEALTH;
    let v = json(program, q, out)?;
    let list = v
        .get("device_list")
        .and_then(|l| l.as_array())
        .ok_or_else(|| err(program, q, "no device_list".into()))?;
    let mut got = BTreeMap::new();
    for d in list {
        if let Some(e) = d.get("error") {
            return Err(err(
                program,
                q,
                format!("a device's health: xpu-smi says: {e}"),
            ));
        }
        let id = d
            .get("device_id")
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| err(program, q, "a device without a device_id".into()))?;
        let memory = d
            .get("memory")
            .ok_or_else(|| err(program, q, format!("device {id}: no memory health")))?;
        let status = memory.get("status").and_then(|s| s.as_str()).unwrap_or("");
        let description = memory
            .get("description")
            .and_then(|s| s.as_str())
            .unwrap_or("")
            .trim();
        let why = match status {
            "OK" | "Unknown" => None,
            "Warning" | "Critical" => Some(format!(
                "xpu-smi reports its memory health as {status}: {}",
                crate::util::escape(description)
            )),
            other => {
                return Err(err(
                    program,
                    q,
                    format!(
                        "device {id}: memory health `{}` is none of OK, Warning, Critical, Unknown",
                        crate::util::escape(other)
                    ),
                ));
            }
        };
        if got.insert(id, why).is_some() {
            return Err(err(program, q, format!("device {id} appears twice")));
        }
    }
    if let Some(id) = ids.iter().find(|id| !got.contains_key(id)) {
        return Err(err(
            program,
            q,
            format!("device {id} has no health reading: its health cannot be told"),
        ));
    }
    Ok(got)
}

/// The answer of [`QUERY_PS`]: each process on each device, but xpu-smi's own; `uuid`
/// names a device ID's GPU (`None`: not in the discovery, refused).
pub fn parse_ps(
    program: &str,
    out: &str,
    uuid: impl Fn(u32) -> Option<String>,
) -> Result<Vec<ComputeApp>, ProbeError> {
    let q = QUERY_PS;
    let v = json(program, q, out)?;
    let list = v
        .get("device_util_by_proc_list")
        .and_then(|l| l.as_array())
        .ok_or_else(|| err(program, q, "no device_util_by_proc_list".into()))?;
    let mut apps = Vec::new();
    for p in list {
        let number = |key: &str| {
            p.get(key).and_then(|v| v.as_u64()).ok_or_else(|| {
                err(
                    program,
                    q,
                    format!("a process without a numeric {key}: {p}"),
                )
            })
        };
        let pid = u32::try_from(number("process_id")?)
            .map_err(|_| err(program, q, "a process ID out of range".into()))?;
        let device = u32::try_from(number("device_id")?)
            .map_err(|_| err(program, q, "a device ID out of range".into()))?;
        let kb = number("mem_size")?;
        let name = p.get("process_name").and_then(|v| v.as_str()).unwrap_or("");
        let gpu_uuid = uuid(device).ok_or_else(|| {
            err(
                program,
                q,
                format!("PID {pid} uses device {device}, which the discovery does not show"),
            )
        })?;
        if name == "xpu-smi" {
            continue;
        }
        apps.push(ComputeApp {
            gpu_uuid,
            pid,
            used_memory_mib: (kb * 1000).div_ceil(1 << 20),
        });
    }
    Ok(apps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `getAllHealth` builds it (`dump(4)`: indented), two GPUs, the second sick.
    const HEALTH: &str = r#"{
    "device_list": [
        {
            "core_temperature": {"description": "All temperature sensors are healthy.", "shutdown_threshold": 130, "status": "OK", "throttle_threshold": 105},
            "device_id": 0,
            "frequency": {"description": "The device frequency not throttled", "status": "OK"},
            "memory": {"description": "All memory channels are healthy.", "status": "OK"},
            "memory_temperature": {"description": "All temperature sensors are healthy.", "shutdown_threshold": 100, "status": "Warning", "throttle_threshold": 85},
            "power": {"description": "All power domains are healthy.", "status": "OK", "throttle_threshold": 150},
            "xe_link_port": {"description": "All ports are healthy.", "status": "OK"}
        },
        {
            "device_id": 1,
            "memory": {"description": "Device should be replaced due to excessive uncorrectable errors.", "status": "Critical"}
        }
    ]
}"#;

    #[test]
    fn memory_health_alone_judges_and_unknown_is_not_sickness() {
        let got = parse_health("x", HEALTH, &[0, 1]).unwrap();
        assert_eq!(got[&0], None, "a hot GPU is not a sick one");
        assert_eq!(
            got[&1].as_deref(),
            Some(
                "xpu-smi reports its memory health as Critical: Device should be replaced due to excessive uncorrectable errors."
            )
        );
        let unknown = HEALTH.replace("\"Critical\"", "\"Unknown\"");
        assert_eq!(parse_health("x", &unknown, &[0, 1]).unwrap()[&1], None);
        for (bad, says) in [
            (HEALTH.replace("\"Critical\"", "\"Fine\""), "`Fine`"),
            (HEALTH.to_string(), "device 2 has no health reading"),
            (
                r#"{"error": "Level Zero Initialization Error", "errno": 3}"#.to_string(),
                "Level Zero",
            ),
            (
                r#"{"device_list": [{"error": "Error", "errno": 1}]}"#.to_string(),
                "a device's health",
            ),
        ] {
            let e = parse_health("x", &bad, &[0, 1, 2]).unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    #[test]
    fn processes_are_read_by_device_and_xpu_smi_itself_is_not_one() {
        let out = r#"{"device_util_by_proc_list": [{"device_id": 0, "mem_size": 1966, "process_id": 12961, "process_name": "xpu-smi", "shared_mem_size": 0}, {"device_id": 1, "mem_size": 4194304, "process_id": 4242, "process_name": "python3", "shared_mem_size": 0}]}"#;
        let uuid = |d: u32| (d < 2).then(|| format!("XPU-{d}"));
        let apps = parse_ps("x", out, uuid).unwrap();
        assert_eq!(apps.len(), 1);
        assert_eq!((apps[0].pid, apps[0].gpu_uuid.as_str()), (4242, "XPU-1"));
        assert_eq!(apps[0].used_memory_mib, 4000);
        let elsewhere = out.replace("\"device_id\": 1", "\"device_id\": 7");
        assert!(
            parse_ps("x", &elsewhere, uuid)
                .unwrap_err()
                .to_string()
                .contains("device 7")
        );
        assert!(parse_ps("x", r#"{"error": "Error", "errno": 1}"#, uuid).is_err());
        assert!(
            parse_ps("x", r#"{"device_util_by_proc_list": []}"#, uuid)
                .unwrap()
                .is_empty()
        );
    }
}
