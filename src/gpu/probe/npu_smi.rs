//! The Ascend backend: Huawei's `npu-smi info`, the table every Ascend host's driver
//! ships (Atlas 300I Duo, 800T A2, 800T A3), parsed strictly. One call gives each
//! chip's health, AI Core use, memory (HBM where the chip has it) and the processes on
//! it; a second look at the same table gives what each chip is.
//!
//! The format, as Huawei's documentation for `npu-smi info` shows it (the "npu-smi
//! info" page of the Atlas A2/A3 "npu-smi Command Reference"; the same table appears in
//! Ascend's ModelZoo READMEs, e.g. Ascend/ModelZoo-PyTorch ACL_PyTorch's model pages):
//!
//! ```text
//! +------------------------------------------------------------------------------------------------+
//! | npu-smi 24.1.0                   Version: 24.1.0                                               |
//! +---------------------------+---------------+----------------------------------------------------+
//! | NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
//! | Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
//! +===========================+===============+====================================================+
//! | 0     910B3               | OK            | 93.2        37                0    / 0             |
//! | 0                         | 0000:C1:00.0  | 0           0    / 0          3402 / 65536         |
//! +===========================+===============+====================================================+
//! +---------------------------+---------------+----------------------------------------------------+
//! | NPU   Chip                | Process id    | Process name             | Process memory(MB)      |
//! +===========================+===============+====================================================+
//! | 0     0                   | 2456          | python3.9                | 2890                    |
//! +===========================+===============+====================================================+
//! ```
//!
//! A chip's second row begins `Chip Device` (Atlas 300I: the chip's device ID) or
//! `Chip Phy-ID` (A3: two chips a card) where a card has more than one chip; on an A2
//! the chip's device ID is its card's NPU ID. The device ID numbers its `/dev/davinciN`.
//!
//! A chip is named by its PCI address (`NPU-0000:c1:00.0`): stable across reboots and
//! driver reloads, unlike its NPU ID. Health `OK` is healthy; `Warning`, `Alarm` and
//! `Critical` (the driver's alarms) make it sick; `NA` is not reported (not sickness).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::command::Query;
use super::error::ProbeError;
use super::reading::{ComputeApp, GpuHardware, GpuState, Reading};

/// The one query: the table above.
pub const QUERY: &str = "info";
/// The variable that names the program.
const KNOB: &str = "CIBOX_NPU_SMI";

/// The program to run: `CIBOX_NPU_SMI`, else `npu-smi` from `PATH`.
pub fn program() -> String {
    program_named().unwrap_or_else(|| "npu-smi".into())
}

/// The program `CIBOX_NPU_SMI` names, if any (under `auto` it chooses npu-smi).
pub fn program_named() -> Option<String> {
    std::env::var(KNOB).ok().filter(|s| !s.is_empty())
}

/// Whether Ascend's driver is loaded here (`/dev/davinci_manager`): under `auto`,
/// without NVML, it chooses npu-smi.
pub fn present() -> bool {
    crate::util::dev_root().join("davinci_manager").exists()
}

pub use crate::manifest::is_npu_id;

/// What one `npu-smi info` says: each chip with what it is, and the processes.
#[derive(Debug, Default)]
pub struct Table {
    pub version: Option<String>,
    /// By (NPU ID, chip ID).
    pub chips: BTreeMap<(u32, u32), Chip>,
    pub apps: Vec<ComputeApp>,
}

#[derive(Debug, Clone)]
pub struct Chip {
    pub name: String,
    pub state: GpuState,
}

/// Runs `npu-smi info` and reads it.
pub fn probe(program: &str, timeout: Duration) -> Result<Reading, ProbeError> {
    let t = query(program, timeout)?;
    Ok((t.chips.into_values().map(|c| c.state).collect(), t.apps))
}

/// What each chip is: its name as npu-smi gives it (`910B3`), its memory, and the
/// driver's version.
pub fn hardware(program: &str, timeout: Duration) -> Result<Vec<GpuHardware>, ProbeError> {
    let t = query(program, timeout)?;
    Ok(t.chips
        .into_values()
        .map(|c| GpuHardware {
            index: c.state.index,
            uuid: c.state.uuid,
            name: Some(c.name),
            memory_mib: Some(c.state.memory_total_mib),
            driver: t.version.clone(),
            cuda: None,
            compute_capability: None,
        })
        .collect())
}

fn query(program: &str, timeout: Duration) -> Result<Table, ProbeError> {
    let deadline = Instant::now() + timeout;
    let out = Query::start(program, QUERY, &[QUERY], KNOB)?.finish(deadline, timeout)?;
    parse(program, &out)
}

/// The cells of a table line (`| a | b |` → `["a", "b"]`), `None` for a rule.
fn cells(line: &str) -> Option<Vec<&str>> {
    let t = line.trim();
    let inner = t.strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(str::trim).collect())
}

/// Which part of the table a line is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Top,
    /// The chips; whether the chip row names a device ID, and whether HBM is shown.
    Chips {
        device_col: bool,
        hbm: bool,
    },
    Processes,
}

/// Reads `npu-smi info`'s table; anything it does not expect is a refusal.
pub fn parse(program: &str, out: &str) -> Result<Table, ProbeError> {
    let mut t = Table::default();
    let mut part = Part::Top;
    // The card row waiting for its chip row: (NPU ID, name, health).
    let mut card: Option<(u32, String, String)> = None;
    for (i, line) in out.lines().enumerate() {
        let n = i + 1;
        let err = |reason: String| ProbeError::Parse {
            program: program.into(),
            query: QUERY,
            line: n,
            reason,
        };
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('+') {
            continue;
        }
        let Some(c) = cells(line) else {
            return Err(err(format!(
                "unexpected line `{}`",
                crate::util::escape(trimmed)
            )));
        };
        let first = c[0];
        if first.starts_with("npu-smi ") {
            t.version = first
                .split_whitespace()
                .nth(1)
                .map(str::to_string)
                .filter(|v| !v.is_empty());
            continue;
        }
        if first.starts_with("NPU") && c.get(1) == Some(&"Health") {
            part = Part::Chips {
                device_col: false,
                hbm: false,
            };
            continue;
        }
        if first.starts_with("Chip") && c.get(1) == Some(&"Bus-Id") {
            let words: Vec<&str> = first.split_whitespace().collect();
            part = Part::Chips {
                device_col: words.len() == 2 && matches!(words[1], "Device" | "Phy-ID"),
                hbm: c.get(2).is_some_and(|s| s.contains("HBM-Usage")),
            };
            continue;
        }
        if first.starts_with("NPU") && c.get(1) == Some(&"Process id") {
            part = Part::Processes;
            continue;
        }
        match part {
            Part::Top => return Err(err("a row before any heading".into())),
            Part::Chips { device_col, hbm } => {
                if let Some((npu, name, health)) = card.take() {
                    let (chip_id, mut state) = chip_row(&c, npu, device_col, hbm).map_err(err)?;
                    state.sick = sickness(&health).map_err(err)?;
                    if t.chips.values().any(|o| o.state.uuid == state.uuid) {
                        return Err(err(format!("{} appears twice", state.uuid)));
                    }
                    if t.chips
                        .insert((npu, chip_id), Chip { name, state })
                        .is_some()
                    {
                        return Err(err(format!("NPU {npu} chip {chip_id} appears twice")));
                    }
                } else {
                    card = Some(card_row(&c).map_err(err)?);
                }
            }
            Part::Processes => {
                if c.len() == 1 && first.starts_with("No running processes found in NPU") {
                    continue;
                }
                let [who, pid, _name, _mem] = c.as_slice() else {
                    return Err(err(format!("expected 4 cells, got {}", c.len())));
                };
                let ids: Vec<&str> = who.split_whitespace().collect();
                let [npu, chip] = ids.as_slice() else {
                    return Err(err(format!("`{who}` is not `NPU Chip`")));
                };
                let npu = number(npu, "NPU ID").map_err(err)?;
                let chip = number(chip, "chip ID").map_err(err)?;
                let pid = number(pid, "process id").map_err(err)?;
                let chip = t.chips.get(&(npu, chip)).ok_or_else(|| {
                    err(format!(
                        "process {pid} is on NPU {npu} chip {chip}, which the table does not show"
                    ))
                })?;
                t.apps.push(ComputeApp {
                    gpu_uuid: chip.state.uuid.clone(),
                    pid,
                    used_memory_mib: 0,
                });
            }
        }
    }
    if let Some((npu, ..)) = card {
        return Err(ProbeError::Parse {
            program: program.into(),
            query: QUERY,
            line: 0,
            reason: format!("NPU {npu} has no chip row"),
        });
    }
    Ok(t)
}

fn number(s: &str, what: &str) -> Result<u32, String> {
    s.parse::<u32>()
        .map_err(|_| format!("{what} `{}` is not a number", crate::util::escape(s)))
}

/// `used / total` (`3402 / 65536`).
fn usage(s: &str, what: &str) -> Result<(u64, u64), String> {
    let (u, t) = s
        .split_once('/')
        .ok_or_else(|| format!("{what} `{s}` is not USED / TOTAL"))?;
    let parse = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| format!("{what} `{s}` is not USED / TOTAL"))
    };
    let (u, t) = (parse(u)?, parse(t)?);
    if u > t {
        return Err(format!("{what}: {u} MB used of {t}"));
    }
    Ok((u, t))
}

/// `| 0     910B3 | OK | 93.2 37 0 / 0 |` → (0, `910B3`, `OK`).
fn card_row(c: &[&str]) -> Result<(u32, String, String), String> {
    let [who, health, _power] = c else {
        return Err(format!("expected 3 cells in a card row, got {}", c.len()));
    };
    let (npu, name) = who
        .split_once(char::is_whitespace)
        .ok_or_else(|| format!("`{who}` is not `NPU Name`"))?;
    let name = name.trim();
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b' '));
    if !name_ok {
        return Err(format!(
            "`{}` is not a chip name",
            crate::util::escape(name)
        ));
    }
    Ok((number(npu, "NPU ID")?, name.to_string(), health.to_string()))
}

/// The chip row: its chip ID, and its state named by its PCI address.
fn chip_row(c: &[&str], npu: u32, device_col: bool, hbm: bool) -> Result<(u32, GpuState), String> {
    let [who, bus, use_] = c else {
        return Err(format!("expected 3 cells in a chip row, got {}", c.len()));
    };
    let ids: Vec<&str> = who.split_whitespace().collect();
    let (chip, device) = match (ids.as_slice(), device_col) {
        ([chip], false) => (number(chip, "chip ID")?, npu),
        ([chip, device], true) => (number(chip, "chip ID")?, number(device, "device ID")?),
        _ => return Err(format!("`{who}` does not match the heading")),
    };
    let uuid = format!("NPU-{}", bus.to_ascii_lowercase());
    if !is_npu_id(&uuid) {
        return Err(format!(
            "`{}` is not a PCI address",
            crate::util::escape(bus)
        ));
    }
    // `AICore(%)  Memory-Usage(MB)  [HBM-Usage(MB)]`: `0  0 / 0  3402 / 65536`.
    let words: Vec<&str> = use_.split_whitespace().collect();
    let (aicore, mem) = match words.as_slice() {
        [a, u1, "/", t1] if !hbm => (*a, format!("{u1} / {t1}")),
        [a, _, "/", _, u2, "/", t2] if hbm => (*a, format!("{u2} / {t2}")),
        _ => return Err(format!("`{use_}` does not match the heading")),
    };
    let utilization = number(aicore, "AICore(%)")?;
    if utilization > 100 {
        return Err(format!("AICore {utilization}% is over 100"));
    }
    let (used, total) = usage(&mem, if hbm { "HBM-Usage" } else { "Memory-Usage" })?;
    Ok((
        chip,
        GpuState {
            index: device,
            uuid,
            parent: None,
            memory_used_mib: used,
            memory_total_mib: total,
            utilization: Some(utilization),
            sick: None,
        },
    ))
}

/// The Health cell: `OK`, or the alarm that makes the chip sick.
fn sickness(health: &str) -> Result<Option<String>, String> {
    match health {
        "OK" | "NA" | "N/A" => Ok(None),
        "Warning" | "Alarm" | "Critical" => {
            Ok(Some(format!("npu-smi reports its health as {health}")))
        }
        other => Err(format!(
            "health `{}` is none of OK, Warning, Alarm, Critical",
            crate::util::escape(other)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Atlas 800T A2 as Huawei's documentation shows it, two cards, one process.
    pub const A2: &str = "\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.0                   Version: 24.1.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.2        37                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3402 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | Alarm         | 90.1        36                0    / 0             |
| 0                         | 0000:81:00.0  | 12          0    / 0          2858 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU   Chip                | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
| 1     0                   | 2456          | python3.9                | 2890                    |
+===========================+===============+====================================================+
";

    /// An Atlas 300I Duo card's chips (`Chip Device`, no HBM column).
    const I300: &str = "\
+--------------------------------------------------------------------------------------------------------+
| npu-smi 23.0.0                                   Version: 23.0.0                                       |
+-------------------------------+-----------------+------------------------------------------------------+
| NPU     Name                  | Health          | Power(W)     Temp(C)           Hugepages-Usage(page) |
| Chip    Device                | Bus-Id          | AICore(%)    Memory-Usage(MB)                        |
+===============================+=================+======================================================+
| 6       310P3                 | OK              | NA           50                0     / 0             |
| 0       3                     | 0000:84:00.0    | 0            1839 / 21525                            |
+===============================+=================+======================================================+
+-------------------------------+-----------------+------------------------------------------------------+
| NPU     Chip                  | Process id      | Process name             | Process memory(MB)        |
+===============================+=================+======================================================+
| No running processes found in NPU 6                                                                    |
+===============================+=================+======================================================+
";

    #[test]
    fn reads_each_chip_by_its_pci_address_with_health_and_processes() {
        let t = parse("npu-smi", A2).unwrap();
        assert_eq!(t.version.as_deref(), Some("24.1.0"));
        let chips: Vec<&Chip> = t.chips.values().collect();
        assert_eq!(chips.len(), 2);
        assert_eq!(chips[0].state.uuid, "NPU-0000:c1:00.0");
        assert_eq!(chips[0].name, "910B3");
        assert_eq!(
            (
                chips[0].state.memory_used_mib,
                chips[0].state.memory_total_mib
            ),
            (3402, 65536)
        );
        assert_eq!(chips[0].state.sick, None);
        assert_eq!(chips[1].state.index, 1);
        assert_eq!(chips[1].state.utilization, Some(12));
        assert_eq!(
            chips[1].state.sick.as_deref(),
            Some("npu-smi reports its health as Alarm")
        );
        assert_eq!(t.apps.len(), 1);
        assert_eq!(
            (t.apps[0].pid, t.apps[0].gpu_uuid.as_str()),
            (2456, "NPU-0000:81:00.0")
        );
        let t = parse("npu-smi", I300).unwrap();
        let c = t.chips.values().next().unwrap();
        assert_eq!((c.state.index, c.state.memory_used_mib), (3, 1839));
        assert_eq!(c.name, "310P3");
    }

    #[test]
    fn refuses_what_cannot_be_told() {
        for (bad, says) in [
            (
                A2.replace("| OK            | 93.2", "| Fine          | 93.2"),
                "health `Fine`",
            ),
            (
                A2.replace("0000:C1:00.0", "0000:C1:00  "),
                "not a PCI address",
            ),
            (A2.replace("0000:81:00.0", "0000:C1:00.0"), "appears twice"),
            (A2.replace("3402 / 65536", "99999 / 65536"), "MB used of"),
            (A2.replace("| 12  ", "| 120 "), "over 100"),
            (
                A2.replace(
                    "| 1     0                   | 2456",
                    "| 7     0                   | 2456",
                ),
                "does not show",
            ),
            (A2.replace("| 0     910B3", "| x     910B3"), "NPU ID `x`"),
            ("garbage".to_string(), "unexpected line"),
        ] {
            let e = parse("npu-smi", &bad).unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    #[test]
    fn npu_ids_are_pci_addresses() {
        assert!(is_npu_id("NPU-0000:c1:00.0"));
        assert!(!is_npu_id("NPU-0000:C1:00.0"));
        assert!(!is_npu_id("NPU-0000:c1:00"));
        assert!(!is_npu_id("NPU-../../x"));
        assert!(!is_npu_id("GPU-0000:c1:00.0"));
    }
}
