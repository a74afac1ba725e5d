//! AMD: GPUs named by their unique ID (`GPU-18f68e602b8a790f`), handed to a container
//! as device files, as ROCm's containers get them: `/dev/kfd` (the compute driver,
//! shared) and each leased GPU's own `/dev/dri/renderD<N>` and `card<N>`, no other
//! GPU's. No runtime is involved, so what reaches the container is exactly what is
//! mapped.
//!
//! Which nodes are a GPU's is read from sysfs, never guessed from an index: the KFD
//! topology node whose `unique_id` is the GPU's gives its `drm_render_minor`; the render
//! node's `device` link gives its PCI address, and the `card` node with the same PCI
//! address is its card. Each device file must be a character device with exactly the
//! numbers sysfs gives it (`dev`), not a link: anything that does not agree fails the
//! hand-over (fail closed), and the batch does not start.
//!
//! In the container, `ROCR_VISIBLE_DEVICES` names the leased GPUs by unique ID and
//! `HIP_VISIBLE_DEVICES` indexes them (`0,1,…`: what the container sees).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::handover::{DeviceNode, Handover, HandoverError, Vendor};
use crate::gpu::pool::PoolGpu;
use crate::gpu::probe::rocm_smi::property;
use crate::manifest::{GpuDriver, is_amd_gpu_id};

pub struct Amd;

impl Vendor for Amd {
    fn name(&self) -> &'static str {
        "AMD"
    }

    fn owns(&self, id: &str) -> bool {
        is_amd_gpu_id(id)
    }

    /// The engine's GPU driver does not matter: AMD's GPUs need no runtime.
    fn container(&self, units: &[PoolGpu], _driver: GpuDriver) -> Result<Handover, HandoverError> {
        let machine = Machine {
            sysfs: crate::util::sysfs_root(),
            dev: crate::util::dev_root(),
        };
        let mut devices = vec![machine.kfd(units)?];
        for u in units {
            devices.extend(machine.nodes_of(&u.uuid)?);
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
        Ok(Handover {
            ids: units.iter().map(|g| g.uuid.clone()).collect(),
            devices,
            requests: Vec::new(),
            groups,
            env: self.host_env(units),
            mounts: Vec::new(),
        })
    }

    fn host_env(&self, units: &[PoolGpu]) -> Vec<(String, String)> {
        let ids: Vec<&str> = units.iter().map(|g| g.uuid.as_str()).collect();
        let indices: Vec<String> = (0..units.len()).map(|i| i.to_string()).collect();
        vec![
            ("ROCR_VISIBLE_DEVICES".into(), ids.join(",")),
            ("HIP_VISIBLE_DEVICES".into(), indices.join(",")),
        ]
    }
}

/// Where this machine's sysfs and device files are.
struct Machine {
    sysfs: PathBuf,
    dev: PathBuf,
}

/// The DRM character major (`/dev/dri/*`).
const DRM_MAJOR: u64 = 226;

impl Machine {
    fn unresolved(id: &str, why: String) -> HandoverError {
        HandoverError::Unresolved {
            vendor: "AMD",
            id: id.to_string(),
            why,
        }
    }

    /// `/dev/kfd`, checked against the numbers sysfs gives the KFD.
    fn kfd(&self, units: &[PoolGpu]) -> Result<DeviceNode, HandoverError> {
        let id = units.first().map_or("", |g| g.uuid.as_str());
        let numbers = self.sysfs.join("class/kfd/kfd/dev");
        let rdev = dev_numbers(&numbers).map_err(|why| Self::unresolved(id, why))?;
        let host = self.dev.join("kfd");
        check_node(&host, rdev).map_err(|why| Self::unresolved(id, why))?;
        Ok(DeviceNode {
            host,
            container: "/dev/kfd".into(),
        })
    }

    /// The render node and card node of the GPU with identity `id`.
    fn nodes_of(&self, id: &str) -> Result<Vec<DeviceNode>, HandoverError> {
        let fail = |why: String| Self::unresolved(id, why);
        let unique = id
            .strip_prefix("GPU-")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or_else(|| fail("not an AMD GPU's unique ID".into()))?;
        let minor = self.render_minor(unique).map_err(fail)?;
        let render = format!("renderD{minor}");
        let class = self.sysfs.join("class/drm");
        let rdev = dev_numbers(&class.join(&render).join("dev")).map_err(fail)?;
        if nix::sys::stat::major(rdev) != DRM_MAJOR || nix::sys::stat::minor(rdev) != minor {
            return Err(fail(format!(
                "{} says {}:{}, not {DRM_MAJOR}:{minor}",
                class.join(&render).join("dev").display(),
                nix::sys::stat::major(rdev),
                nix::sys::stat::minor(rdev)
            )));
        }
        let host = self.dev.join("dri").join(&render);
        check_node(&host, rdev).map_err(fail)?;
        let mut nodes = vec![DeviceNode {
            host,
            container: format!("/dev/dri/{render}"),
        }];
        let pci = pci_of(&class.join(&render)).map_err(fail)?;
        // Its card node, when it has one (a compute-only GPU's render node is enough).
        let entries =
            std::fs::read_dir(&class).map_err(|e| fail(format!("{}: {e}", class.display())))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let is_card = name
                .strip_prefix("card")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            if !is_card || pci_of(&e.path()).ok().as_deref() != Some(pci.as_str()) {
                continue;
            }
            let rdev = dev_numbers(&e.path().join("dev")).map_err(fail)?;
            let host = self.dev.join("dri").join(&name);
            check_node(&host, rdev).map_err(fail)?;
            nodes.push(DeviceNode {
                host,
                container: format!("/dev/dri/{name}"),
            });
        }
        Ok(nodes)
    }

    /// The render minor of the GPU whose KFD topology node has `unique_id`: exactly
    /// one node must have it.
    fn render_minor(&self, unique_id: u64) -> Result<u64, String> {
        let dir = self.sysfs.join("class/kfd/kfd/topology/nodes");
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut found = Vec::new();
        for e in entries.flatten() {
            let Ok(props) = std::fs::read_to_string(e.path().join("properties")) else {
                continue;
            };
            if property(&props, "unique_id") == Some(unique_id) {
                let minor = property(&props, "drm_render_minor").ok_or_else(|| {
                    format!(
                        "{} has no drm_render_minor",
                        e.path().join("properties").display()
                    )
                })?;
                found.push(minor);
            }
        }
        match found.as_slice() {
            [minor] => Ok(*minor),
            [] => Err(format!(
                "no KFD topology node under {} has its unique_id",
                dir.display()
            )),
            _ => Err(format!(
                "{} KFD topology nodes under {} have its unique_id",
                found.len(),
                dir.display()
            )),
        }
    }
}

/// The device numbers a sysfs `dev` file gives (`226:128`).
pub(super) fn dev_numbers(path: &Path) -> Result<u64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (major, minor) = text
        .trim()
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        .ok_or_else(|| format!("{}: `{}` is not MAJOR:MINOR", path.display(), text.trim()))?;
    Ok(nix::sys::stat::makedev(major, minor))
}

/// The PCI address a sysfs class entry's `device` link names (`0000:c1:00.0`).
pub(super) fn pci_of(entry: &Path) -> Result<String, String> {
    let link = entry.join("device");
    let target = std::fs::read_link(&link).map_err(|e| format!("{}: {e}", link.display()))?;
    target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| format!("{} names no device", link.display()))
}

/// Whether `path` is a character device (not a link to one) of numbers `rdev`.
pub(super) fn check_node(path: &Path, rdev: u64) -> Result<(), String> {
    let md = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !md.file_type().is_char_device() {
        return Err(format!("{} is not a character device", path.display()));
    }
    if md.rdev() != rdev {
        return Err(format!(
            "{} is {}:{}, and sysfs says {}:{}",
            path.display(),
            nix::sys::stat::major(md.rdev()),
            nix::sys::stat::minor(md.rdev()),
            nix::sys::stat::major(rdev),
            nix::sys::stat::minor(rdev)
        ));
    }
    Ok(())
}
