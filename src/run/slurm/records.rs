//! A batch's record when it ran through Slurm: its node's (the same record a local run
//! writes) with the job it ran as; for a batch on several nodes, one record over its
//! ranks' (each rank's own in `node-<rank>/`); and, when no node sent one (the job
//! never started, Slurm ended it, its node refused it), a record of why.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use crate::exit;
use crate::nofollow::Folder;
use crate::plan::BatchPlan;
use crate::report::junit::{Case, Totals};
use crate::report::outcome::{BatchResult, ContainerEnd, Status};
use crate::report::record::{RunRecord, SlurmJob};
use crate::run::error::RunError;
use crate::run::slurm::{Result, Submission};
use crate::slurm::job::JobSpec;
use crate::units::rfc3339;

/// A rank's end, as its node told it.
pub(super) struct Ended {
    pub record: RunRecord,
    pub cases: Vec<Case>,
    pub container_left: bool,
}

/// What came back from a batch's job.
#[derive(Default)]
pub(super) struct JobEnd {
    pub job_id: Option<String>,
    /// Each rank's end.
    pub ended: BTreeMap<u32, Ended>,
    /// What kept a rank from running its batch to its end.
    pub failures: BTreeMap<u32, crate::error::Error>,
    /// Why the submitter ended the job itself (a signal, the wait, a deadline).
    pub stopped: Option<ContainerEnd>,
    /// `srun`'s own last lines.
    pub srun_said: VecDeque<String>,
    /// The batch's output, counted as it came.
    pub printed: u64,
    /// When the submitter learned that the job left Slurm's queue (its nodes were
    /// allocated), and when a node last told it had leased the batch's GPUs (a CPU
    /// batch's lease step too): the batch's wait ends there.
    pub allocated: Option<Instant>,
    pub granted: Option<Instant>,
}

/// How bad a rank's status is, to pick the one that tells the batch's: a rank ended
/// because another failed is `cancelled`, which says less than the failure.
fn weight(s: Status) -> u8 {
    match s {
        Status::InfraError => 6,
        Status::ImageRefused => 5,
        Status::Timeout => 4,
        Status::Failed => 3,
        Status::Capacity => 2,
        Status::Cancelled => 1,
        Status::Passed | Status::NotRun => 0,
    }
}

impl Submission<'_> {
    /// The batch's result: its nodes' records, or why there is none.
    pub(super) fn result(
        &self,
        b: &BatchPlan,
        dir: &Folder,
        spec: &JobSpec,
        mut end: JobEnd,
        started: SystemTime,
        clock: Instant,
    ) -> Result<BatchResult> {
        let record_path = b.dir.join("result.json");
        let mut slurm = SlurmJob {
            job_id: end.job_id.clone(),
            name: spec.name.clone(),
            partition: Some(self.partition.clone()),
            nodes: Vec::new(),
        };
        for e in end.ended.values() {
            if let Some(s) = &e.record.slurm {
                slurm.job_id = slurm.job_id.or_else(|| s.job_id.clone());
                slurm.nodes.extend(s.nodes.iter().cloned());
            }
        }
        let complete = end.ended.len() == b.nodes as usize;
        let (mut record, cases, container_left) = if complete && b.nodes == 1 {
            let e = end.ended.remove(&0).expect("rank 0 ended");
            (e.record, e.cases, e.container_left)
        } else if complete {
            self.over_ranks(b, dir, &end)?
        } else {
            let (status, message, signal) = why_no_record(b, &mut end)?;
            let mut r = self.bare_record(b, status, message, started, clock);
            r.exit_code = status.exit_code(signal);
            (r, Vec::new(), false)
        };
        // The batch's life is the job's, from its submission: its time in Slurm's queue
        // is a wait for GPUs as a local batch's in cibox's own queue is.
        let elapsed = clock.elapsed();
        record.slurm = Some(slurm);
        record.started_at = rfc3339(started);
        record.finished_at = rfc3339(SystemTime::now());
        record.duration_s = seconds(elapsed);
        record.gpu_wait_s = seconds(waited(&end, clock, record.gpu_wait_s, elapsed));
        // The submitter's own reason to end the job is the batch's.
        match &end.stopped {
            Some(ContainerEnd::Cancelled {
                signal, message, ..
            }) => {
                record.status = Status::Cancelled;
                record.exit_code = exit::signal(*signal as i32);
                record.message = Some(message.clone());
            }
            Some(ContainerEnd::Stopped {
                status, message, ..
            }) if record.status != *status => {
                record.status = *status;
                record.exit_code = status.exit_code(None);
                record.message = Some(message.clone());
            }
            _ => {}
        }
        Ok(BatchResult {
            record,
            cases,
            earlier: Vec::new(),
            record_path,
            container_left,
        })
    }

    /// The record of a batch on several nodes: its ranks' records (each written in
    /// its `node-<rank>/`), the worst rank's status, their tests and GPUs together.
    fn over_ranks(
        &self,
        b: &BatchPlan,
        dir: &Folder,
        end: &JobEnd,
    ) -> Result<(RunRecord, Vec<Case>, bool)> {
        for (rank, e) in &end.ended {
            let name = format!("node-{rank}");
            dir.make_dir(&name, 0o755)
                .and_then(|node| e.record.write(&node))
                .map_err(|source| RunError::BatchDir {
                    dir: b.dir.join(&name).display().to_string(),
                    what: "write result.json in",
                    source,
                })?;
        }
        let (worst_rank, worst) = end
            .ended
            .iter()
            .max_by_key(|(rank, e)| (weight(e.record.status), std::cmp::Reverse(**rank)))
            .expect("ranks ended");
        let mut record = worst.record.clone();
        if let Some(m) = &worst.record.message {
            let node = worst.record.slurm.as_ref().and_then(|s| s.nodes.first());
            record.message = Some(format!(
                "rank {worst_rank}{}: {m}",
                node.map(|n| format!(" (node {n})")).unwrap_or_default()
            ));
        }
        let mut cases = Vec::new();
        // What every rank ran on: the first rank's host, every rank's GPUs.
        record.hardware = end
            .ended
            .values()
            .find_map(|e| e.record.hardware.clone())
            .map(|mut h| {
                h.gpus = end
                    .ended
                    .values()
                    .filter_map(|e| e.record.hardware.as_ref())
                    .flat_map(|h| h.gpus.iter().cloned())
                    .collect();
                h
            });
        record.gpus.clear();
        record.failed_tests.clear();
        record.reports = Default::default();
        record.output_bytes = end.printed;
        record.container = format!("{} (and the other ranks')", b.container.name);
        for e in end.ended.values() {
            record.gpus.extend(e.record.gpus.iter().cloned());
            record
                .failed_tests
                .extend(e.record.failed_tests.iter().cloned());
            record.reports.files += e.record.reports.files;
            record.reports.bytes += e.record.reports.bytes;
            cases.extend(e.cases.iter().cloned());
        }
        record.tests = Totals::of(&cases);
        record.gpu_count = b.gpus;
        let left = end.ended.values().any(|e| e.container_left);
        Ok((record, cases, left))
    }

    /// The record of a batch no node sent one for.
    pub(super) fn bare_record(
        &self,
        b: &BatchPlan,
        status: Status,
        message: String,
        started: SystemTime,
        clock: Instant,
    ) -> RunRecord {
        let lockset = self
            .locksets
            .get(&b.image_name)
            .cloned()
            .unwrap_or_default();
        RunRecord {
            message: Some(message),
            ..RunRecord::planned(
                self.plan,
                b,
                lockset,
                status,
                status.exit_code(None),
                started,
                clock,
            )
        }
    }
}

/// Seconds with millisecond precision, as records have them.
fn seconds(d: Duration) -> f64 {
    (d.as_millis() as f64) / 1000.0
}

/// How long a batch submitted at `clock` waited for its GPUs, of the `elapsed` it
/// lasted: until its (last) node leased them; else until its job left the queue, and
/// then its node's own wait (`node_wait_s`, a lease refused there); a job that never
/// left the queue waited all its life.
fn waited(end: &JobEnd, clock: Instant, node_wait_s: f64, elapsed: Duration) -> Duration {
    let since = |t: Instant| t.saturating_duration_since(clock);
    let wait = match (end.granted, end.allocated) {
        (Some(granted), _) => since(granted),
        (None, Some(allocated)) => {
            since(allocated) + Duration::from_secs_f64(node_wait_s.clamp(0.0, 1e9))
        }
        (None, None) => elapsed,
    };
    wait.min(elapsed)
}

/// Why a batch's nodes sent no record (or not every rank did): the submitter's own
/// reason, else a node's, else what Slurm said. A node's error that is the run's (a
/// policy that does not grant what the batch asks) ends the run, as it would locally.
fn why_no_record(
    b: &BatchPlan,
    end: &mut JobEnd,
) -> Result<(Status, String, Option<nix::sys::signal::Signal>)> {
    if let Some(stopped) = &end.stopped {
        return Ok(of_end(stopped));
    }
    if let Some(rank) = end.failures.keys().next().copied() {
        let error = end.failures.remove(&rank).expect("a failure");
        let Some(stopped) = ContainerEnd::of_error(&error) else {
            return Err(error);
        };
        return Ok(of_end(&stopped));
    }
    let said = end.srun_said.iter().rev().find(|l| l.contains("error"));
    let job = end.job_id.as_deref().unwrap_or("(never named)");
    if end.srun_said.iter().any(|l| l.contains("TIME LIMIT")) {
        return Ok((
            Status::Timeout,
            format!(
                "Slurm ended job {job} at its time limit (the batch's timeout {} and the policy's grace)",
                b.timeout
            ),
            None,
        ));
    }
    let missing: Vec<String> = (0..b.nodes)
        .filter(|r| !end.ended.contains_key(r))
        .map(|r| r.to_string())
        .collect();
    Ok((
        Status::InfraError,
        format!(
            "Slurm job {job} ended without a record from {}{}",
            if b.nodes > 1 {
                format!("rank(s) {}", missing.join(", "))
            } else {
                "its node".to_string()
            },
            said.map(|l| format!(": {}", crate::util::escape(l)))
                .unwrap_or_default()
        ),
        None,
    ))
}

fn of_end(e: &ContainerEnd) -> (Status, String, Option<nix::sys::signal::Signal>) {
    match e {
        ContainerEnd::Cancelled {
            signal, message, ..
        } => (Status::Cancelled, message.clone(), Some(*signal)),
        ContainerEnd::Stopped {
            status, message, ..
        } => (*status, message.clone(), None),
        ContainerEnd::Exited(code) => (
            Status::Failed,
            format!("a step exited with {code}; see log.txt"),
            None,
        ),
        ContainerEnd::Unknown => (Status::InfraError, "its end is unknown".into(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::run_plan::tests::batch_plan;

    #[test]
    fn a_job_without_a_record_says_why() {
        let b = batch_plan("b");
        let why = |end: &mut JobEnd| why_no_record(&b, end);
        let mut end = JobEnd {
            stopped: Some(ContainerEnd::Cancelled {
                signal: nix::sys::signal::Signal::SIGINT,
                message: "cancelled by SIGINT".into(),
                exit: None,
            }),
            ..JobEnd::default()
        };
        let (status, _, signal) = why(&mut end).unwrap();
        assert_eq!(status, Status::Cancelled);
        assert_eq!(status.exit_code(signal), 130);
        // What the node refused is the batch's; a refusal that is configuration, the run's.
        let mut end = JobEnd::default();
        end.failures.insert(
            0,
            crate::run::slurm::relay::error_of("no image", &[], exit::IMAGE_REFUSED),
        );
        assert_eq!(why(&mut end).unwrap().0, Status::ImageRefused);
        let mut end = JobEnd::default();
        end.failures.insert(
            0,
            crate::run::slurm::relay::error_of("not granted", &[], exit::USAGE),
        );
        assert!(why(&mut end).is_err());
        // What Slurm said, when nobody else did.
        let mut end = JobEnd::default();
        end.srun_said.push_back(
            "srun: error: *** STEP 3.0 ON n1 CANCELLED AT … DUE TO TIME LIMIT ***".into(),
        );
        assert_eq!(why(&mut end).unwrap().0, Status::Timeout);
        let mut end = JobEnd {
            job_id: Some("7".into()),
            ..JobEnd::default()
        };
        end.srun_said
            .push_back("srun: error: Node failure on n2".into());
        let (status, message, _) = why(&mut end).unwrap();
        assert_eq!(status, Status::InfraError);
        assert_eq!(
            message,
            "Slurm job 7 ended without a record from its node: srun: error: Node failure on n2"
        );
    }

    #[test]
    fn the_wait_runs_from_submission_to_the_lease_or_to_the_end() {
        let clock = Instant::now() - Duration::from_secs(10);
        let elapsed = Duration::from_secs(10);
        // Leased on its node 7 s after submission: 7 s of wait, the queue's included.
        let end = JobEnd {
            allocated: Some(clock + Duration::from_secs(6)),
            granted: Some(clock + Duration::from_secs(7)),
            ..JobEnd::default()
        };
        assert_eq!(waited(&end, clock, 0.5, elapsed), Duration::from_secs(7));
        // Never leased (refused on its node after 1.5 s there): the queue, then that.
        let end = JobEnd {
            allocated: Some(clock + Duration::from_secs(6)),
            ..JobEnd::default()
        };
        assert_eq!(
            waited(&end, clock, 1.5, elapsed),
            Duration::from_millis(7500)
        );
        // Never out of the queue: all its life; and never more than that.
        assert_eq!(waited(&JobEnd::default(), clock, 0.0, elapsed), elapsed);
        assert_eq!(waited(&end, clock, 100.0, elapsed), elapsed);
    }

    #[test]
    fn a_failing_rank_tells_more_than_the_ranks_it_ended() {
        assert!(weight(Status::Failed) > weight(Status::Cancelled));
        assert!(weight(Status::InfraError) > weight(Status::Failed));
        assert!(weight(Status::Cancelled) > weight(Status::Passed));
    }
}
