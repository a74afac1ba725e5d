//! cibox: reproducible, safe GPU CI for large ML projects. The interface it keeps is
//! written down in `docs/interface.md`.
//!
//! Layers, from the outside in; each imports only those below it, and no module imports
//! another that imports it back:
//!
//! - [`cli`] parses and [`cmd`] adapts one command family per module: flags → request →
//!   call → exit code;
//! - [`runner`] runs batches: one setup for every front end ([`runner::launch`]), a
//!   plan, the run loop behind the [`engine::ContainerEngine`] seam, events and their
//!   reporters; [`claims`] adds the GPUs of running cibox containers to a probe;
//! - the domain: [`host`] (the host policy: what the host grants, its GPU facts),
//!   [`manifest`] (what `cibox.yaml` says), [`image`] (IDs, lockset,
//!   verification, build recipes), [`gpu`] (probe, pool, queue, the lease sequence),
//!   [`lockdir`] (the shared lock directory), [`slurm`] (a Slurm cluster's commands and
//!   what they print), [`engine`] (the container engine,
//!   synchronous, owning the async runtime), [`changed`], [`workflow`] (render and lint);
//! - leaves: [`labels`], [`util`], [`units`], [`yaml`], [`git`], [`github`],
//!   [`process`], [`signals`], [`console`] (what cibox prints), [`nofollow`] (file
//!   operations in folders others can write), [`ownership`] (who can change a path)
//!   and [`exit`].
//!
//! Errors become exit codes in one place ([`error::Error::exit_code`], codes in
//! [`exit`]).

/// `VERSION (commit C)`, as `cibox --version` prints it.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CIBOX_COMMIT"),
    ")"
);

pub mod cache;
pub mod changed;
pub mod claims;
pub mod cli;
pub mod cmd;
pub mod console;
pub mod engine;
pub mod error;
pub mod exit;
pub mod git;
pub mod github;
pub mod gpu;
pub mod host;
pub mod image;
pub mod labels;
pub mod lockdir;
pub mod manifest;
pub mod nofollow;
pub mod ownership;
pub mod plan;
pub mod process;
pub mod report;
pub mod run;
pub mod signals;
pub mod slurm;
pub mod units;
pub mod util;
pub mod workflow;
pub mod yaml;
