//! How long batches are expected to run, and runs split by it (docs/interface.md §4
//! `est_time`, §3 `--partition`, `--timings`, §7 `timings.json`).
//!
//! A batch's expected time is what an earlier run recorded for it (a `timings.json`
//! given with `--timings`), else its `est_time`, else the mean of the batches of the
//! same request that have one (1 minute when none has): [`Expected`]. A run split over
//! N runners gives each the batches of one part, the parts balanced by expected work
//! longest first ([`partition`]); every runner computes the same split from the same
//! manifest and files, so no runner needs to hear from another.
//!
//! The rooms, from the bottom up; each imports only those below it:
//!
//! - [`error`]: why a timings file or a partition cannot be used;
//! - [`file`]: `timings.json`, written by every run and read back (from a pull request's
//!   artifact, so bounded and checked);
//! - [`partition`]: `K/N`, and the longest-first split.

pub mod error;
pub mod file;
pub mod partition;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::manifest::Manifest;

pub use file::Recorded;
pub use partition::PartitionSpec;

/// The expected time of a batch nobody estimated, when no batch of the request has one.
pub const UNKNOWN: Duration = Duration::from_secs(60);

/// A batch's name, its time when one is known (and where from), and its slots.
pub type Known = (String, Option<(Duration, Source)>, u32);

/// The slots a batch holds while it runs: its GPUs on each of its nodes (a CPU batch
/// counts as one).
pub fn slots(gpus: u32, nodes: u32) -> u32 {
    gpus.max(1).saturating_mul(nodes.max(1))
}

/// Where a batch's expected time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// An earlier run's `timings.json`.
    Recorded,
    /// Its `est_time`.
    #[serde(rename = "est_time")]
    Estimated,
    /// Neither: the mean of those that have one.
    Default,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Recorded => "recorded",
            Source::Estimated => "est_time",
            Source::Default => "default",
        }
    }
}

/// One batch's expected time, and what it weighs in a split.
#[derive(Debug, Clone, PartialEq)]
pub struct Expectation {
    pub name: String,
    pub time: Duration,
    pub source: Source,
    /// The GPUs it holds while it runs (a CPU batch counts as one slot), across all its
    /// nodes: its expected work is `time × slots`.
    pub slots: u32,
}

impl Expectation {
    /// Its expected work, in slot-seconds (GPU-seconds for a GPU batch).
    pub fn work(&self) -> f64 {
        self.time.as_secs_f64() * f64::from(self.slots)
    }
}

/// The expected times of a request's batches, in the request's order.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    pub batches: Vec<Expectation>,
}

impl Expected {
    /// The expected time of each of `names` (batches of `m`): recorded, else
    /// `est_time`, else the mean of the others.
    pub fn of(m: &Manifest, names: &[String], recorded: &Recorded) -> Expected {
        Expected::from_known(
            names
                .iter()
                .map(|n| {
                    let b = m.batches.get(n);
                    let known = recorded
                        .get(n)
                        .map(|t| (t, Source::Recorded))
                        .or_else(|| b.and_then(|b| b.est_time).map(|e| (e.0, Source::Estimated)));
                    let slots = b.map_or(1, |b| slots(b.gpus, b.nodes));
                    (n.clone(), known, slots)
                })
                .collect(),
        )
    }

    /// The expected times of batches whose time is known or not (`None`: the mean of
    /// the known), each with the slots it holds.
    pub fn from_known(items: Vec<Known>) -> Expected {
        let with: Vec<Duration> = items
            .iter()
            .filter_map(|(_, k, _)| k.map(|(t, _)| t))
            .collect();
        // Whole milliseconds: the same on every runner, whatever the order of addition.
        let default = if with.is_empty() {
            UNKNOWN
        } else {
            let ms: u128 = with.iter().map(Duration::as_millis).sum();
            Duration::from_millis((ms / with.len() as u128) as u64)
        };
        let batches = items
            .into_iter()
            .map(|(name, k, slots)| {
                let (time, source) = k.unwrap_or((default, Source::Default));
                Expectation {
                    name,
                    time,
                    source,
                    slots,
                }
            })
            .collect();
        Expected { batches }
    }

    /// The order a parallel run starts `names` (some of these batches) in: the widest
    /// first (most slots), then the longest expected. In cibox's fair queue a wide
    /// batch at the head waits for GPUs nobody behind it may take, so wide batches go
    /// while the host is empty, and the narrow ones fill around each other; longest
    /// first alone left a host of SGLang's mix 17% longer than the bound, widest first
    /// none (`bench/partition.py`). Ties keep the request's order.
    pub fn start_order(&self, names: &[String]) -> Vec<String> {
        let key = |n: &String| {
            self.batches
                .iter()
                .find(|e| &e.name == n)
                .map_or((0, Duration::ZERO), |e| (e.slots, e.time))
        };
        let mut order = names.to_vec();
        order.sort_by_key(|n| std::cmp::Reverse(key(n)));
        order
    }

    /// Each batch's expected time, by name.
    pub fn times(&self) -> BTreeMap<String, Duration> {
        self.batches
            .iter()
            .map(|e| (e.name.clone(), e.time))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn manifest() -> Manifest {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1h, run: [x]}\nbatches:\n  a: {gpus: 2, est_time: 10m}\n  b: {gpus: 0, est_time: 2m}\n  c: {gpus: 1}\n  d: {gpus: 4, est_time: 1m}\n";
        Manifest::parse(text, std::path::Path::new("cibox.yaml")).unwrap()
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_recorded_time_wins_over_est_time_and_the_unknown_take_the_mean() {
        let m = manifest();
        let recorded = Recorded::from_times([("b".to_string(), Duration::from_secs(300))]);
        let e = Expected::of(&m, &names(&["a", "b", "c", "d"]), &recorded);
        let got: Vec<(&str, u64, Source, u32)> = e
            .batches
            .iter()
            .map(|x| (x.name.as_str(), x.time.as_secs(), x.source, x.slots))
            .collect();
        assert_eq!(
            got,
            [
                ("a", 600, Source::Estimated, 2),
                ("b", 300, Source::Recorded, 1),
                // (600 + 300 + 60) / 3
                ("c", 320, Source::Default, 1),
                ("d", 60, Source::Estimated, 4),
            ]
        );
        assert_eq!(e.batches[0].work(), 1200.0);
        // Nobody estimated: a minute each.
        let none = Expected::of(&m, &names(&["c"]), &Recorded::default());
        assert_eq!(none.batches[0].time, UNKNOWN);
    }
}
