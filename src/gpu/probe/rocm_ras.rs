//! AMD's health reading: rocm-smi's RAS table (`--showrasinfo`), asked in the same
//! call as the process list (`--showpidgpus --showrasinfo`, one text call: the JSON
//! output leaves both out, rocm_smi.py 5.2.3 `printTableLog` returns at once under
//! `--json`, line 593-594), so reading the health costs no call of its own.
//!
//! What the table is, from ROCm/rocm_smi_lib at `rocm-5.2.3` (Debian 12's rocm-smi):
//!
//! - `python_smi_tools/rocm_smi.py` `showRasInfo` (lines 2095-2133): a spacer
//!   ` RAS Info `, then for each GPU `GPU[N]: \tRAS INFO`, a heading, one row a RAS
//!   block (`UMC`, `SDMA`, `GFX`, …, `rsmiBindings.py` `rsmi_gpu_block_d`, lines
//!   295-309): the block, its state, and where the driver counts the block's errors,
//!   two counts: **correctable first, then uncorrectable** (lines 2126-2127), though
//!   5.2.3's heading names them the other way round (`uncorrectable err  correctable
//!   err`, line 2129; fixed in 5.6.0: `Correctable Error  Uncorrectable Error`). The
//!   counts are read by position, as the code appends them, never by the heading.
//! - A block whose state cannot be read prints an empty row; one whose counts cannot be
//!   read prints only its name and state (lines 2117-2128): neither is sickness (a card
//!   without RAS, a block the driver does not count: `N/A`).
//! - The state (`rsmi_ras_err_stale_machine`, `rsmiBindings.py` line 331) is only ever
//!   `ENABLED` or `DISABLED` in 5.2.3 (`src/rocm_smi.cc` lines 585-586: the feature
//!   mask); `NONE` (no errors) and `SING` (one correctable) are healthy too. `MULT`
//!   (multiple uncorrectable), `POSITION` (poison: the firmware isolated a page,
//!   "treat as uncorrectable") and `UNKNOWN ERROR` (parity: "ECC errors present, but
//!   type unknown"), `include/rocm_smi/rocm_smi.h` lines 513-520, are sick.
//! - The counts are the driver's `ras/<block>_err_count` (`ue: N`, `ce: M`;
//!   `src/rocm_smi_device.cc` lines 99-105, `src/rocm_smi.cc` lines 593-663): counted
//!   since the driver loaded, as NVIDIA's volatile count is. A GPU with an uncorrectable
//!   error in any block is sick until the driver reloads (the bad page is then retired
//!   from the EEPROM's list before any allocation).
//!
//! Anything else (a GPU of the state without its table, a row of neither 2 nor 4
//! cells, a count that is not a number, a state none of these) fails the probe closed.

use std::collections::BTreeMap;

use super::error::ProbeError;
use super::reading::GpuState;

/// Why each GPU (by the tool's index) is sick; `None` for a healthy one.
pub type Sickness = BTreeMap<u32, Option<String>>;

/// The states rocm-smi prints (`rsmi_ras_err_stale_machine`, upper-cased), and whether
/// each is sickness.
const STATES: [(&str, Option<&str>); 7] = [
    ("NONE", None),
    ("DISABLED", None),
    ("UNKNOWN ERROR", Some("ECC errors of unknown type")),
    ("SING", None),
    ("MULT", Some("multiple uncorrectable errors")),
    ("POSITION", Some("poison: the firmware isolated a page")),
    ("ENABLED", None),
];

/// The two headings: 5.2.3's (its count columns mislabelled), and 5.6.0's and later.
const HEADINGS: [[&str; 4]; 2] = [
    ["Block", "Status", "uncorrectable err", "correctable err"],
    [
        "Block",
        "Status",
        "Correctable Error",
        "Uncorrectable Error",
    ],
];

/// Splits the answer of `--showpidgpus --showrasinfo` at the RAS spacer: (the process
/// list, the RAS tables with their line offset). No spacer: refused.
pub fn split(out: &str) -> Option<(&str, &str, usize)> {
    let mut at = 0;
    for (i, line) in out.split_inclusive('\n').enumerate() {
        let t = line.trim();
        if t.starts_with('=') && t.trim_matches('=').trim() == "RAS Info" {
            return Some((&out[..at], &out[at + line.len()..], i + 1));
        }
        at += line.len();
    }
    None
}

/// Why each GPU of `gpus` (by the tool's index) is sick, `None` for a healthy one, from
/// the RAS tables `out` (which start at line `first` + 1 of the answer).
pub fn parse(
    program: &str,
    query: &'static str,
    out: &str,
    first: usize,
    gpus: &BTreeMap<u32, GpuState>,
) -> Result<Sickness, ProbeError> {
    let err = |line: usize, reason: String| ProbeError::Parse {
        program: program.into(),
        query,
        line,
        reason,
    };
    let mut seen: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut current: Option<u32> = None;
    for (i, line) in out.lines().enumerate() {
        let n = first + i + 1;
        let t = line.trim();
        if t.is_empty() || t.bytes().all(|b| b == b'_') {
            continue;
        }
        if t.bytes().all(|b| b == b'=') || t.starts_with("===") {
            break;
        }
        if let Some(rest) = t.strip_prefix("GPU[") {
            let (index, title) = rest
                .split_once("]:")
                .ok_or_else(|| err(n, format!("unexpected line `{}`", crate::util::escape(t))))?;
            let index: u32 = index
                .parse()
                .map_err(|_| err(n, format!("`GPU[{index}]` names no GPU index")))?;
            if title.trim() != "RAS INFO" {
                return Err(err(
                    n,
                    format!("unexpected line `{}`", crate::util::escape(t)),
                ));
            }
            if !gpus.contains_key(&index) {
                return Err(err(
                    n,
                    format!("GPU {index}'s RAS table: the GPU list does not show it"),
                ));
            }
            if seen.insert(index, Vec::new()).is_some() {
                return Err(err(n, format!("GPU {index}'s RAS table is given twice")));
            }
            current = Some(index);
            continue;
        }
        let Some(index) = current else {
            return Err(err(
                n,
                format!("unexpected line `{}`", crate::util::escape(t)),
            ));
        };
        let cells: Vec<&str> = t
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        if HEADINGS.iter().any(|h| cells == h) {
            continue;
        }
        if let Some(why) = row(&cells).map_err(|reason| err(n, format!("GPU {index}: {reason}")))? {
            seen.entry(index).or_default().push(why);
        }
    }
    let mut out = BTreeMap::new();
    for (index, gpu) in gpus {
        let Some(why) = seen.remove(index) else {
            return Err(err(
                first,
                format!(
                    "GPU {index} ({}) has no RAS table: its health cannot be told",
                    gpu.uuid
                ),
            ));
        };
        out.insert(*index, (!why.is_empty()).then(|| why.join("; ")));
    }
    Ok(out)
}

/// One block's row: why it makes the GPU sick, if it does.
fn row(cells: &[&str]) -> Result<Option<String>, String> {
    let (block, state, counts) = match cells {
        [block, state] => (*block, *state, None),
        [block, state, ce, ue] => (*block, *state, Some((*ce, *ue))),
        _ => {
            return Err(format!(
                "unexpected RAS row `{}`",
                crate::util::escape(&cells.join("  "))
            ));
        }
    };
    if block.is_empty()
        || !block
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!(
            "`{}` is not a RAS block",
            crate::util::escape(block)
        ));
    }
    let sick_state = STATES
        .iter()
        .find(|(s, _)| *s == state)
        .ok_or_else(|| {
            format!(
                "block {block}: state `{}` is none rocm-smi prints",
                crate::util::escape(state)
            )
        })?
        .1;
    let mut why = Vec::new();
    if let Some(s) = sick_state {
        why.push(format!("RAS reports {s} in {block}"));
    }
    if let Some((ce, ue)) = counts {
        let number = |what: &str, v: &str| {
            v.parse::<u64>().map_err(|_| {
                format!(
                    "block {block}: {what} count `{}` is not a number",
                    crate::util::escape(v)
                )
            })
        };
        number("correctable", ce)?;
        let ue = number("uncorrectable", ue)?;
        if ue > 0 {
            why.push(format!(
                "{ue} uncorrectable ECC error{} in {block} since the driver loaded",
                if ue == 1 { "" } else { "s" }
            ));
        }
    }
    Ok((!why.is_empty()).then(|| why.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(n: u32) -> BTreeMap<u32, GpuState> {
        (0..n)
            .map(|i| {
                (
                    i,
                    GpuState {
                        index: i,
                        uuid: format!("GPU-{i:016x}"),
                        parent: None,
                        memory_used_mib: 0,
                        memory_total_mib: 1,
                        utilization: Some(0),
                        sick: None,
                    },
                )
            })
            .collect()
    }

    /// As rocm-smi 5.2.3 prints `--showpidgpus --showrasinfo` (its spacing: each cell
    /// right-aligned to its heading's width, two spaces between).
    const OUT: &str = "\n\n======================= ROCm System Management Interface =======================\n============================= GPUs Indexed by PID ==============================\nNo KFD PIDs currently running\n================================================================================\n=================================== RAS Info ===================================\n\nGPU[0]: \tRAS INFO\n         Block       Status    uncorrectable err  correctable err  \n           UMC      ENABLED                    3                0  \n          SDMA      ENABLED                    0                0  \n\n           SEM     DISABLED  \n________________________________________________________________________________\n\nGPU[1]: \tRAS INFO\n         Block       Status    uncorrectable err  correctable err  \n           UMC      ENABLED                    0                2  \n           GFX     POSITION                    0                0  \n________________________________________________________________________________\n================================================================================\n============================= End of ROCm SMI Log ==============================\n";

    #[test]
    fn the_uncorrectable_count_is_the_last_cell_whatever_the_heading_says() {
        let (pids, ras, first) = split(OUT).unwrap();
        assert!(pids.contains("No KFD PIDs"));
        let got = parse("rocm-smi", "q", ras, first, &gpus(2)).unwrap();
        // GPU 0: 3 correctable (the column 5.2.3 heads `uncorrectable err`): healthy.
        assert_eq!(got[&0], None);
        assert_eq!(
            got[&1].as_deref(),
            Some(
                "2 uncorrectable ECC errors in UMC since the driver loaded; RAS reports poison: the firmware isolated a page in GFX"
            )
        );
        let newer = OUT.replace(
            "uncorrectable err  correctable err",
            "Correctable Error  Uncorrectable Error",
        );
        let (_, ras, first) = split(&newer).unwrap();
        assert_eq!(parse("x", "q", ras, first, &gpus(2)).unwrap()[&0], None);
    }

    #[test]
    fn what_cannot_be_told_fails_closed() {
        for (bad, says) in [
            (OUT.replace("GPU[1]: \tRAS INFO", "GPU[7]: \tRAS INFO"), "does not show it"),
            (OUT.replace("           GFX     POSITION                    0                0  \n", "").replace("GPU[1]: \tRAS INFO\n         Block       Status    uncorrectable err  correctable err  \n           UMC      ENABLED                    0                2  \n", ""), "GPU 1"),
            (OUT.replace("POSITION", "MAYBE"), "state `MAYBE`"),
            (OUT.replace("                    0                2  ", "                    0              N/A  "), "not a number"),
            (OUT.replace("          SDMA      ENABLED                    0                0  ", "          SDMA      ENABLED                    0  "), "unexpected RAS row"),
        ] {
            let e = split(&bad)
                .ok_or_else(|| "no spacer".to_string())
                .and_then(|(_, ras, first)| {
                    parse("rocm-smi", "q", ras, first, &gpus(2))
                        .map_err(|e| e.to_string())
                });
            let e = e.unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
        assert!(split("PID 1 is using 1 DRM device(s):\n0\n").is_none());
    }

    #[test]
    fn a_card_without_ras_prints_empty_rows_and_is_not_sick() {
        let out = "=================================== RAS Info ===================================\n\nGPU[0]: \tRAS INFO\n         Block       Status    uncorrectable err  correctable err  \n\n\n\n________________________________________________________________________________\n";
        let (_, ras, first) = split(out).unwrap();
        assert_eq!(parse("x", "q", ras, first, &gpus(1)).unwrap()[&0], None);
        let state = out.replace("\n\n\n\n", "\n   UMC  UNKNOWN ERROR  \n");
        let (_, ras, first) = split(&state).unwrap();
        assert_eq!(
            parse("x", "q", ras, first, &gpus(1)).unwrap()[&0].as_deref(),
            Some("RAS reports ECC errors of unknown type in UMC")
        );
    }
}
