//! The integration tests, one binary with a module per area (so `common` is compiled
//! once); the larger areas, `batch` and `nix`, are folders with a module per subject.
//! Run one area with a filter, e.g. `cargo nextest run --test it gpu::`, or one subject,
//! e.g. `batch::mounts::`.

mod common;

mod accel_examples;
mod amd;
mod artifact_workflows;
mod ascend;
mod batch;
mod buildkite;
mod caches;
mod ci;
mod cli;
mod collect;
mod confine;
mod docs;
mod doctor;
mod fake_gpus;
mod gpu;
mod gpu_models;
mod health;
mod hostile;
mod image;
mod init;
mod install;
mod layers;
mod lint;
mod lockset;
mod mig;
mod nix;
mod orphans;
mod policy;
mod probe;
mod python;
mod readme;
mod runner_container;
mod selection;
mod shapes;
mod sizes;
mod slurm;
mod slurm_vendors;
mod snapshots;
mod vendor_health;
mod vendors;
mod waits;
