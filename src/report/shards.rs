//! A sharded batch's shards made one batch again: their results merged into the
//! batch's ([`merge`]), so that every report (the terminal's summary, `--json`, the
//! merged JUnit, `summary.md`, GitHub's and Buildkite's summaries, `timings.json`)
//! shows one batch, failed when a shard failed, naming the shard.

use std::path::Path;

use crate::exit;
use crate::nofollow::Folder;
use crate::report::outcome::BatchResult;
use crate::report::record::{ShardEnd, ShardOf, Status};

/// `results` with each sharded batch's shards (records with a `shard`) replaced by one
/// result, at the place of its first shard; its `result.json` written into its folder
/// (`reports`, held open, is the reports folder at `root`). The rest are untouched.
pub fn merge(
    results: Vec<BatchResult>,
    reports: &Folder,
    root: &Path,
) -> std::io::Result<Vec<BatchResult>> {
    let mut out: Vec<BatchResult> = Vec::with_capacity(results.len());
    let mut groups: Vec<(String, Vec<BatchResult>)> = Vec::new();
    let mut order: Vec<Option<usize>> = Vec::new();
    for r in results {
        match r.record.shard.clone() {
            None => {
                order.push(None);
                out.push(r);
            }
            Some(s) => match groups.iter_mut().position(|(b, _)| *b == s.batch) {
                Some(g) => groups[g].1.push(r),
                None => {
                    order.push(Some(groups.len()));
                    groups.push((s.batch.clone(), vec![r]));
                }
            },
        }
    }
    let mut merged: Vec<Option<BatchResult>> = Vec::with_capacity(groups.len());
    for (batch, shards) in groups {
        let one = one_batch(&batch, shards, root);
        let dir = reports.make_path(Path::new(&batch), 0o755)?;
        one.record.write(&dir)?;
        merged.push(Some(one));
    }
    let mut plain = out.into_iter();
    Ok(order
        .into_iter()
        .filter_map(|o| match o {
            None => plain.next(),
            Some(g) => merged[g].take(),
        })
        .collect())
}

/// What a shard's record says of it, as the batch's record lists it.
fn shard_end(r: &BatchResult, s: &ShardOf, batch_dir: &Path) -> ShardEnd {
    ShardEnd {
        index: s.index,
        status: r.record.status,
        exit_code: r.record.exit_code,
        message: r.record.message.clone(),
        gpus: r.record.gpus.iter().map(|g| g.uuid.clone()).collect(),
        container: r.record.container.clone(),
        duration_s: r.record.duration_s,
        result: r
            .record_path
            .strip_prefix(batch_dir)
            .unwrap_or(&r.record_path)
            .display()
            .to_string(),
    }
}

/// How the batch ended: passed when every shard passed; else as its most severe shard
/// (`not_run` only when no shard that ran failed).
fn worst(shards: &[BatchResult]) -> Option<&BatchResult> {
    let failed = shards
        .iter()
        .filter(|r| !matches!(r.record.status, Status::Passed | Status::NotRun));
    let code = exit::most_severe(failed.clone().map(|r| r.record.exit_code));
    failed
        .clone()
        .find(|r| r.record.exit_code == code)
        .or_else(|| shards.iter().find(|r| r.record.status == Status::NotRun))
}

/// One shard in a line: `shard 2/4 failed (shard-2/): MESSAGE`, with the folder its
/// `log.txt` is in.
fn said(r: &BatchResult, s: &ShardOf) -> String {
    format!(
        "shard {k}/{} {} (shard-{k}/){}",
        s.count,
        r.record.status.as_str(),
        r.record
            .message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default(),
        k = s.index + 1,
    )
}

/// The batch's result from its shards' (in any order; at least one).
fn one_batch(batch: &str, mut shards: Vec<BatchResult>, root: &Path) -> BatchResult {
    shards.sort_by_key(|r| r.record.shard.as_ref().map_or(0, |s| s.index));
    let batch_dir = root.join(batch);
    let of = |r: &BatchResult| r.record.shard.clone().expect("a shard's record");
    let mut record = shards[0].record.clone();
    record.batch = batch.to_string();
    record.shard = None;
    record.shards = shards
        .iter()
        .map(|r| shard_end(r, &of(r), &batch_dir))
        .collect();
    if let Some(w) = worst(&shards) {
        record.status = w.record.status;
        record.exit_code = w.record.exit_code;
        record.container_exit_code = w.record.container_exit_code;
        let not_passed: Vec<String> = shards
            .iter()
            .filter(|r| r.record.status != Status::Passed)
            .map(|r| said(r, &of(r)))
            .collect();
        record.message = Some(format!(
            "{} of {} shards did not pass: {}",
            not_passed.len(),
            shards.len(),
            not_passed.join("; ")
        ));
    }
    let all = || shards.iter().map(|r| &r.record);
    record.gpus = all().flat_map(|r| r.gpus.clone()).collect();
    record.container = all()
        .map(|r| r.container.as_str())
        .collect::<Vec<_>>()
        .join(",");
    // By the instants they name, not their text: a time cibox did not write (a
    // record read back) need not have its width.
    let at = |t: &String| crate::units::parse_rfc3339_ms(t);
    record.started_at = all()
        .map(|r| r.started_at.clone())
        .min_by_key(|t| at(t).unwrap_or(u64::MAX))
        .unwrap_or_default();
    record.finished_at = all()
        .map(|r| r.finished_at.clone())
        .max_by_key(|t| at(t).unwrap_or(0))
        .unwrap_or_default();
    record.duration_s = all().map(|r| r.duration_s).fold(0.0, f64::max);
    record.ran_s = all().map(|r| r.ran_s).sum();
    record.gpu_wait_s = all().map(|r| r.gpu_wait_s).fold(0.0, f64::max);
    record.output_bytes = all().map(|r| r.output_bytes).sum();
    record.cases_left_out = all().map(|r| r.cases_left_out).sum();
    record.failed_tests = all().flat_map(|r| r.failed_tests.clone()).collect();
    record.attempts = all().map(|r| r.attempts).max().unwrap_or(1);
    record.flaky = record.status == Status::Passed && all().any(|r| r.flaky);
    record.earlier_attempts = all().flat_map(|r| r.earlier_attempts.clone()).collect();
    record.caches = all().flat_map(|r| r.caches.clone()).collect();
    if let Some(hw) = record.hardware.as_mut() {
        hw.gpus = all()
            .filter_map(|r| r.hardware.as_ref())
            .flat_map(|h| h.gpus.clone())
            .collect();
    }
    let cases: Vec<_> = shards.iter().flat_map(|r| r.cases.clone()).collect();
    let mut tests = crate::report::junit::Totals::default();
    for t in all().map(|r| &r.tests) {
        tests.total += t.total;
        tests.passed += t.passed;
        tests.failed += t.failed;
        tests.errors += t.errors;
        tests.skipped += t.skipped;
        for (why, n) in &t.skipped_reasons {
            *tests.skipped_reasons.entry(why.clone()).or_default() += n;
        }
    }
    record.tests = tests;
    BatchResult {
        record_path: batch_dir.join("result.json"),
        container_left: shards.iter().any(|r| r.container_left),
        earlier: shards.iter().flat_map(|r| r.earlier.clone()).collect(),
        cases,
        record,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::reporter::sample;

    #[test]
    fn shards_merge_into_one_batch_failed_by_the_shard_that_failed() {
        let run = sample::run();
        let dir = tempfile::tempdir().unwrap();
        let mut shards = [run.batches[0].clone(), run.batches[1].clone()];
        for (i, r) in shards.iter_mut().enumerate() {
            let index = i as u32;
            r.record.batch = crate::manifest::shard_unit("k", index, 2);
            r.record.shard = Some(ShardOf {
                batch: "k".into(),
                index,
                count: 2,
            });
            r.record_path = dir.path().join(format!("k/shard-{}/result.json", i + 1));
        }
        let (first, second) = (shards[0].clone(), shards[1].clone());
        let plain = run.batches[0].clone();
        let folder = Folder::open(dir.path()).unwrap();
        // In the order they ended: the batch stands where its first shard ended.
        let merged = merge(
            vec![second.clone(), plain, first.clone()],
            &folder,
            dir.path(),
        )
        .unwrap();
        let names: Vec<&str> = merged.iter().map(|r| r.record.batch.as_str()).collect();
        assert_eq!(names, ["k", "unit"]);
        let k = &merged[0];
        assert_eq!(k.record.status, Status::Failed);
        assert_eq!(k.record.exit_code, second.record.exit_code);
        assert_eq!(
            k.record.message.as_deref(),
            Some("1 of 2 shards did not pass: shard 2/2 failed (shard-2/): 1 failed, 1 errors")
        );
        assert_eq!(k.record.shards.len(), 2);
        assert_eq!(k.record.shards[1].result, "shard-2/result.json");
        assert_eq!(k.record.shards[0].status, Status::Passed);
        assert_eq!(
            k.record.tests.total,
            first.record.tests.total + second.record.tests.total
        );
        assert_eq!(k.cases.len(), first.cases.len() + second.cases.len());
        assert_eq!(k.record.gpus.len(), 2);
        assert_eq!(k.record_path, dir.path().join("k/result.json"));
        let written = crate::report::RunRecord::read(&dir.path().join("k/result.json")).unwrap();
        assert_eq!((written.batch.as_str(), written.shards.len()), ("k", 2));
        assert!(written.shard.is_none());
        // Every shard passed: the batch passed, with no message.
        let mut ok = second;
        ok.record.status = Status::Passed;
        ok.record.exit_code = 0;
        ok.record.message = None;
        // The batch ran from its first shard's start to its last shard's end, by the
        // instants: a time without a fraction is not later than one with it.
        let (mut a, mut b) = (first, ok);
        a.record.started_at = "2026-11-30T03:00:00Z".into();
        a.record.finished_at = "2026-11-30T03:00:09.500Z".into();
        b.record.started_at = "2026-11-30T03:00:00.250Z".into();
        b.record.finished_at = "2026-11-30T03:00:10Z".into();
        let merged = merge(vec![a, b], &folder, dir.path()).unwrap();
        assert_eq!(merged[0].record.status, Status::Passed);
        assert_eq!(merged[0].record.message, None);
        assert_eq!(merged[0].record.started_at, "2026-11-30T03:00:00Z");
        assert_eq!(merged[0].record.finished_at, "2026-11-30T03:00:10Z");
    }
}
