//! Moore Threads: GPUs named `MTT-` and their UUID, handed to a container as the MUSA
//! container instructions give them without the toolkit's runtime (`--device
//! /dev/mtgpu.N`): each leased GPU's own `/dev/mtgpu.<index>` (its index as
//! mthreads-gmi gives it), no other GPU's, the group that owns it, and
//! `MUSA_VISIBLE_DEVICES` (`0,1,…` in the container, the tool's indices on the host).
//! The node must be a character device, not a link: anything else fails the hand-over
//! (fail closed).

use std::os::unix::fs::{FileTypeExt, MetadataExt};

use super::handover::{DeviceNode, Handover, HandoverError, Vendor};
use crate::gpu::pool::PoolGpu;
use crate::manifest::{GpuDriver, is_mtt_id};

pub struct MooreThreads;

impl Vendor for MooreThreads {
    fn name(&self) -> &'static str {
        "Moore Threads"
    }

    fn owns(&self, id: &str) -> bool {
        is_mtt_id(id)
    }

    fn container(&self, units: &[PoolGpu], _driver: GpuDriver) -> Result<Handover, HandoverError> {
        let dev = crate::util::dev_root();
        let mut devices = Vec::new();
        let mut groups = Vec::new();
        for u in units {
            let host = dev.join(format!("mtgpu.{}", u.index));
            let fail = |why: String| HandoverError::Unresolved {
                vendor: "Moore Threads",
                id: u.uuid.clone(),
                why,
            };
            let md = std::fs::symlink_metadata(&host)
                .map_err(|e| fail(format!("{}: {e}", host.display())))?;
            if !md.file_type().is_char_device() {
                return Err(fail(format!(
                    "{} is not a character device",
                    host.display()
                )));
            }
            if md.gid() != 0 && !groups.contains(&md.gid()) {
                groups.push(md.gid());
            }
            devices.push(DeviceNode {
                host,
                container: format!("/dev/mtgpu.{}", u.index),
            });
        }
        let indices: Vec<String> = (0..units.len()).map(|i| i.to_string()).collect();
        Ok(Handover {
            ids: units.iter().map(|g| g.uuid.clone()).collect(),
            devices,
            requests: Vec::new(),
            groups,
            env: vec![("MUSA_VISIBLE_DEVICES".into(), indices.join(","))],
            mounts: Vec::new(),
        })
    }

    fn host_env(&self, units: &[PoolGpu]) -> Vec<(String, String)> {
        let ids: Vec<String> = units.iter().map(|g| g.index.to_string()).collect();
        vec![("MUSA_VISIBLE_DEVICES".into(), ids.join(","))]
    }
}
