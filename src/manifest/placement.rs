//! Where and how a batch's CI step runs, beside what it runs: its working folder
//! (`working_dir`) and the queue or runner label it goes to when the GPU model is not
//! enough (`queue`); a layer's warm-up once per part (`warmup`) and the time budget
//! that sizes its parts (`budget`). (A batch's `HOME` is checked with its `env`, in
//! `values`; `changes` with `changed:`.)

use std::time::Duration;

use indexmap::IndexMap;

use crate::units::Span;

use super::check::Checker;
use super::error::ManifestError;
use super::types::{Batch, LayerShape};

/// Where a batch's source is in its container: a relative `working_dir` is under it.
pub const SOURCE_DIR: &str = "/work";

/// The longest `working_dir` or `HOME` (Linux's `PATH_MAX`).
const MAX_PATH: usize = 4096;

/// The longest queue name: a Buildkite agent tag or a GitHub runner label.
const MAX_QUEUE: usize = 100;

/// A batch's `working_dir`: relative (under the source, [`SOURCE_DIR`]) or absolute in
/// its container; no `..`, no control character. Gives the absolute folder, without a
/// trailing `/` (`/` itself stays).
pub(super) fn working_dir(
    check: &Checker<'_>,
    at: &[&str],
    raw: Option<String>,
) -> Result<Option<String>, ManifestError> {
    let Some(dir) = raw else { return Ok(None) };
    let bad = |why: &str| Err(check.at(at, format!("`{}`: {why}", dir.escape_debug())));
    if dir.is_empty() {
        return bad("is empty; leave `working_dir` out to run in the source's folder");
    }
    if dir.len() > MAX_PATH {
        return bad("is longer than 4096 bytes");
    }
    if dir.chars().any(char::is_control) {
        return bad("holds a control character (a newline?), which no step's folder may");
    }
    if dir.split('/').any(|c| c == "..") {
        return bad("holds `..`: name the folder itself");
    }
    let full = if dir.starts_with('/') {
        dir.clone()
    } else {
        format!("{SOURCE_DIR}/{dir}")
    };
    let mut parts: Vec<&str> = full
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    parts.insert(0, "");
    let joined = parts.join("/");
    Ok(Some(if joined.is_empty() {
        "/".to_string()
    } else {
        joined
    }))
}

/// A batch's `queue`: a Buildkite agent queue or a GitHub runner label, for a template
/// to send its step to; letters, digits and `_ . - :`.
pub(super) fn queue(
    check: &Checker<'_>,
    at: &[&str],
    raw: Option<String>,
) -> Result<Option<String>, ManifestError> {
    let Some(q) = raw else { return Ok(None) };
    let ok = !q.is_empty()
        && q.len() <= MAX_QUEUE
        && q.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && q.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':'));
    if !ok {
        return Err(check.at(
            at,
            format!(
                "`{}` is not a queue name: 1 to {MAX_QUEUE} letters, digits, `_`, `.`, `-` and `:`, starting with a letter or digit (it reaches the pipeline's `agents` or a job's `runs-on`)",
                q.escape_debug()
            ),
        ));
    }
    Ok(Some(q))
}

/// The most shards a batch may have: GitHub's limit of jobs one matrix makes in a
/// workflow run ("A matrix can generate a maximum of 256 jobs per workflow run",
/// docs.github.com, *Running variations of jobs in a workflow*), so a sharded batch
/// renders as one matrix on both CIs. A host runs no more of them at once than its GPUs
/// (and its `--wait`) allow.
pub const MAX_SHARDS: i64 = 256;

/// The name a run gives shard `index` (from 0) of a batch of `count` shards, for the
/// split, the events and the shard's own record: `B[K/N]`, K counted from 1 as
/// Buildkite's labels count (`%N`). No batch name holds `[`, so none can take it.
pub fn shard_unit(batch: &str, index: u32, count: u32) -> String {
    format!("{batch}[{}/{count}]", index + 1)
}

/// A batch's `shards`: 1 to [`MAX_SHARDS`], and 1 for a batch on several Slurm nodes
/// (its ranks are one job; shards of it would be jobs of jobs).
pub(super) fn shards(
    check: &Checker<'_>,
    at: &[&str],
    raw: Option<i64>,
    nodes: u32,
) -> Result<u32, ManifestError> {
    let Some(n) = raw else { return Ok(1) };
    if !(1..=MAX_SHARDS).contains(&n) {
        return Err(check.at(
            at,
            format!("must be 1 to {MAX_SHARDS} (GitHub's most jobs of one matrix), got {n}"),
        ));
    }
    if n > 1 && nodes > 1 {
        return Err(check.at(
            at,
            format!("a batch on {nodes} nodes cannot also be split into {n} shards: its ranks are one Slurm job; shard a batch of one node"),
        ));
    }
    Ok(n as u32)
}

/// A layer's `warmup` and `budget`. The warm-up is a defined batch, not one of the
/// layer's own (it runs before them, in each part); the budget is more than the
/// warm-up's expected time over 3/4.
pub(super) fn layer_shape(
    check: &Checker<'_>,
    layer: &str,
    batches: &IndexMap<String, Batch>,
    members: &mut Vec<String>,
    all: bool,
    warmup: Option<String>,
    budget: Option<Span>,
) -> Result<LayerShape, ManifestError> {
    if let Some(w) = &warmup {
        let Some(b) = batches.get(w) else {
            return Err(check.at(
                &["layers", layer, "warmup"],
                format!("batch `{w}` is not defined"),
            ));
        };
        if members.contains(w) {
            if !all {
                return Err(check.at(
                    &["layers", layer, "warmup"],
                    format!("batch `{w}` is also one of the layer's batches: the warm-up runs before them, once in each part; list it in one place"),
                ));
            }
            // `all` stands for every batch, the warm-up too: it runs as the warm-up.
            members.retain(|m| m != w);
        }
        if members.is_empty() {
            return Err(check.at(
                &["layers", layer, "batches"],
                "lists no batch besides its warm-up",
            ));
        }
        if b.shards > 1 {
            return Err(check.at(
                &["layers", layer, "warmup"],
                format!("batch `{w}` has {} shards: a warm-up runs once, alone, before each part; shard the layer's batches instead", b.shards),
            ));
        }
        if b.manual {
            return Err(check.at(
                &["layers", layer, "warmup"],
                format!("batch `{w}` is `manual`: a warm-up runs before every part, with no one to start it"),
            ));
        }
    }
    if let Some(span) = budget {
        let usable = span.0.mul_f64(USABLE);
        let warm = warmup
            .as_ref()
            .and_then(|w| batches[w].est_time)
            .map_or(Duration::ZERO, |e| e.0);
        if span.0.is_zero() || warm >= usable {
            return Err(check.at(
                &["layers", layer, "budget"],
                format!(
                    "must leave room for the tests: 3/4 of it ({}) is the time a part is sized to, and the warm-up is expected to take {}",
                    Span(usable),
                    Span(warm)
                ),
            ));
        }
    }
    Ok(LayerShape { warmup, budget })
}

/// The share of a budget a part is sized to: the inverse of the split's worst case
/// (longest first is within 4/3 of the best), so the most uneven part still fits
/// (SGLang's `scripts/ci/utils/compute_partitions.py:70-74`).
pub const USABLE: f64 = 0.75;

/// How many parts a budget asks for: `ceil(work / (3/4 × budget − warm-up))`, at least
/// 1 and at most one per batch (`work` is the batches' expected seconds, warm-up apart).
pub fn parts_for_budget(work: f64, budget: Duration, warmup: Duration, batches: usize) -> u32 {
    let room = budget.mul_f64(USABLE).saturating_sub(warmup).as_secs_f64();
    if room <= 0.0 || batches == 0 {
        return 1;
    }
    let parts = (work / room).ceil();
    (parts.max(1.0) as usize)
        .min(batches.max(1))
        .min(u32::MAX as usize) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::tests::parse;

    const TEXT: &str = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1h, run: [x], gpus: 1}\nbatches:\n  warm: {est_time: 5m}\n  a: {est_time: 10m, working_dir: tests, queue: b200-k8s}\n  b: {est_time: 0s, working_dir: /vllm-workspace/, manual: true, env: {HOME: /home/ci}}\n  c: {est_time: 20m}\nlayers:\n  stage: {batches: [a, b, c], warmup: warm, budget: 30m}\n  every: {batches: all, warmup: warm}\n";

    #[test]
    fn working_dir_queue_manual_and_home_are_read() {
        let m = parse(TEXT).unwrap();
        let (a, b) = (&m.batches["a"], &m.batches["b"]);
        assert_eq!(a.working_dir.as_deref(), Some("/work/tests"));
        assert_eq!(b.working_dir.as_deref(), Some("/vllm-workspace"));
        assert_eq!(a.queue.as_deref(), Some("b200-k8s"));
        assert!(b.manual && !a.manual);
        assert_eq!(b.env["HOME"], "/home/ci");
        let stage = &m.layers["stage"];
        assert_eq!(stage.shape.warmup.as_deref(), Some("warm"));
        assert_eq!(
            stage.shape.budget.map(|s| s.to_string()).as_deref(),
            Some("30m")
        );
        // `all` stands for the warm-up too: it runs as the warm-up, not twice.
        assert_eq!(m.layers["every"].batches, ["a", "b", "c"]);
    }

    #[test]
    fn bad_shapes_are_refused_at_their_key() {
        crate::manifest::tests::assert_refused(
            TEXT,
            &[
                (
                    "working_dir: tests",
                    "working_dir: ../etc",
                    "batches.a.working_dir: `../etc`: holds `..`",
                ),
                (
                    "working_dir: tests",
                    "working_dir: \"a\\nb\"",
                    "batches.a.working_dir: `a\\nb`: holds a control character",
                ),
                (
                    "working_dir: tests",
                    "working_dir: \"\"",
                    "batches.a.working_dir: ``: is empty",
                ),
                (
                    "queue: b200-k8s",
                    "queue: \"b200 k8s\"",
                    "batches.a.queue: `b200 k8s` is not a queue name",
                ),
                ("queue: b200-k8s", "queue: \"-x\"", "is not a queue name"),
                ("manual: true", "manual: maybe", "manual"),
                (
                    "HOME: /home/ci",
                    "HOME: home",
                    "batches.b.env.HOME: `home` is not an absolute path",
                ),
                (
                    "warmup: warm, budget",
                    "warmup: wram, budget",
                    "layers.stage.warmup: batch `wram` is not defined",
                ),
                (
                    "warmup: warm, budget",
                    "warmup: a, budget",
                    "layers.stage.warmup: batch `a` is also one of the layer's batches",
                ),
                (
                    "budget: 30m",
                    "budget: 6m",
                    "layers.stage.budget: must leave room for the tests: 3/4 of it (270s) is the time a part is sized to, and the warm-up is expected to take 5m",
                ),
                (
                    "budget: 30m",
                    "budget: 0s",
                    "layers.stage.budget: must leave room",
                ),
                (
                    "warm: {est_time: 5m}",
                    "warm: {est_time: 5m, manual: true}",
                    "layers.stage.warmup: batch `warm` is `manual`",
                ),
            ],
        );
    }

    /// vLLM's `kernels.yaml:93` (`parallelism: 5`): a batch on 5 containers; hostile
    /// counts refused at the key with one line.
    #[test]
    fn shards_are_read_and_hostile_counts_refused_at_their_key() {
        let text = TEXT.replace("c: {est_time: 20m}", "c: {est_time: 20m, shards: 5}");
        let m = parse(&text).unwrap();
        assert_eq!((m.batches["c"].shards, m.batches["a"].shards), (5, 1));
        crate::manifest::tests::assert_refused(
            &text,
            &[
                (
                    "shards: 5",
                    "shards: 0",
                    "batches.c.shards: must be 1 to 256",
                ),
                (
                    "shards: 5",
                    "shards: -3",
                    "batches.c.shards: must be 1 to 256",
                ),
                (
                    "shards: 5",
                    "shards: 100000000000000000",
                    "batches.c.shards: must be 1 to 256 (GitHub's most jobs of one matrix), got 100000000000000000",
                ),
                ("shards: 5", "shards: 2.5", "batches.c.shards"),
                ("shards: 5", "shards: four", "batches.c.shards"),
                ("shards: 5", "shards: \"4\"", "batches.c.shards"),
                (
                    "shards: 5",
                    "shards: 5, nodes: 2, container: {network: host}",
                    "batches.c.shards: a batch on 2 nodes cannot also be split into 5 shards",
                ),
                (
                    "warm: {est_time: 5m}",
                    "warm: {est_time: 5m, shards: 2}",
                    "layers.stage.warmup: batch `warm` has 2 shards",
                ),
            ],
        );
        for bad in ["shards: 0", "shards: 2.5", "shards: 1000"] {
            let err = parse(&text.replace("shards: 5", bad)).unwrap_err();
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.starts_with("cibox.yaml:"), "{err}");
        }
    }

    #[test]
    fn shards_count_toward_the_manifests_batches() {
        // 40 batches of 256 shards: 10,240 containers, past 10,000.
        let mut text = String::from(
            "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1h, run: [x], gpus: 1, shards: 256}\nbatches:\n",
        );
        for i in 0..40 {
            text.push_str(&format!("  b{i}: {{}}\n"));
        }
        let err = parse(&text).unwrap_err();
        assert!(
            err.contains(
                "batches.b39.shards: brings the manifest's batches, each shard counted, past 10000"
            ),
            "{err}"
        );
        assert!(parse(&text.replace("shards: 256", "shards: 250")).is_ok());
    }

    #[test]
    fn the_hosts_home_is_not_passed() {
        let text = TEXT.replace("defaults: {", "container: {pass_env: [HOME]}\ndefaults: {");
        let err = parse(&text).unwrap_err();
        assert!(
            err.contains("container.pass_env.0: `HOME` is the host's home folder"),
            "{err}"
        );
    }

    #[test]
    fn a_budget_sizes_the_parts_as_sglang_does() {
        let min = |m: u64| Duration::from_secs(m * 60);
        // SGLang: ceil(total / (0.75 × budget − bias)); 100 minutes of tests in parts of
        // 30 × 0.75 − 2.5 = 20 minutes: 5 parts.
        assert_eq!(
            parts_for_budget(6000.0, min(30), Duration::from_secs(150), 50),
            5
        );
        assert_eq!(
            parts_for_budget(6001.0, min(30), Duration::from_secs(150), 50),
            6
        );
        // At most one per batch, at least one.
        assert_eq!(parts_for_budget(6000.0, min(30), Duration::ZERO, 3), 3);
        assert_eq!(parts_for_budget(0.0, min(30), Duration::ZERO, 3), 1);
    }
}
