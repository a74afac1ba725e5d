//! A check's verdict ([`Finding`]), and what the checks read ([`Sources`]).

use serde::Serialize;

use crate::error::Result;
use crate::host::HostPolicy;
use crate::manifest::{GpuConfig, Manifest};

/// What the doctor reads, loaded by the command as it loads them for any command.
pub trait Sources {
    /// The host policy in force.
    fn host_policy(&self) -> Result<HostPolicy>;
    /// The manifest, with the GPU facts the host policy pins laid over its own.
    fn manifest(&self) -> Result<Manifest>;
    /// The manifest as its file says.
    fn manifest_as_written(&self) -> Result<Manifest>;
    /// The GPU settings without a manifest.
    fn gpu_without_manifest(&self) -> Result<GpuConfig>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
    /// Told, not judged: on a Slurm login node, what its own GPUs would need.
    Info,
}

/// One check's verdict.
#[derive(Debug, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub status: Status,
    pub detail: String,
    /// Whether a failure here stops GPU batches (exit 5).
    pub blocks_gpu_batches: bool,
}

pub(super) fn finding(
    check: &'static str,
    status: Status,
    detail: impl Into<String>,
    blocks: bool,
) -> Finding {
    Finding {
        check,
        status,
        detail: detail.into(),
        blocks_gpu_batches: blocks,
    }
}
