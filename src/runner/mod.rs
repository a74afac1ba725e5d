//! Running batches, each in its own disposable container (docs/interface.md §6, §7):
//! request → plan → execute → events → reporters.
//!
//! A front end (`batch run`, `layer run`, `image qualify`, `reproduce`, `changed run`)
//! builds a [`RunRequest`] and calls [`launch::run`]: [`plan()`] resolves the request
//! against the manifest into a [`RunPlan`] without touching anything; [`execute()`]
//! runs the plan and hands back a [`RunResult`], telling a [`Reporter`] what happens
//! as it goes ([`Event`]).
//!
//! Per batch: lease its GPUs → create the container → start → stream its output →
//! wait with the deadline (or a signal) → copy its reports out → remove the container
//! by exact ID → status → release the lease. The images are verified once, before
//! anything starts.
//!
//! The rooms, from the bottom up; each imports only those below it:
//!
//! - `error`: every error of the runner (and [`PlanError`], [`ReporterError`]);
//! - `results`: what a batch leaves in the reports folder (its folder, the copy of
//!   `/reports`, JUnit, steps, `result.json`);
//! - `container`: one batch's container (name, environment, script, host mounts,
//!   the git credential mask, the engine's create request);
//! - `plan`: what a run will do, decided before anything runs;
//! - `ending`: how batches and runs end ([`Status`], `judge`);
//! - `cleanup`: the watchdog and the sweep, so nothing is left behind;
//! - `event` and [`reporter`]: what the runner says, and who renders it;
//! - `execute`: the run loop; [`launch`]: one run's setup for every front end;
//!   [`qualify`]: the `qualify` layer on one image, and its record.
//!
//! Outside the runner only this face is seen: [`launch`], [`reporter`] and what is
//! re-exported here.

mod cleanup;
mod container;
mod ending;
mod error;
mod event;
mod execute;
pub mod launch;
mod order;
mod plan;
pub mod qualify;
mod remote;
pub mod reporter;
mod results;
pub mod slurm;

pub use cleanup::sweep::{Swept, sweep};
pub use cleanup::watchdog::watch as watch_container;
pub use ending::{BatchResult, RunResult, Status};
pub use error::{PlanError, ReporterError, RunError};
pub use event::Event;
pub use execute::execute;
pub use plan::{
    BatchPlan, HostFacts, RunPlan, RunRequest, check_request, named_batches, new_run_id, plan,
};
pub use reporter::Reporter;
pub use results::record::{RecordError, RunRecord, SourceInfo};
