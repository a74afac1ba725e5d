//! `cibox batch …`.

use serde_json::json;

use super::context::Context;
use crate::cli::{BatchListArgs, RunOptions};
use crate::console::{self, Table};
use crate::engine::Engine;
use crate::error::Result;
use crate::exit;
use crate::lockdir::LockDir;
use crate::plan::{self};
use crate::report::reporter::terminal::print_sweep_notes;
use crate::run::sweep;
use crate::timing::{Expected, PartitionSpec, Recorded, partition};
use crate::units::human;

/// `cibox batch list [NAME…] [--layer L] [--partition K/N] [--timings PATH]…`: batches
/// (name, GPUs, timeout, expected time when any is known, description) and layers;
/// with names or a layer, only those batches, no layers; with a partition, the part's
/// batches and every part's expected time.
pub fn list(ctx: &Context, args: &BatchListArgs) -> Result<u8> {
    let m = ctx.manifest()?;
    let partition = args
        .partition
        .as_deref()
        .map(str::parse::<PartitionSpec>)
        .transpose()?;
    let recorded = Recorded::read(&args.timings)?;
    let selected: Vec<String> = match (&args.layer, args.names.is_empty()) {
        (None, true) => m.batches.keys().cloned().collect(),
        (None, false) => plan::named_batches(&m, &args.names)?,
        (Some(layer), _) => {
            let request = plan::RunRequest {
                names: args.names.clone(),
                layer: Some(layer.clone()),
                ..plan::RunRequest::default()
            };
            plan::selected(&m, &request)?
        }
    };
    let expected = Expected::of(&m, &selected, &recorded);
    let parts = partition.map(|p| (p, partition::split(&expected, p.count)));
    let shown_names: Vec<String> = match &parts {
        Some((p, parts)) => parts[p.index as usize - 1].batches.clone(),
        None => selected.clone(),
    };
    let shown: Vec<(&String, &crate::manifest::Batch)> = shown_names
        .iter()
        .filter_map(|n| m.batches.get_key_value(n))
        .collect();
    let expect = |name: &str| expected.batches.iter().find(|e| e.name == name);
    let layers = if args.names.is_empty() && args.layer.is_none() {
        m.layers.iter().collect()
    } else {
        Vec::new()
    };
    if ctx.json {
        let batches: Vec<_> = shown
            .iter()
            .map(|(name, b)| {
                let e = expect(name);
                json!({
                    "name": name,
                    "gpus": b.gpus,
                    "gpu_model": b.gpu_model.as_ref().filter(|_| b.gpus > 0),
                    "timeout": b.timeout.to_string(),
                    "timeout_s": b.timeout.0.as_secs(),
                    "expected_s": e.map(|e| e.time.as_secs_f64()),
                    "expected_from": e.map(|e| e.source),
                    "retries": b.retries.count,
                    "soft_fail": b.soft_fail,
                    "description": b.description,
                    "allow_empty": b.allow_empty,
                    "family": b.family,
                    "test_file": b.family.as_ref().and_then(|_| b.tests.first()),
                })
            })
            .collect();
        let layers: Vec<_> = layers
            .iter()
            .map(|(name, l)| {
                json!({"name": name, "fast": l.fast, "fail_fast": l.fail_fast, "batches": l.batches, "description": l.description})
            })
            .collect();
        let mut out = json!({"project": m.project, "batches": batches, "layers": layers});
        if let Some((p, parts)) = &parts {
            out["partition"] = json!(p.to_string());
            out["parts"] = parts
                .iter()
                .map(|part| {
                    json!({
                        "part": part.index,
                        "batches": part.batches,
                        "serial_s": part.serial.as_secs_f64(),
                        "work_s": part.work,
                    })
                })
                .collect();
        }
        console::json(&out);
        return Ok(exit::SUCCESS);
    }
    // The expected time is shown where one is known (or asked for through a split).
    let with_expected = parts.is_some()
        || !recorded.files.is_empty()
        || shown.iter().any(|(_, b)| b.est_time.is_some());
    let mut header = vec!["BATCH", "GPUS", "TIMEOUT"];
    if with_expected {
        header.push("EXPECTED");
    }
    header.push("DESCRIPTION");
    let mut t = Table::new(&header);
    for (name, b) in &shown {
        let mut row = vec![
            name.to_string(),
            match b.gpu_model.as_ref().filter(|_| b.gpus > 0) {
                Some(glob) => format!("{} ({})", b.gpus, crate::util::escape(glob)),
                None => b.gpus.to_string(),
            },
            b.timeout.to_string(),
        ];
        if with_expected {
            row.push(expect(name).map_or_else(String::new, |e| {
                format!("{} ({})", human(e.time), e.source.as_str())
            }));
        }
        row.push(b.description.clone().unwrap_or_default());
        t.row(row);
    }
    print!("{}", t.render());
    if let Some((p, parts)) = &parts {
        println!();
        let mut t = Table::new(&["PART", "BATCHES", "SERIAL", "GPU TIME"]);
        for part in parts {
            let mark = if part.index == p.index { " <" } else { "" };
            t.row(vec![
                format!("{}/{}{mark}", part.index, p.count),
                part.batches.len().to_string(),
                human(part.serial),
                human(std::time::Duration::from_secs_f64(part.work)),
            ]);
        }
        print!("{}", t.render());
    }
    if !layers.is_empty() {
        println!();
        let mut t = Table::new(&["LAYER", "FAST", "BATCHES"]);
        for (name, l) in &layers {
            let batches = if l.all {
                format!("all ({})", few(&l.batches))
            } else {
                few(&l.batches)
            };
            t.row(vec![
                name.to_string(),
                if l.fast { "yes" } else { "no" }.into(),
                batches,
            ]);
        }
        print!("{}", t.render());
    }
    Ok(exit::SUCCESS)
}

/// A layer's batches for its row: all of them when they fit a line, else the first
/// that fit and how many there are (`--json` lists them all).
fn few(batches: &[String]) -> String {
    const ROOM: usize = 72;
    let all = batches.join(", ");
    if all.chars().count() <= ROOM {
        return all;
    }
    let mut shown = String::new();
    for (n, b) in batches.iter().enumerate() {
        if shown.chars().count() + b.chars().count() + 2 > ROOM {
            break;
        }
        if n > 0 {
            shown.push_str(", ");
        }
        shown.push_str(b);
    }
    format!("{shown}, … ({} in all; --json lists them)", batches.len())
}

/// `cibox batch run` and `cibox layer run`.
pub fn run(ctx: &Context, names: &[String], layer: Option<&str>, opts: &RunOptions) -> Result<u8> {
    super::run::run_manifest(ctx, ctx.manifest()?, names, layer, opts)
}

/// `cibox cleanup [--scope S]`: the containers of dead runs of this host, of scope S
/// or of every scope.
pub fn cleanup(ctx: &Context, scope: Option<&str>) -> Result<u8> {
    // The project narrows what is touched when there is a manifest; without one, every
    // dead run's cibox container goes.
    let (project, gpu) = match ctx.manifest() {
        Ok(m) => (Some(m.project), m.gpu),
        Err(e) if super::context::no_manifest(&e) => (None, ctx.gpu_without_manifest()?),
        Err(e) => return Err(e),
    };
    // Where the runs' locks are: without it no container's run can be judged dead.
    let lock_dir = LockDir::open(&gpu.lock_dir, gpu.allow_network_lock_dir)?;
    let engine = Engine::connect()?;
    let swept = sweep(
        &engine,
        project.as_deref(),
        scope,
        &lock_dir,
        &crate::util::host_name(),
    )?;
    print_sweep_notes(&swept);
    if ctx.json {
        let elsewhere: Vec<_> = swept
            .elsewhere
            .iter()
            .map(|(name, host)| json!({"container": name, "host": host}))
            .collect();
        console::json(&json!({
            "scope": scope,
            "removed": swept.removed.len(),
            "live": swept.live.len(),
            "elsewhere": elsewhere,
        }));
    } else {
        let which = match scope {
            Some(s) => format!("scope {s}"),
            None => "dead runs in every scope".to_string(),
        };
        let mut line = format!("removed {} container(s) of {which}", swept.removed.len());
        if !swept.live.is_empty() {
            line.push_str(&format!(
                "; left {} of runs still alive (they remove their own)",
                swept.live.len()
            ));
        }
        println!("{line}");
    }
    Ok(exit::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_layer_is_shown_by_its_first_batches_and_how_many() {
        let few_ones: Vec<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        assert_eq!(few(&few_ones), "a, b");
        let many: Vec<String> = (0..272).map(|i| format!("test_{i:03}")).collect();
        let shown = few(&many);
        assert!(shown.starts_with("test_000, test_001, "), "{shown}");
        assert!(
            shown.ends_with(", … (272 in all; --json lists them)"),
            "{shown}"
        );
        assert!(shown.chars().count() < 120, "{shown}");
    }
}
