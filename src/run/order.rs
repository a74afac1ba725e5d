//! In which order a run's batches go, here or through Slurm: all at once (the lease
//! queue, or Slurm, decides which run together), or one after the other, starting no
//! more once a signal came or a batch was cancelled.

use crate::report::outcome::{BatchResult, Status};
use crate::run::error::RunError;
use crate::signals;

use crate::error::Result;

/// Runs `batch(i)` for each of the run's `count` batches, at once when `parallel`.
pub fn each_batch(
    count: usize,
    parallel: bool,
    batch: impl Fn(usize) -> Result<BatchResult> + Sync,
) -> Result<Vec<BatchResult>> {
    if parallel {
        let batch = &batch;
        let joined: Vec<Result<BatchResult>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..count).map(|i| s.spawn(move || batch(i))).collect();
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
        let result = batch(i)?;
        let stop = result.status() == Status::Cancelled;
        batches.push(result);
        // A signal during one ends the run at once.
        if stop {
            break;
        }
    }
    Ok(batches)
}
