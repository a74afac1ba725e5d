//! The AMD backend: ROCm SMI's command-line tool, `rocm-smi` (Debian 12 ships 5.2.3),
//! asked two things at once and parsed strictly: each GPU's unique ID, use and VRAM
//! (its JSON output), and which GPUs each compute (KFD) process uses with each GPU's
//! RAS table, its health (`--showpidgpus --showrasinfo`, one text call: its JSON output
//! leaves both out; see `rocm_ras`).
//!
//! Why the tool and not its library: the Rust bindings there are (`rocm_smi_lib`) link
//! `librocm_smi64` when cibox is built, so the binary would not start on a host without
//! ROCm (every NVIDIA host), and they generate their bindings at build time; `amdsmi`
//! binds ROCm 6's `amd-smi`, which Debian 12 does not ship. The tool's output is what
//! every ROCm host has; its start-up costs what nvidia-smi's does, and probes are
//! shared between waiters the same way.
//!
//! An AMD GPU is named by its unique ID, as ROCm names it (`GPU-18f68e602b8a790f`,
//! `rocminfo`'s `Uuid`, which `ROCR_VISIBLE_DEVICES` takes): stable across reboots and
//! re-enumeration, unlike the tool's card index. A GPU without one cannot be leased
//! (the probe fails: nothing else names it stably).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::command::{self, Query};
use super::error::ProbeError;
use super::reading::{ComputeApp, GpuHardware, GpuState, Reading};

/// Each GPU's unique ID, use and VRAM, as JSON.
pub const QUERY_STATE: &str = "--showuniqueid --showuse --showmeminfo vram --json";
/// Which GPUs each KFD process uses, and each GPU's RAS table (text: the JSON output
/// leaves both out).
pub const QUERY_PIDS: &str = "--showpidgpus --showrasinfo";
/// What each GPU is: its series (the model), VRAM, and the driver's version.
pub const QUERY_HARDWARE: &str =
    "--showuniqueid --showproductname --showmeminfo vram --showdriverversion --json";
/// The variable that names the program.
const KNOB: &str = "CIBOX_ROCM_SMI";
const MIB: u64 = 1 << 20;

/// The program to run: `CIBOX_ROCM_SMI`, else `rocm-smi` from `PATH`.
pub fn program() -> String {
    program_named().unwrap_or_else(|| "rocm-smi".into())
}

/// The program `CIBOX_ROCM_SMI` names, if any (under `auto` it chooses rocm-smi).
/// Fake GPUs (`CIBOX_FAKE_GPUS`) come first: their double, never the real tool.
pub fn program_named() -> Option<String> {
    crate::gpu::fake::program("rocm-smi")
        .or_else(|| std::env::var(KNOB).ok().filter(|s| !s.is_empty()))
}

/// Whether AMD's compute driver (KFD) shows a GPU on this host: a topology node with
/// SIMD units (the CPUs' nodes have none). Chooses rocm-smi under `gpu.probe: auto`
/// when NVML is not there.
pub fn amd_gpu_present() -> bool {
    let nodes = crate::util::sysfs_root().join("class/kfd/kfd/topology/nodes");
    let Ok(entries) = std::fs::read_dir(nodes) else {
        return false;
    };
    entries.flatten().any(|e| {
        std::fs::read_to_string(e.path().join("properties"))
            .ok()
            .and_then(|p| property(&p, "simd_count"))
            .is_some_and(|n| n > 0)
    })
}

/// The number a KFD topology `properties` file gives `key` (`simd_count 304`).
pub fn property(properties: &str, key: &str) -> Option<u64> {
    properties.lines().find_map(|l| {
        let (k, v) = l.trim().split_once(char::is_whitespace)?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn start(program: &str, query: &'static str) -> Result<Query, ProbeError> {
    let args: Vec<&str> = query.split(' ').collect();
    Query::start(program, query, &args, KNOB)
}

/// Runs both queries of `program` at once and parses them.
pub fn probe(program: &str, timeout: Duration) -> Result<Reading, ProbeError> {
    let deadline = Instant::now() + timeout;
    let state_query = start(program, QUERY_STATE)?;
    let pids_query = match start(program, QUERY_PIDS) {
        Ok(q) => q,
        Err(e) => {
            state_query.kill();
            return Err(e);
        }
    };
    let state = state_query.finish(deadline, timeout);
    let pids = pids_query.finish_any(deadline, timeout);
    let mut cards = parse_state(program, &state?)?;
    let pids = whole_answer(program, pids?)?;
    let (apps, sick) = parse_pids_and_health(program, &pids, &cards)?;
    for (index, why) in sick {
        if let Some(card) = cards.get_mut(&index) {
            card.sick = why;
        }
    }
    Ok((cards.into_values().collect(), apps))
}

/// The answer of [`QUERY_PIDS`], whatever rocm-smi's exit status, when it is whole.
///
/// rocm-smi exits with the last library error it met, even one it keeps quiet
/// (rocm_smi.py 5.2.3 `rsmi_ret_ok`, lines 2766-2793, sets `RETCODE` either way;
/// `exit(RETCODE)`, line 3291): `--showrasinfo` asks every RAS block's state and counts
/// (lines 2115-2127), and a block the driver does not count answers
/// `RSMI_STATUS_NOT_SUPPORTED` (`src/rocm_smi.cc` lines 632-633), so on real cards the
/// call exits non-zero though its answer is whole. Those quiet errors go to the log at
/// `INFO`, below its `WARNING` level (line 3007), and print nothing; any other error
/// (the process list's among them: `rsmi_ret_ok(ret)`, line 1629, would leave a process
/// out) prints `ERROR: …` on standard error. So a non-zero exit is taken only with
/// nothing on standard error and the tool's closing line printed; anything else fails
/// the probe.
fn whole_answer(program: &str, answer: command::Answer) -> Result<String, ProbeError> {
    let closed = answer
        .stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .is_some_and(|l| l.contains(" End of ROCm SMI Log "));
    if answer.success || (answer.stderr.trim().is_empty() && closed) {
        return Ok(answer.stdout);
    }
    Err(answer.failed(program.to_string(), QUERY_PIDS))
}

/// The answer of [`QUERY_PIDS`]: the processes, and why each GPU is sick (`None`: it
/// reads healthy, or its card does not report RAS).
pub fn parse_pids_and_health(
    program: &str,
    out: &str,
    gpus: &BTreeMap<u32, GpuState>,
) -> Result<(Vec<ComputeApp>, super::rocm_ras::Sickness), ProbeError> {
    let Some((pids, ras, first)) = super::rocm_ras::split(out) else {
        return Err(ProbeError::Parse {
            program: program.into(),
            query: QUERY_PIDS,
            line: 0,
            reason: "no RAS Info section: the GPUs' health cannot be told".into(),
        });
    };
    let apps = parse_pids(program, pids, gpus)?;
    let sick = super::rocm_ras::parse(program, QUERY_PIDS, ras, first, gpus)?;
    Ok((apps, sick))
}

/// What each GPU is: its series as the model, its VRAM, the driver's version.
pub fn hardware(program: &str, timeout: Duration) -> Result<Vec<GpuHardware>, ProbeError> {
    let deadline = Instant::now() + timeout;
    let out = start(program, QUERY_HARDWARE)?.finish(deadline, timeout)?;
    parse_hardware(program, &out)
}

/// The cards of the JSON output, by the tool's index (`card3` is 3), with their fields;
/// and the `system` section.
type Cards = (
    BTreeMap<u32, serde_json::Map<String, serde_json::Value>>,
    serde_json::Map<String, serde_json::Value>,
);

fn cards(program: &str, query: &'static str, out: &str) -> Result<Cards, ProbeError> {
    let err = |reason: String| ProbeError::Parse {
        program: program.into(),
        query,
        line: 1,
        reason,
    };
    // The tool prints nothing at all when no GPU answered anything.
    if out.trim().is_empty() {
        return Ok((BTreeMap::new(), serde_json::Map::new()));
    }
    // A card (or a field) given twice would be read as whichever came last: refused.
    let json = super::unique_json::parse(out.trim()).map_err(|e| err(format!("not JSON: {e}")))?;
    let serde_json::Value::Object(top) = json else {
        return Err(err("not a JSON object".into()));
    };
    let mut cards = BTreeMap::new();
    let mut system = serde_json::Map::new();
    for (key, value) in top {
        let serde_json::Value::Object(fields) = value else {
            return Err(err(format!("`{key}` is not an object")));
        };
        if key == "system" {
            system = fields;
            continue;
        }
        let index = key
            .strip_prefix("card")
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| err(format!("unexpected key `{}`", crate::util::escape(&key))))?;
        if cards.insert(index, fields).is_some() {
            return Err(err(format!(
                "`{}` names card {index}, which an earlier key names too",
                crate::util::escape(&key)
            )));
        }
    }
    Ok((cards, system))
}

/// A card's field as text, `None` when absent.
fn field<'a>(fields: &'a serde_json::Map<String, serde_json::Value>, key: &str) -> Option<&'a str> {
    fields.get(key).and_then(|v| v.as_str()).map(str::trim)
}

/// The identity of a card: `GPU-` and its unique ID's 16 hex digits.
fn identity(
    program: &str,
    query: &'static str,
    index: u32,
    fields: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, ProbeError> {
    let err = |reason: String| ProbeError::Parse {
        program: program.into(),
        query,
        line: 1,
        reason: format!("GPU {index}: {reason}"),
    };
    let raw = field(fields, "Unique ID").ok_or_else(|| err("no Unique ID".into()))?;
    let hex = raw
        .strip_prefix("0x")
        .or_else(|| raw.strip_prefix("0X"))
        .unwrap_or(raw);
    let value = u64::from_str_radix(hex, 16).map_err(|_| {
        err(format!(
            "Unique ID is `{}`: cibox names AMD GPUs by it (lock files, ROCR_VISIBLE_DEVICES), and one without it cannot be leased",
            crate::util::escape(raw)
        ))
    })?;
    Ok(format!("GPU-{value:016x}"))
}

/// A number a field holds; `what` names it in the refusal.
fn number(
    program: &str,
    query: &'static str,
    index: u32,
    fields: &serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Result<u64, ProbeError> {
    let text = field(fields, key).unwrap_or("");
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ProbeError::Parse {
            program: program.into(),
            query,
            line: 1,
            reason: format!(
                "GPU {index}: {key} is `{}`, not a number",
                crate::util::escape(if text.is_empty() { "missing" } else { text })
            ),
        });
    }
    text.parse().map_err(|_| ProbeError::Parse {
        program: program.into(),
        query,
        line: 1,
        reason: format!("GPU {index}: {key} `{text}` is out of range"),
    })
}

/// The answer of [`QUERY_STATE`]: each GPU, by the tool's index.
pub fn parse_state(program: &str, out: &str) -> Result<BTreeMap<u32, GpuState>, ProbeError> {
    let q = QUERY_STATE;
    let (cards, _) = cards(program, q, out)?;
    let mut gpus: BTreeMap<u32, GpuState> = BTreeMap::new();
    for (index, fields) in &cards {
        let uuid = identity(program, q, *index, fields)?;
        let utilization = number(program, q, *index, fields, "GPU use (%)")?;
        if utilization > 100 {
            return Err(ProbeError::Parse {
                program: program.into(),
                query: q,
                line: 1,
                reason: format!("GPU {index}: GPU use {utilization}% is over 100"),
            });
        }
        let used = number(program, q, *index, fields, "VRAM Total Used Memory (B)")?;
        let total = number(program, q, *index, fields, "VRAM Total Memory (B)")?;
        if used > total {
            return Err(ProbeError::Parse {
                program: program.into(),
                query: q,
                line: 1,
                reason: format!("GPU {index}: {used} bytes of VRAM used of {total}"),
            });
        }
        if let Some(other) = gpus.values().find(|g| g.uuid == uuid) {
            return Err(ProbeError::Parse {
                program: program.into(),
                query: q,
                line: 1,
                reason: format!(
                    "GPU {index}: unique ID {uuid} is also GPU {}'s",
                    other.index
                ),
            });
        }
        gpus.insert(
            *index,
            GpuState {
                index: *index,
                uuid,
                parent: None,
                memory_used_mib: used / MIB,
                memory_total_mib: total / MIB,
                utilization: Some(utilization as u32),
                sick: None,
            },
        );
    }
    Ok(gpus)
}

/// The answer of [`QUERY_PIDS`]: each KFD process on each GPU it uses.
///
/// ```text
/// ============================ GPUs Indexed by PID =============================
/// PID 4242 is using 2 DRM device(s):
/// 0 3
/// ==============================================================================
/// ```
///
/// Anything else than these lines, the tool's banners and its "No KFD PIDs currently
/// running" is a refusal (its "Unable to get list of KFD PIDs" among them): processes
/// that cannot be told never leave a GPU looking idle. rocm-smi does not say how much
/// memory a process holds on each GPU: `used_memory_mib` is 0 (the GPU's VRAM in use
/// is judged on its own).
pub fn parse_pids(
    program: &str,
    out: &str,
    gpus: &BTreeMap<u32, GpuState>,
) -> Result<Vec<ComputeApp>, ProbeError> {
    let q = QUERY_PIDS;
    let err = |line: usize, reason: String| ProbeError::Parse {
        program: program.into(),
        query: q,
        line,
        reason,
    };
    let mut apps = Vec::new();
    // The process being read, and how many GPU indices it still owes.
    let mut open: Option<(u32, usize, usize)> = None;
    for (i, line) in out.lines().enumerate() {
        let n = i + 1;
        let t = line.trim();
        if t.is_empty() || t.starts_with('=') {
            continue;
        }
        if let Some((pid, owed, at)) = open {
            let mut left = owed;
            for word in t.split_whitespace() {
                let index: u32 = word
                    .parse()
                    .map_err(|_| err(n, format!("`{word}` is not a GPU index (for PID {pid})")))?;
                let gpu = gpus.get(&index).ok_or_else(|| {
                    err(
                        n,
                        format!("PID {pid} uses GPU {index}, which the GPU list does not show"),
                    )
                })?;
                if left == 0 {
                    return Err(err(n, format!("PID {pid}: more GPUs listed than it said")));
                }
                left -= 1;
                apps.push(ComputeApp {
                    gpu_uuid: gpu.uuid.clone(),
                    pid,
                    used_memory_mib: 0,
                });
            }
            open = (left > 0).then_some((pid, left, at));
            continue;
        }
        if t == "No KFD PIDs currently running" {
            continue;
        }
        let Some((pid, count)) = pid_line(t) else {
            return Err(err(
                n,
                format!("unexpected line `{}`", crate::util::escape(t)),
            ));
        };
        if count > 0 {
            open = Some((pid, count, n));
        }
    }
    if let Some((pid, _, at)) = open {
        return Err(err(
            at,
            format!("PID {pid}: fewer GPUs listed than it said"),
        ));
    }
    Ok(apps)
}

/// `PID 4242 is using 2 DRM device(s):` → (4242, 2).
fn pid_line(t: &str) -> Option<(u32, usize)> {
    let rest = t.strip_prefix("PID ")?;
    let (pid, rest) = rest.split_once(" is using ")?;
    let (count, rest) = rest.split_once(' ')?;
    (rest == "DRM device(s):").then_some(())?;
    Some((pid.parse().ok()?, count.parse().ok()?))
}

/// The answer of [`QUERY_HARDWARE`].
pub fn parse_hardware(program: &str, out: &str) -> Result<Vec<GpuHardware>, ProbeError> {
    let q = QUERY_HARDWARE;
    let (cards, system) = cards(program, q, out)?;
    let driver = field(&system, "Driver version").map(str::to_string);
    let mut gpus = Vec::with_capacity(cards.len());
    for (index, fields) in &cards {
        let known = |key: &str| field(fields, key).filter(|v| !v.is_empty() && *v != "N/A");
        gpus.push(GpuHardware {
            index: *index,
            uuid: identity(program, q, *index, fields)?,
            name: known("Card series").map(str::to_string),
            memory_mib: known("VRAM Total Memory (B)")
                .and_then(|b| b.parse::<u64>().ok())
                .map(|b| b / MIB),
            driver: driver.clone(),
            cuda: None,
            compute_capability: None,
        });
    }
    Ok(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As rocm-smi 5.2.3 prints it (one line; spread here).
    const STATE: &str = r#"{"card0": {"Unique ID": "0x18f68e602b8a790f", "GPU use (%)": "0", "GFX Activity": "1234", "VRAM Total Memory (B)": "206141652992", "VRAM Total Used Memory (B)": "11239424"}, "card1": {"Unique ID": "0xa1b2c3d4e5f60718", "GPU use (%)": "37", "GFX Activity": "0", "VRAM Total Memory (B)": "206141652992", "VRAM Total Used Memory (B)": "5368709120"}}"#;

    #[test]
    fn reads_the_state_of_each_gpu_by_its_unique_id() {
        let gpus = parse_state("rocm-smi", STATE).unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[&0].uuid, "GPU-18f68e602b8a790f");
        assert_eq!(gpus[&0].memory_used_mib, 10);
        assert_eq!(gpus[&0].memory_total_mib, 196_592);
        assert_eq!(gpus[&1].utilization, Some(37));
        assert_eq!(gpus[&1].memory_used_mib, 5120);
        assert!(parse_state("rocm-smi", "").unwrap().is_empty());
    }

    #[test]
    fn refuses_what_cannot_be_told() {
        for (bad, says) in [
            (
                STATE.replace("0x18f68e602b8a790f", "N/A"),
                "Unique ID is `N/A`",
            ),
            (
                STATE.replace(r#""GPU use (%)": "0", "#, ""),
                "GPU use (%) is `missing`",
            ),
            (
                STATE.replace(r#""GPU use (%)": "37""#, r#""GPU use (%)": "137""#),
                "over 100",
            ),
            (
                STATE.replace("0xa1b2c3d4e5f60718", "0x18f68e602b8a790f"),
                "is also GPU 0's",
            ),
            (
                STATE.replace("\"11239424\"", "\"9999999999999\""),
                "bytes of VRAM used",
            ),
            (STATE.replace("card1", "gpu1"), "unexpected key `gpu1`"),
            // One card twice, or under two names: the busy reading must not be lost.
            (
                STATE.replace("card1", "card0"),
                "the key `card0` is given twice",
            ),
            (
                STATE.replace("card1", "card00"),
                "`card00` names card 0, which an earlier key names too",
            ),
            (
                STATE.replace(r#""GFX Activity": "0""#, r#""GPU use (%)": "0""#),
                "the key `GPU use (%)` is given twice",
            ),
            ("WARNING: no".to_string(), "not JSON"),
        ] {
            let err = parse_state("rocm-smi", &bad).unwrap_err().to_string();
            assert!(err.contains(says), "{says}: {err}");
        }
    }

    #[test]
    fn reads_which_gpus_each_process_uses() {
        let gpus = parse_state("rocm-smi", STATE).unwrap();
        let out = "\n\n===== ROCm System Management Interface =====\n===== GPUs Indexed by PID =====\nPID 4242 is using 2 DRM device(s):\n0 1 \nPID 77 is using 1 DRM device(s):\n1 \n==========\n===== End of ROCm SMI Log =====\n";
        let apps = parse_pids("rocm-smi", out, &gpus).unwrap();
        let got: Vec<(u32, &str)> = apps.iter().map(|a| (a.pid, a.gpu_uuid.as_str())).collect();
        assert_eq!(
            got,
            [
                (4242, "GPU-18f68e602b8a790f"),
                (4242, "GPU-a1b2c3d4e5f60718"),
                (77, "GPU-a1b2c3d4e5f60718")
            ]
        );
        let none = "===== GPUs Indexed by PID =====\nNo KFD PIDs currently running\n=====\n";
        assert!(parse_pids("rocm-smi", none, &gpus).unwrap().is_empty());
        for bad in [
            "None Unable to get list of KFD PIDs. A kernel update may be needed None",
            "PID 1 is using 1 DRM device(s):\n7 \n",
            "PID 1 is using 2 DRM device(s):\n0 \n",
            "PID 1 is using 1 DRM device(s):\n0 1\n",
            "PID x is using 1 DRM device(s):\n0\n",
        ] {
            assert!(parse_pids("rocm-smi", bad, &gpus).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_what_each_gpu_is() {
        let out = r#"{"card0": {"Unique ID": "0x18f68e602b8a790f", "Card series": "AMD Instinct MI300X", "Card model": "0x74a1", "Card vendor": "Advanced Micro Devices, Inc. [AMD/ATI]", "Card SKU": "N/A", "VRAM Total Memory (B)": "206141652992", "VRAM Total Used Memory (B)": "0"}, "system": {"Driver version": "6.7.0"}}"#;
        let hw = parse_hardware("rocm-smi", out).unwrap();
        assert_eq!(hw[0].uuid, "GPU-18f68e602b8a790f");
        assert_eq!(hw[0].name.as_deref(), Some("AMD Instinct MI300X"));
        assert_eq!(hw[0].memory_mib, Some(196_592));
        assert_eq!(hw[0].driver.as_deref(), Some("6.7.0"));
    }

    #[test]
    fn a_non_zero_exit_is_taken_only_quiet_and_whole() {
        let answer = |success: bool, stdout: &str, stderr: &str| command::Answer {
            success,
            status: if success {
                "exit status: 0"
            } else {
                "exit status: 2"
            }
            .into(),
            stdout: stdout.into(),
            stderr: stderr.into(),
        };
        let whole = "===== RAS Info =====\n====\n===== End of ROCm SMI Log =====\n";
        assert!(whole_answer("r", answer(false, whole, "")).is_ok());
        assert!(whole_answer("r", answer(true, "anything", "")).is_ok());
        let loud = whole_answer("r", answer(false, whole, "ERROR: 2 GPU[0]: x\n"));
        assert!(loud.unwrap_err().to_string().contains("ERROR: 2 GPU[0]"));
        assert!(whole_answer("r", answer(false, "===== RAS Info =====\n", "")).is_err());
    }

    #[test]
    fn kfd_properties_are_read_by_key() {
        let p = "cpu_cores_count 0\nsimd_count 304\ndrm_render_minor 128\nunique_id 1798781644879591695\n";
        assert_eq!(property(p, "simd_count"), Some(304));
        assert_eq!(property(p, "unique_id"), Some(0x18f6_8e60_2b8a_790f));
        assert_eq!(property(p, "simd"), None);
    }
}
