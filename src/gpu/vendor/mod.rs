//! How leased units reach what runs on them, by vendor: the device nodes and device
//! request a batch's container gets, the groups that may open those nodes, and the
//! variables that name the units (to the container, or to a `gpu exec` command on the
//! host). The runner asks [`handover`] and [`host_env`] and knows no vendor.
//!
//! Each vendor is one file here implementing [`Vendor`], listed in [`VENDORS`]; its
//! probe backend (what it reports, read into the one reading every backend gives) is
//! in `gpu::probe`. Another kind is a file here and a backend there.
//!
//! The rooms, from the bottom up; each imports only those below it:
//!
//! - [`handover`]: what a vendor gives, and the [`Vendor`] each implements;
//! - [`nvidia`]: whole GPUs and MIG slices, by UUID, through the engine's GPU runtime;
//! - [`amd`]: `/dev/kfd` and each GPU's own render (and card) nodes, found in sysfs;
//! - [`ascend`]: each NPU chip's own `/dev/davinciN`, the driver's shared nodes and its
//!   user space read-only;
//! - [`intel`]: each GPU's own render and card nodes, found in sysfs by PCI address;
//! - [`mthreads`]: each GPU's own `/dev/mtgpu.N`.

pub mod amd;
pub mod ascend;
pub mod handover;
pub mod intel;
pub mod mthreads;
pub mod nvidia;

pub use handover::{Handover, HandoverError, VISIBILITY_VARIABLES, Vendor};

use super::pool::PoolGpu;
use crate::manifest::GpuDriver;

/// Every vendor cibox hands units of over.
pub const VENDORS: [&dyn Vendor; 5] = [
    &nvidia::Nvidia,
    &amd::Amd,
    &ascend::Ascend,
    &intel::Intel,
    &mthreads::MooreThreads,
];

/// A vendor and its units of a lease.
type Share = (&'static dyn Vendor, Vec<PoolGpu>);

/// Each vendor's share of `units`, in the order of `units`; an identity no vendor owns
/// is refused.
fn by_vendor(units: &[PoolGpu]) -> Result<Vec<Share>, HandoverError> {
    let mut out: Vec<Share> = Vec::new();
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
    let fake = crate::gpu::fake::is_on();
    for (vendor, mine) in by_vendor(units)? {
        if fake {
            // Fake GPUs: the variables that name them, and nothing of a device.
            all.merge(Handover {
                ids: mine.iter().map(|g| g.uuid.clone()).collect(),
                env: vendor.host_env(&mine),
                ..Handover::default()
            });
            continue;
        }
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
