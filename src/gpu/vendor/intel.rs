//! Intel: GPUs named by their PCI address (`XPU-0000:29:00.0`), handed to a container as
//! Intel's own container instructions give them (Intel GPU device plugin, SGLang's
//! `scripts/ci/xpu/xpu_ci_start_container.sh`), but narrower: each leased GPU's own
//! `/dev/dri/renderD<N>` and `card<N>` (found in sysfs: the DRM class entries whose
//! `device` link is that PCI address), never the whole `/dev/dri`; the group that owns
//! them (`render`), so the batch may open them; and `ZE_AFFINITY_MASK` (Level Zero's:
//! `0,1,…` in the container, the tool's device IDs on the host). No runtime is
//! involved. Each node must be a character device with exactly the numbers sysfs gives
//! it; a GPU without a render node fails the hand-over (fail closed).

use std::os::unix::fs::MetadataExt;

use super::amd::{check_node, dev_numbers, pci_of};
use super::handover::{DeviceNode, Handover, HandoverError, Vendor};
use crate::gpu::pool::PoolGpu;
use crate::manifest::{GpuDriver, is_xpu_id};

pub struct Intel;

impl Vendor for Intel {
    fn name(&self) -> &'static str {
        "Intel"
    }

    fn owns(&self, id: &str) -> bool {
        is_xpu_id(id)
    }

    fn container(&self, units: &[PoolGpu], _driver: GpuDriver) -> Result<Handover, HandoverError> {
        let mut devices = Vec::new();
        for u in units {
            devices.extend(nodes_of(&u.uuid).map_err(|why| HandoverError::Unresolved {
                vendor: "Intel",
                id: u.uuid.clone(),
                why,
            })?);
        }
        let mut groups = Vec::new();
        for d in &devices {
            let gid = std::fs::symlink_metadata(&d.host)
                .map(|m| m.gid())
                .unwrap_or(0);
            if gid != 0 && !groups.contains(&gid) {
                groups.push(gid);
            }
        }
        let indices: Vec<String> = (0..units.len()).map(|i| i.to_string()).collect();
        Ok(Handover {
            ids: units.iter().map(|g| g.uuid.clone()).collect(),
            devices,
            requests: Vec::new(),
            groups,
            env: vec![("ZE_AFFINITY_MASK".into(), indices.join(","))],
            mounts: Vec::new(),
        })
    }

    fn host_env(&self, units: &[PoolGpu]) -> Vec<(String, String)> {
        let ids: Vec<String> = units.iter().map(|g| g.index.to_string()).collect();
        vec![("ZE_AFFINITY_MASK".into(), ids.join(","))]
    }
}

/// The render and card nodes of the GPU at PCI address `id` names, from sysfs.
fn nodes_of(id: &str) -> Result<Vec<DeviceNode>, String> {
    let pci = id.strip_prefix("XPU-").unwrap_or(id);
    let class = crate::util::sysfs_root().join("class/drm");
    let dev = crate::util::dev_root().join("dri");
    let entries = std::fs::read_dir(&class).map_err(|e| format!("{}: {e}", class.display()))?;
    let mut nodes = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let node = ["renderD", "card"].iter().any(|p| {
            name.strip_prefix(p)
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        });
        if !node || pci_of(&e.path()).ok().as_deref() != Some(pci) {
            continue;
        }
        let rdev = dev_numbers(&e.path().join("dev"))?;
        let host = dev.join(&name);
        check_node(&host, rdev)?;
        nodes.push(DeviceNode {
            host,
            container: format!("/dev/dri/{name}"),
        });
    }
    if !nodes.iter().any(|n| n.container.contains("renderD")) {
        return Err(format!("no render node under {} is its", class.display()));
    }
    nodes.sort_by(|a, b| a.container.cmp(&b.container));
    Ok(nodes)
}
