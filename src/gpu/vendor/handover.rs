//! What every vendor's hand-over is made of: the [`Vendor`] each implements, the
//! [`Handover`] a container gets, and why one cannot be made.

use std::path::PathBuf;

use crate::exit::Failure;
use crate::gpu::pool::PoolGpu;
use crate::manifest::GpuDriver;

/// A kind of accelerator: which units are its, and how they are handed over.
pub trait Vendor: Sync {
    /// Its name, for messages (`NVIDIA`).
    fn name(&self) -> &'static str;
    /// Whether a unit with identity `id` (as its probe names it) is one of its.
    fn owns(&self, id: &str) -> bool;
    /// What a container gets for `units` (all of them its own), through `driver`
    /// where the vendor's go through the engine's GPU runtime.
    fn container(&self, units: &[PoolGpu], driver: GpuDriver) -> Result<Handover, HandoverError>;
    /// The variables that name `units` to a command run on the host.
    fn host_env(&self, units: &[PoolGpu]) -> Vec<(String, String)>;
}

/// A host device file given to a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    pub host: PathBuf,
    /// Where the container sees it (`/dev/dri/renderD128`).
    pub container: String,
}

/// A host path of the vendor's driver given to a container read-only, as its container
/// runtime gives it (Ascend's user-space libraries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOnlyMount {
    pub host: PathBuf,
    /// Where the container sees it (the host's own path).
    pub container: String,
}

/// A request to the engine's GPU runtime, in the engine's terms (`--gpus`, CDI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRequest {
    /// `nvidia`, `cdi`.
    pub driver: String,
    pub device_ids: Vec<String>,
    /// What the runtime must give (`[["gpu"]]`); empty for CDI names.
    pub capabilities: Vec<Vec<String>>,
}

/// What a container gets for the units it leased.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handover {
    /// The units' identities, for the container's label (running containers hold them).
    pub ids: Vec<String>,
    /// Device files mapped in, each exactly.
    pub devices: Vec<DeviceNode>,
    pub requests: Vec<DeviceRequest>,
    /// Groups that own the device files: the batch (no capability, another uid) needs
    /// them to open the nodes, as `--group-add render` gives.
    pub groups: Vec<u32>,
    /// The variables that say which units the batch sees; they replace any of
    /// [`VISIBILITY_VARIABLES`] the batch's environment holds.
    pub env: Vec<(String, String)>,
    /// The driver's files bound in read-only.
    pub mounts: Vec<ReadOnlyMount>,
}

impl Handover {
    pub(super) fn merge(&mut self, other: Handover) {
        self.ids.extend(other.ids);
        self.devices.extend(other.devices);
        self.requests.extend(other.requests);
        for g in other.groups {
            if !self.groups.contains(&g) {
                self.groups.push(g);
            }
        }
        self.env.extend(other.env);
        for m in other.mounts {
            if !self.mounts.contains(&m) {
                self.mounts.push(m);
            }
        }
    }
}

/// The variables that say which GPUs a process sees, each vendor's: a leased batch's
/// are cibox's alone.
pub const VISIBILITY_VARIABLES: [&str; 11] = [
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ASCEND_RT_VISIBLE_DEVICES",
    "ASCEND_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ONEAPI_DEVICE_SELECTOR",
    "MUSA_VISIBLE_DEVICES",
    "MTHREADS_VISIBLE_DEVICES",
];

/// Why leased units cannot be handed over: nothing is started with them.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("GPU `{id}`: no vendor of cibox's names its units so")]
    Unknown { id: String },
    /// The vendor's device files or their description cannot be told apart for sure.
    #[error("{vendor} GPU {id}: {why}; not handing it over")]
    Unresolved {
        vendor: &'static str,
        id: String,
        why: String,
    },
}

impl crate::error::ErrorKind for HandoverError {
    /// Fail closed: a GPU whose device files cannot be told is given to nobody.
    fn failure(&self) -> Failure {
        Failure::Infra
    }
}
