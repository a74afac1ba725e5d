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
#[derive(Debug, Default)]
pub struct FirstFailure {
    on: bool,
    failed: Mutex<Option<String>>,
}

impl FirstFailure {
    /// A stop that trips only when `on`.
    pub fn new(on: bool) -> FirstFailure {
        FirstFailure {
            on,
            failed: Mutex::default(),
        }
    }

    /// Notes how a batch ended: the first that fails the run trips the stop.
    pub fn note(&self, r: &BatchResult) {
        if self.on && r.record.counts_against_run() {
            self.failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert_with(|| r.record.batch.clone());
        }
    }

    /// Why a batch that has not started must not: the batch that failed first.
    pub fn why_not(&self) -> Option<String> {
        let failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        failed.as_ref().map(|b| {
            format!("batch {b} failed first, and this run stops at its first failure (fail_fast)")
        })
    }
}

/// Runs `batch(i)` for each of the run's `count` batches, at once when `parallel`; a
/// batch the stop at the first failure keeps from starting is `not_run(i, why)`.
pub fn each_batch(
    count: usize,
    parallel: bool,
    first: &FirstFailure,
    batch: impl Fn(usize) -> Result<BatchResult> + Sync,
    not_run: impl Fn(usize, &str) -> Result<BatchResult> + Sync,
) -> Result<Vec<BatchResult>> {
    let one = |i: usize| -> Result<BatchResult> {
        if let Some(why) = first.why_not() {
            return not_run(i, &why);
        }
        let r = batch(i)?;
        first.note(&r);
        Ok(r)
    };
    if parallel {
        let one = &one;
        let joined: Vec<Result<BatchResult>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..count).map(|i| s.spawn(move || one(i))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(RunError::Panicked.into())))
                .collect()
        });
        return joined.into_iter().collect();
    }
    let mut batches = Vec::new();
    for i in 0..count {
        // A signal between two batches: start no more.
        if signals::received().is_some() {
            break;
        }
        let result = one(i)?;
        let stop = result.status() == Status::Cancelled;
        batches.push(result);
        // A signal during one ends the run at once.
        if stop {
            break;
        }
    }
    Ok(batches)
}
