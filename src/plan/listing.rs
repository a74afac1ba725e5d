//! `cibox batch list`: the manifest's batches (name, GPUs, timeout, expected time when
//! any is known, description) and layers; with names or a layer, only those batches
//! and no layers; with a partition, the part's batches and every part's expected time.

use serde_json::{Value, json};

use crate::console::Table;
use crate::manifest::{Batch, Layer, Manifest};
use crate::plan::error::PlanError;
use crate::plan::run_plan::{RunRequest, named_batches, selected};
use crate::timing::{Expected, PartitionSpec, Recorded, partition};
use crate::units::human;

/// What a list shows.
pub struct Listing<'a> {
    manifest: &'a Manifest,
    /// The batches shown, in the manifest's order.
    shown: Vec<(&'a String, &'a Batch)>,
    expected: Expected,
    /// The partition asked for and every part.
    parts: Option<(PartitionSpec, Vec<partition::Part>)>,
    /// The layers, when neither names nor a layer narrow the list.
    layers: Vec<(&'a String, &'a Layer)>,
    /// Whether recorded timings were given.
    recorded: bool,
}

/// The listing of `names` (or of `layer`'s batches, or of all), of one part of them.
pub fn list<'a>(
    m: &'a Manifest,
    names: &[String],
    layer: Option<&str>,
    partition: Option<PartitionSpec>,
    recorded: &Recorded,
) -> Result<Listing<'a>, PlanError> {
    let selected: Vec<String> = match (layer, names.is_empty()) {
        (None, true) => m.batches.keys().cloned().collect(),
        (None, false) => named_batches(m, names)?,
        (Some(layer), _) => {
            let request = RunRequest {
                names: names.to_vec(),
                layer: Some(layer.to_string()),
                ..RunRequest::default()
            };
            selected(m, &request)?
        }
    };
    let expected = Expected::of(m, &selected, recorded);
    // Split as a run splits: a sharded batch's shards are units of their own, and a
    // part shows each batch it holds a shard of.
    let parts = partition.map(|p| {
        let units = super::run_plan::units(m, expected.clone());
        (p, partition::split(&units, p.count))
    });
    let shown_names: Vec<String> = match &parts {
        Some((p, parts)) => super::run_plan::batches_of(m, &parts[p.index as usize - 1].batches),
        None => selected,
    };
    let shown = shown_names
        .iter()
        .filter_map(|n| m.batches.get_key_value(n))
        .collect();
    let layers = if names.is_empty() && layer.is_none() {
        m.layers.iter().collect()
    } else {
        Vec::new()
    };
    Ok(Listing {
        manifest: m,
        shown,
        expected,
        parts,
        layers,
        recorded: !recorded.files.is_empty(),
    })
}

impl Listing<'_> {
    fn expect(&self, name: &str) -> Option<&crate::timing::Expectation> {
        self.expected.batches.iter().find(|e| e.name == name)
    }

    /// The listing as `--json` prints it.
    pub fn json(&self) -> Value {
        let batches: Vec<_> = self
            .shown
            .iter()
            .map(|(name, b)| {
                let e = self.expect(name);
                json!({
                    "name": name,
                    "gpus": b.gpus,
                    "shards": b.shards,
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
        let layers: Vec<_> = self
            .layers
            .iter()
            .map(|(name, l)| {
                json!({"name": name, "fast": l.fast, "fail_fast": l.fail_fast, "batches": l.batches, "description": l.description})
            })
            .collect();
        let mut out =
            json!({"project": self.manifest.project, "batches": batches, "layers": layers});
        if let Some((p, parts)) = &self.parts {
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
        out
    }

    /// The listing as tables: batches, then parts, then layers.
    pub fn text(&self) -> String {
        let mut out = self.batch_table();
        if let Some((p, parts)) = &self.parts {
            out.push('\n');
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
            out.push_str(&t.render());
        }
        if !self.layers.is_empty() {
            out.push('\n');
            let mut t = Table::new(&["LAYER", "FAST", "BATCHES"]);
            for (name, l) in &self.layers {
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
            out.push_str(&t.render());
        }
        out
    }

    fn batch_table(&self) -> String {
        // The expected time is shown where one is known (or asked for through a split).
        let with_expected = self.parts.is_some()
            || self.recorded
            || self.shown.iter().any(|(_, b)| b.est_time.is_some());
        let mut header = vec!["BATCH", "GPUS", "TIMEOUT"];
        if with_expected {
            header.push("EXPECTED");
        }
        header.push("DESCRIPTION");
        let mut t = Table::new(&header);
        for (name, b) in &self.shown {
            let mut row = vec![
                name.to_string(),
                match (b.gpu_model.as_ref().filter(|_| b.gpus > 0), b.shards) {
                    (Some(glob), 1) => format!("{} ({})", b.gpus, crate::util::escape(glob)),
                    (None, 1) => b.gpus.to_string(),
                    // Each shard leases its own.
                    (Some(glob), n) => {
                        format!("{} ({}) × {n} shards", b.gpus, crate::util::escape(glob))
                    }
                    (None, n) => format!("{} × {n} shards", b.gpus),
                },
                b.timeout.to_string(),
            ];
            if with_expected {
                row.push(self.expect(name).map_or_else(String::new, |e| {
                    format!("{} ({})", human(e.time), e.source.as_str())
                }));
            }
            row.push(b.description.clone().unwrap_or_default());
            t.row(row);
        }
        t.render()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An example project's manifest (layers, a test list's family, descriptions).
    fn example(name: &str) -> Manifest {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(name)
            .join("cibox.yaml");
        Manifest::load(&path).unwrap()
    }

    /// The whole of what `batch list` prints, as tables and as JSON (the same bytes
    /// as before it moved out of `cmd/batch.rs`).
    #[test]
    fn a_whole_list_as_tables_and_json() {
        for name in ["demo", "ml-project", "slime-like"] {
            let m = example(name);
            let all = list(&m, &[], None, None, &Recorded::default()).unwrap();
            insta::assert_snapshot!(format!("{name}_text"), all.text());
            let json = serde_json::to_string_pretty(&all.json()).unwrap();
            insta::assert_snapshot!(format!("{name}_json"), json);
            let part: PartitionSpec = "2/3".parse().unwrap();
            let part = list(&m, &[], None, Some(part), &Recorded::default()).unwrap();
            insta::assert_snapshot!(format!("{name}_part_2_of_3"), part.text());
        }
    }

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
