//! Slurm's side of the commands: `cibox __slurm-node JOB`, a batch's task on a node of
//! its Slurm job (everything it has to say goes to the submitter on stdout, what kept
//! it from running included); and `gpu status` and `capacity` on a login node, from
//! what Slurm says of its nodes.

use super::context::Context;
use crate::error::ErrorKind;
use crate::exit::Failure;
use crate::report::reporter::wire::Wire;
use crate::run::launch;
use crate::run::slurm::NodeJob;

/// The job a node was given is not one cibox sends.
#[derive(Debug, thiserror::Error)]
#[error("the node's job is not one cibox sends: {0}")]
pub struct BadNodeJob(#[source] serde_json::Error);

impl ErrorKind for BadNodeJob {
    fn failure(&self) -> Failure {
        Failure::Usage
    }
}

/// Runs the job and returns its exit code; an error is told to the submitter.
pub fn node(ctx: &Context, job: &str) -> u8 {
    // With its submitter gone (`srun` ended), writing to it must fail, not kill the
    // node's cibox before it has removed the batch's container.
    // SAFETY: setting a disposition before any thread of this process exists.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        );
    }
    let ran = serde_json::from_str::<NodeJob>(job)
        .map_err(|e| BadNodeJob(e).into())
        .and_then(|job| {
            let policy = ctx.host_policy()?;
            launch::run_on_node(&job, &policy)
        });
    match ran {
        Ok(run) => run.exit_code(),
        // Said once, by the submitter, which shows it as the batch's.
        Err(e) => {
            let _ = Wire::stdout().refused(&e.to_string(), e.details(), e.exit_code());
            e.exit_code()
        }
    }
}
