//! Running batches, each in its own disposable container (docs/interface.md §6, §7,
//! §14): one setup for every front end ([`launch`]), the run loop ([`execute`]) behind
//! the [`crate::engine::ContainerEngine`] seam, Slurm submissions ([`slurm`]), and what
//! keeps nothing behind ([`cleanup`]).
//!
//! A front end (`batch run`, `layer run`, `image qualify`, `reproduce`, `changed run`)
//! builds a [`crate::plan::RunRequest`] and calls [`launch::run`]: the request is
//! planned ([`crate::plan::plan`]) without touching anything, then executed, telling a
//! [`crate::report::Reporter`] what happens as it goes.
//!
//! Per batch: lease its GPUs → create the container → copy the source in → start →
//! stream its output → wait with the deadline (or a signal) → copy its reports out →
//! remove the container by exact ID → status → release the lease. The images are
//! verified once, before anything starts.
//!
//! The rooms, from the bottom up; each imports only those below it:
//!
//! - [`error`]: the runner's own errors;
//! - [`batch_dir`], [`copy`], [`source`], [`git_mask`]: a batch's folder, its
//!   `/reports` copied out, the source shipped in, git credentials masked;
//! - [`work_layer`]: a batch's `/work` as an overlay, its upper layer on the host;
//! - [`cleanup`]: the watchdog and the sweep;
//! - [`artifacts`]: a run's artifact key, and the artifacts its batches need, checked;
//! - [`attempts`]: a batch run again while its retries allow, and its flaky record;
//! - [`order`]: running a run's batches at once or one by one, and the stop at the
//!   first failure;
//! - [`execute`]: the run loop on this host;
//! - [`slurm`]: batches as Slurm jobs, and a node's side of them;
//! - [`collect`]: test lists the project's code prints, read in a disposable container;
//! - [`launch`]: one run's setup for every front end;
//! - [`qualify`], [`replay`]: the `qualify` layer on one image, and its record; a
//!   recorded batch run again on its commit and image;
//! - [`gpu_exec`]: a host command on leased GPUs (`gpu exec`).

pub mod artifacts;
pub mod attempts;
pub mod batch_dir;
pub mod cleanup;
pub mod collect;
pub mod copy;
pub mod error;
pub mod execute;
pub mod gpu_exec;
pub mod launch;
pub mod order;
pub mod qualify;
pub mod replay;
pub mod slurm;
pub mod source;
pub mod work_layer;

pub use cleanup::sweep::sweep;
pub use cleanup::watchdog::watch as watch_container;
pub use execute::execute;
