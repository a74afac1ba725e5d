//! cibox: reproducible, safe GPU CI for large ML projects.
//!
//! Layers, from the outside in: [`cli`] parses, [`cmd`] runs one command family per
//! module, and those use the manifest ([`manifest`]), the lockset ([`lockset`]), the
//! engine ([`engine`]) and the GPUs ([`gpu`]). Errors become exit codes in one place
//! ([`error::Error::exit_code`], codes in [`exit`]); all printing goes through [`report`].

pub mod batch;
pub mod build_context;
pub mod changed;
pub mod cli;
pub mod cmd;
pub mod engine;
pub mod error;
pub mod exit;
pub mod git;
pub mod github;
pub mod gpu;
pub mod image_id;
pub mod lockset;
pub mod manifest;
pub mod process;
pub mod report;
pub mod signals;
pub mod units;
pub mod workflow;
pub mod yaml;
