//! How leased units reach what runs on them, by vendor: the device nodes and device
//! request a batch's container gets, the groups that may open those nodes, and the
//! variables that name the units (to the container, or to a `gpu exec` command on the
//! host). The runner asks [`handover`] and [`host_env`] and knows no vendor.
//!
//! Each vendor is one file here implementing [`Vendor`], listed in [`VENDORS`]; its
//! probe backend (what it reports, read into the one reading every backend gives) is
//! in `gpu::probe`. A third kind (Intel's, Ascend's) is a file here and a backend
//! there.
//!
//! The rooms, from the bottom up; each imports only those below it:
//!
//! - [`nvidia`]: whole GPUs and MIG slices, by UUID, through the engine's GPU runtime;
//! - [`amd`]: `/dev/kfd` and each GPU's own render (and card) nodes, found in sysfs.

pub mod amd;
pub mod nvidia;

use std::path::PathBuf;

use super::pool::PoolGpu;
use crate::exit::Failure;
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

/// Every vendor cibox hands units of over.
pub const VENDORS: [&dyn Vendor; 2] = [&nvidia::Nvidia, &amd::Amd];

/// A host device file given to a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    pub host: PathBuf,
    /// Where the container sees it (`/dev/dri/renderD128`).
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
}

impl Handover {
    fn merge(&mut self, other: Handover) {
        self.ids.extend(other.ids);
        self.devices.extend(other.devices);
        self.requests.extend(other.requests);
        for g in other.groups {
            if !self.groups.contains(&g) {
                self.groups.push(g);
            }
        }
        self.env.extend(other.env);
    }
}

/// The variables that say which GPUs a process sees, each vendor's: a leased batch's
/// are cibox's alone.
pub const VISIBILITY_VARIABLES: [&str; 5] = [
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
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

/// Each vendor's share of `units`, in the order of `units`; an identity no vendor owns
/// is refused.
fn by_vendor(units: &[PoolGpu]) -> Result<Vec<(&'static dyn Vendor, Vec<PoolGpu>)>, HandoverError> {
    let mut out: Vec<(&'static dyn Vendor, Vec<PoolGpu>)> = Vec::new();
    for u in units {
        let Some(v) = VENDORS.iter().find(|v| v.owns(&u.uuid)) else {
            return Err(HandoverError::Unknown { id: u.uuid.clone() });
        };
        match out.iter_mut().find(|(o, _)| o.name() == v.name()) {
            Some((_, mine)) => mine.push(u.clone()),
            None => out.push((*v, vec![u.clone()])),
        }
    }
    Ok(out)
}

/// What a container gets for `units` (nothing for none).
pub fn handover(units: &[PoolGpu], driver: GpuDriver) -> Result<Handover, HandoverError> {
    let mut all = Handover::default();
    for (vendor, mine) in by_vendor(units)? {
        all.merge(vendor.container(&mine, driver)?);
    }
    Ok(all)
}

/// The variables that name `units` to a command run on the host.
pub fn host_env(units: &[PoolGpu]) -> Result<Vec<(String, String)>, HandoverError> {
    Ok(by_vendor(units)?
        .into_iter()
        .flat_map(|(vendor, mine)| vendor.host_env(&mine))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(uuid: &str, parent: Option<&str>) -> PoolGpu {
        PoolGpu {
            index: 0,
            uuid: uuid.into(),
            parent: parent.map(str::to_string),
        }
    }

    #[test]
    fn each_unit_goes_to_its_vendor_and_an_unknown_one_is_refused() {
        let units = [
            unit("GPU-11111111-2222-3333-4444-000000000000", None),
            unit(
                "MIG-11111111-2222-3333-4444-000000000009",
                Some("GPU-11111111-2222-3333-4444-000000000001"),
            ),
        ];
        let h = handover(&units, GpuDriver::Nvidia).unwrap();
        assert_eq!(h.requests.len(), 1);
        assert_eq!(h.requests[0].device_ids, h.ids);
        assert_eq!(
            h.env,
            [(
                "CUDA_VISIBLE_DEVICES".to_string(),
                format!("{},{}", units[0].uuid, units[1].uuid)
            )]
        );
        assert!(h.devices.is_empty());
        let err = handover(&[unit("TPU-1", None)], GpuDriver::Nvidia).unwrap_err();
        assert!(err.to_string().contains("`TPU-1`"), "{err}");
        assert_eq!(
            crate::error::Error::from(err).exit_code(),
            crate::exit::INFRA
        );
        assert_eq!(
            handover(&[], GpuDriver::Nvidia).unwrap(),
            Handover::default()
        );
    }
}
