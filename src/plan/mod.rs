//! What a run will be, decided before anything runs (docs/interface.md §6, §7): the
//! request and its plan ([`run_plan`]), and each batch's container as the engine will
//! be asked to create it ([`container`]). Pure: nothing here runs or reports anything.
//!
//! The rooms, from the bottom up; each imports only those below it:
//!
//! - [`error`]: why a request cannot be planned;
//! - [`container`]: one batch's container (name, environment, script and the words it
//!   prints, host mounts, devices, caches, the engine's create request);
//! - [`run_plan`]: the request resolved against the manifest and the host's facts;
//! - [`listing`]: `batch list`: the batches a request names, their expected times,
//!   parts and layers.

pub mod container;
pub mod error;
pub mod listing;
pub mod run_plan;

pub use run_plan::{BatchPlan, HostFacts, RunPlan, RunRequest, SourceInfo, check_request, plan};
