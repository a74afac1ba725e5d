//! What the run's batches ran on, for people: a section of `summary.md` (a row per GPU
//! batch: its GPUs' model, memory, driver, CUDA version, compute capability; then the
//! kernel and engine) and one closing line on the terminal.

use super::markdown::markdown_text;
use crate::report::outcome::BatchResult;
use crate::report::record::{GpuHardware, Hardware};

/// Before the GPUs of a batch that ran on fake ones (`cibox gpu fake`).
const FAKE: &str = "FAKE (not real hardware) ";

/// A GPU in one cell: `NVIDIA H100 80GB HBM3 (9.0, 81559 MiB)`.
fn gpu_text(g: &GpuHardware) -> String {
    let mut facts = Vec::new();
    if let Some(cc) = &g.compute_capability {
        facts.push(format!("compute {cc}"));
    }
    if let Some(m) = g.memory_mib {
        facts.push(format!("{m} MiB"));
    }
    let name = g.name.as_deref().unwrap_or("unknown model");
    if facts.is_empty() {
        name.to_string()
    } else {
        format!("{name} ({})", facts.join(", "))
    }
}

/// The driver and CUDA version a set of GPUs share (or each one's, joined).
fn driver_text(gpus: &[GpuHardware]) -> (String, String) {
    let join = |f: fn(&GpuHardware) -> Option<&String>| {
        let mut seen: Vec<&str> = gpus
            .iter()
            .map(|g| f(g).map_or("unknown", String::as_str))
            .collect();
        seen.dedup();
        seen.join(", ")
    };
    (join(|g| g.driver.as_ref()), join(|g| g.cuda.as_ref()))
}

/// Several GPUs in one text: `2× NVIDIA H100 80GB HBM3 (compute 9.0, 81559 MiB)`.
pub fn gpus_text(gpus: &[GpuHardware]) -> String {
    let mut groups: Vec<(String, usize)> = Vec::new();
    for g in gpus {
        let text = gpu_text(g);
        match groups.iter_mut().find(|(t, _)| *t == text) {
            Some((_, n)) => *n += 1,
            None => groups.push((text, 1)),
        }
    }
    groups
        .iter()
        .map(|(t, n)| {
            if *n == 1 {
                t.clone()
            } else {
                format!("{n}× {t}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The hosts the batches ran on (kernel and engine), each once, in order.
fn hosts(results: &[BatchResult]) -> Vec<(&str, &str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for hw in results.iter().filter_map(|b| b.record.hardware.as_ref()) {
        let host = (hw.kernel.as_str(), hw.engine.as_str());
        if !out.contains(&host) {
            out.push(host);
        }
    }
    out
}

/// The `### Hardware` section of `summary.md`; empty when no record says (older ones).
pub fn summary_section(results: &[BatchResult]) -> String {
    let with_gpus: Vec<(&str, &Hardware)> = results
        .iter()
        .filter_map(|b| Some((b.record.batch.as_str(), b.record.hardware.as_ref()?)))
        .filter(|(_, hw)| !hw.gpus.is_empty() || hw.gpus_unknown.is_some())
        .collect();
    let hosts = hosts(results);
    if hosts.is_empty() {
        return String::new();
    }
    let mut s = String::from("\n### Hardware\n\n");
    if !with_gpus.is_empty() {
        s.push_str("| batch | GPUs | driver | CUDA |\n|---|---|---|---|\n");
        for (batch, hw) in with_gpus {
            let (gpus, driver, cuda) = match &hw.gpus_unknown {
                Some(why) => (format!("unknown: {why}"), "?".into(), "?".into()),
                None => {
                    let indices: Vec<String> =
                        hw.gpus.iter().map(|g| g.index.to_string()).collect();
                    let (driver, cuda) = driver_text(&hw.gpus);
                    let fake = if hw.fake_gpus { FAKE } else { "" };
                    (
                        format!(
                            "{fake}{} on GPU {}",
                            gpus_text(&hw.gpus),
                            indices.join(", ")
                        ),
                        driver,
                        cuda,
                    )
                }
            };
            s.push_str(&format!(
                "| {batch} | {} | {} | {} |\n",
                markdown_text(&gpus),
                markdown_text(&driver),
                markdown_text(&cuda)
            ));
        }
        s.push('\n');
    }
    for (kernel, engine) in hosts {
        s.push_str(&format!(
            "Kernel {}, engine {}.\n",
            markdown_text(kernel),
            markdown_text(engine)
        ));
    }
    s
}

/// One line for the terminal's closing lines: what the run ran on.
pub fn closing_line(results: &[BatchResult]) -> Option<String> {
    let hosts = hosts(results);
    if hosts.is_empty() {
        return None;
    }
    let host: Vec<String> = hosts
        .iter()
        .map(|(k, e)| format!("kernel {k}, engine {e}"))
        .collect();
    let mut gpus: Vec<GpuHardware> = Vec::new();
    for hw in results.iter().filter_map(|b| b.record.hardware.as_ref()) {
        for g in &hw.gpus {
            if !gpus.iter().any(|seen| seen.uuid == g.uuid) {
                gpus.push(g.clone());
            }
        }
    }
    let gpu_part = if gpus.is_empty() {
        String::new()
    } else {
        let (driver, cuda) = driver_text(&gpus);
        let fake = results
            .iter()
            .filter_map(|b| b.record.hardware.as_ref())
            .any(|h| h.fake_gpus);
        let fake = if fake { FAKE } else { "" };
        format!(
            "; GPUs: {fake}{}, driver {driver}, CUDA {cuda}",
            gpus_text(&gpus)
        )
    };
    Some(format!("ran on {}{gpu_part}", host.join("; ")))
}
