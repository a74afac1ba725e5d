//! In which order a run's batches go, here or through Slurm: all at once (the lease
//! queue, or Slurm, decides which run together), or one after the other, starting no
//! more once a signal came or a batch was cancelled; and, for a run that stops at its
//! first failure (`fail_fast`), none started after a batch failed the run.

use std::sync::{Mutex, PoisonError};

use crate::report::outcome::{BatchResult, Status};
use crate::run::error::RunError;
use crate::signals;

use crate::error::Result;

/// A run's stop at its first failure (`--fail-fast`, a layer's `fail_fast`): tripped by
/// the first batch that fails the run (a soft failure does not), read by every batch
/// before it starts and while it waits for its GPUs.
/// A layer's warm-up, the run's first batch, trips it too: it runs alone, and when
/// it did not pass none of the rest starts.
#[derive(Debug, Default)]
pub struct FirstFailure {
    on: bool,
    failed: Mutex<Option<String>>,
    warmup: Option<String>,
    warmup_failed: Mutex<bool>,
}

impl FirstFailure {
    /// A stop that trips only when `on`, and at a warm-up (the run's first batch,
    /// `warmup`) that did not pass.
    pub fn new(on: bool, warmup: Option<String>) -> FirstFailure {
        FirstFailure {
            on,
            failed: Mutex::default(),
            warmup,
            warmup_failed: Mutex::default(),
        }
    }

    /// Notes how a batch ended: the first that fails the run trips the stop.
    pub fn note(&self, r: &BatchResult) {
        if self.on && r.record.counts_against_run() {
            self.failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert_with(|| match &r.record.shard {
                    // A shard's unit name (`X[2/3]`) is no batch a reader knows.
                    Some(s) => format!("{} (shard {}/{})", s.batch, s.index + 1, s.count),
                    None => r.record.batch.clone(),
                });
        }
    }

    /// Why a batch that has not started must not: the warm-up that did not pass, or
    /// the batch that failed first.
    pub fn why_not(&self) -> Option<String> {
        if *self
            .warmup_failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            return self.warmup.as_ref().map(|w| {
                format!("the layer's warm-up, batch {w}, did not pass, and this part's batches run after it")
            });
        }
        let failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        failed.as_ref().map(|b| {
            format!("batch {b} failed first, and this run stops at its first failure (fail_fast)")
        })
    }
}

/// How the run's batches go together: at once (`parallel`), or one after the other,
/// where the shards of one batch (consecutive, `shards` giving each batch's first index
/// the number of its shards and how many of them fit the host at once) go together,
/// as many at a time as fit.
pub struct Together<'a> {
    pub parallel: bool,
    /// For the batch at index `i`: how many units from `i` are its shards (1 for an
    /// unsharded batch), and how many of them may run at once.
    pub shards: &'a (dyn Fn(usize) -> (usize, usize) + Sync),
}

/// Runs `batch(i)` for each of the run's `count` batches, at once when `parallel`; a
/// batch the stop at the first failure keeps from starting is `not_run(i, why)`.
pub fn each_batch(
    count: usize,
    together: &Together<'_>,
    first: &FirstFailure,
    batch: impl Fn(usize) -> Result<BatchResult> + Sync,
    not_run: impl Fn(usize, &str) -> Result<BatchResult> + Sync,
) -> Result<Vec<BatchResult>> {
    let parallel = together.parallel;
    let one = |i: usize| -> Result<BatchResult> {
        if let Some(why) = first.why_not() {
            return not_run(i, &why);
        }
        let r = batch(i)?;
        first.note(&r);
        Ok(r)
    };
    let mut batches = Vec::new();
    let mut from = 0;
    if first.warmup.is_some() && count > 0 {
        // The warm-up, alone: the rest start once it passed.
        let r = one(0)?;
        if !r.passed() {
            *first
                .warmup_failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = true;
        }
        let stop = r.status() == Status::Cancelled;
        batches.push(r);
        if stop {
            return Ok(batches);
        }
        from = 1;
    }
    if parallel {
        batches.extend(at_once(&one, from..count)?);
        return Ok(batches);
    }
    let mut i = from;
    while i < count {
        // A signal between two batches: start no more.
        if signals::received().is_some() {
            break;
        }
        let (len, width) = (together.shards)(i);
        let end = (i + len.max(1)).min(count);
        let mut stop = false;
        // A batch's shards, as many at a time as fit; a lone batch, alone.
        let mut at = i;
        while at < end && !stop {
            let wave = (at + width.max(1)).min(end);
            for result in at_once(&one, at..wave)? {
                // A signal during one ends the run at once.
                stop |= result.status() == Status::Cancelled;
                batches.push(result);
            }
            at = wave;
            stop |= at < end && signals::received().is_some();
        }
        if stop {
            break;
        }
        i = end;
    }
    Ok(batches)
}

/// Runs `one` for each of `range` at once (one alone on this thread), in their order.
fn at_once(
    one: &(dyn Fn(usize) -> Result<BatchResult> + Sync),
    range: std::ops::Range<usize>,
) -> Result<Vec<BatchResult>> {
    if range.len() == 1 {
        return Ok(vec![one(range.start)?]);
    }
    let joined: Vec<Result<BatchResult>> = std::thread::scope(|s| {
        let handles: Vec<_> = range.map(|i| s.spawn(move || one(i))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(RunError::Panicked.into())))
            .collect()
    });
    joined.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::reporter::sample;

    #[test]
    fn the_first_failure_is_named_by_its_batch_and_a_shard_by_its_place() {
        let run = sample::run();
        let failed = run
            .batches
            .iter()
            .find(|b| b.record.counts_against_run())
            .expect("the sample run has a failed batch")
            .clone();
        let stop = FirstFailure::new(true, None);
        assert_eq!(stop.why_not(), None);
        let mut shard = failed.clone();
        shard.record.batch = crate::manifest::shard_unit("k", 1, 3);
        shard.record.shard = Some(crate::report::record::ShardOf {
            batch: "k".into(),
            index: 1,
            count: 3,
        });
        stop.note(&shard);
        // The first one counts; a later failure changes nothing.
        stop.note(&failed);
        assert_eq!(
            stop.why_not().as_deref(),
            Some(
                "batch k (shard 2/3) failed first, and this run stops at its first failure (fail_fast)"
            )
        );
        let off = FirstFailure::new(false, None);
        off.note(&failed);
        assert_eq!(off.why_not(), None);
    }
}
