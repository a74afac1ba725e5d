//! cibox: reproducible, safe GPU CI for large ML projects. The interface it keeps is
//! written down in `docs/interface.md`.
//!
//! Layers, from the outside in; each imports only those below it:
//!
//! - [`cli`] parses and [`cmd`] adapts one command family per module;
//! - [`runner`] plans and executes runs of batches and reports them through reporters;
//!   [`claims`] adds the GPUs of running cibox containers to a probe;
//! - the domain: [`manifest`], [`image`] (IDs, lockset, verification, build context),
//!   [`gpu`] (probe, pool, queue, leases), [`lockdir`] (the shared lock directory),
//!   [`engine`] (the container engine, synchronous, owning the async runtime),
//!   [`changed`], [`workflow`];
//! - leaves: [`labels`], [`util`], [`units`], [`yaml`], [`git`], [`github`], [`process`],
//!   [`signals`], [`report`] and [`exit`].
//!
//! Errors become exit codes in one place ([`error::Error::exit_code`], codes in
//! [`exit`]).

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
pub mod image;
pub mod labels;
pub mod lockdir;
pub mod manifest;
pub mod nofollow;
pub mod process;
pub mod runner;
pub mod signals;
pub mod units;
pub mod util;
pub mod workflow;
pub mod yaml;
