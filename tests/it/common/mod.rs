//! Shared test harness, by subject. Test files `use crate::common::*`; everything below
//! is re-exported here. Engine-backed tests fail (never skip) when no engine answers.
// One test binary: a helper unused by the areas compiled in one configuration is fine.
#![allow(dead_code)]

mod cli;
mod engine;
mod engine_proxy;
mod fuse;
mod gpus;
mod npus;
mod policy;
mod processes;
mod projects;
mod slurm;

pub use cli::*;
pub use engine::*;
pub use engine_proxy::*;
pub use fuse::*;
pub use gpus::*;
pub use npus::*;
pub use policy::*;
pub use processes::*;
pub use projects::*;
pub use slurm::*;
