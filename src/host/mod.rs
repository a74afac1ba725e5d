//! The host's side of every run: its policy ([`policy`]), what a manifest's requests
//! get under it ([`grants`]), and the GPU facts it pins ([`gpu`]). The project's
//! manifest requests; only the host grants.

pub mod admin_file;
pub mod build_scope;
pub mod builds;
pub mod caches;
pub mod ci_tokens;
pub mod devices;
pub mod error;
pub mod gpu;
pub mod grants;
pub mod policy;
pub mod runner;
pub mod scheduler;

pub use error::PolicyError;
pub use grants::check_requests;
pub use policy::HostPolicy;
pub use scheduler::{Scheduler, SlurmPolicy};
