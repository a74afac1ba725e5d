//! A batch's attempts: it runs again, each time in a fresh container with GPUs leased
//! anew, while it did not pass, its `retries` are not spent and its ending is one they
//! name (`failed` by default; `timeout` and `infra_error` only when asked). A batch that
//! passed after failing is flaky: its record says so, with every earlier attempt, and
//! never reads as simply green.

use crate::plan::BatchPlan;
use crate::report::event::EventKind;
use crate::report::junit::CaseStatus;
use crate::report::outcome::{BatchResult, EarlierAttempt, Status};
use crate::report::record::AttemptRecord;
use crate::signals;

use crate::error::Result;

/// The most failing tests an earlier attempt's record names.
const NAMED_PER_ATTEMPT: usize = 100;

/// Runs `attempt(n)` (1-based) until one passes or `b`'s retries are spent, telling
/// `emit` of each attempt that another follows (`AttemptEnded`) and of the batch's end
/// (`BatchEnded`); the last attempt's result with the earlier ones recorded in it.
pub fn run(
    b: &BatchPlan,
    mut attempt: impl FnMut(u32) -> Result<BatchResult>,
    emit: impl Fn(EventKind<'_>) -> Result<()>,
) -> Result<BatchResult> {
    let mut earlier: Vec<BatchResult> = Vec::new();
    let mut n = 1;
    loop {
        let mut r = attempt(n)?;
        r.record.ran_s = (r.record.duration_s - r.record.gpu_wait_s).max(0.0);
        if n <= b.retries.count && again(b, &r) {
            emit(EventKind::AttemptEnded {
                batch: b,
                result: &r,
                next: n + 1,
            })?;
            earlier.push(r);
            n += 1;
            continue;
        }
        let result = combine(r, earlier);
        emit(EventKind::BatchEnded { result: &result })?;
        return Ok(result);
    }
}

/// Whether the batch runs again after ending as `r`: its retries name its ending, no
/// signal came, and its container is gone (one left behind may still run).
fn again(b: &BatchPlan, r: &BatchResult) -> bool {
    use crate::manifest::RetryOn;
    let wanted = match r.status() {
        Status::Failed => RetryOn::Failed,
        Status::Timeout => RetryOn::Timeout,
        Status::InfraError => RetryOn::InfraError,
        _ => return false,
    };
    b.retries.on.contains(&wanted) && signals::received().is_none() && !r.container_left
}

/// The last attempt's result, with the earlier ones: its record counts them, says
/// whether it is flaky, and spans them all; its cases carry what failed before.
fn combine(mut last: BatchResult, earlier: Vec<BatchResult>) -> BatchResult {
    if earlier.is_empty() {
        return last;
    }
    let record = &mut last.record;
    record.attempts = earlier.len() as u32 + 1;
    record.flaky = record.status == Status::Passed;
    record.started_at = earlier[0].record.started_at.clone();
    record.duration_s += earlier.iter().map(|e| e.record.duration_s).sum::<f64>();
    record.gpu_wait_s += earlier.iter().map(|e| e.record.gpu_wait_s).sum::<f64>();
    record.earlier_attempts = earlier
        .iter()
        .enumerate()
        .map(|(i, e)| AttemptRecord {
            attempt: i as u32 + 1,
            status: e.record.status,
            exit_code: e.record.exit_code,
            message: e.record.message.clone(),
            started_at: e.record.started_at.clone(),
            duration_s: e.record.duration_s,
            failed_tests: e
                .record
                .failed_tests
                .iter()
                .take(NAMED_PER_ATTEMPT)
                .cloned()
                .collect(),
            gpus: e.record.gpus.iter().map(|g| g.uuid.clone()).collect(),
        })
        .collect();
    last.earlier = earlier
        .into_iter()
        .enumerate()
        .map(|(i, e)| EarlierAttempt {
            attempt: i as u32 + 1,
            status: e.record.status,
            message: e.record.message,
            failing: e
                .cases
                .into_iter()
                .filter(|c| matches!(c.status, CaseStatus::Failed | CaseStatus::Error))
                .collect(),
        })
        .collect();
    last
}
