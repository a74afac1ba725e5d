//! Batches in disposable containers on the real engine, one module per subject; the
//! helpers that write a batch's manifest entry are here.

mod artifacts;
mod changed;
mod devices;
mod endings;
mod gpus;
mod mounts;
mod reports;
mod running;
mod shaped;
mod verdicts;
mod work;

use crate::common::*;

fn yaml_list(steps: &[&str]) -> String {
    let quoted: Vec<String> = steps
        .iter()
        .map(|s| serde_json::to_string(s).unwrap())
        .collect();
    format!("[{}]", quoted.join(", "))
}

fn batch(name: &str, gpus: u32, timeout: &str, steps: &[&str], extra: &str) -> String {
    format!(
        "  {name}:\n    gpus: {gpus}\n    timeout: {timeout}\n    run: {}\n{extra}",
        yaml_list(steps)
    )
}

/// A project with two CPU batches, `unit` and `second`, that each pass one test.
fn two_passing_batches() -> BusyboxProject {
    busybox_project(
        &format!(
            "{}{}",
            batch("unit", 0, "1m", &[JUNIT_OK], ""),
            batch("second", 0, "1m", &[JUNIT_OK], "")
        ),
        "",
    )
}
