//! Huawei Ascend: NPU chips named by their PCI address (`NPU-0000:c1:00.0`), handed to a
//! container as Ascend's own container runtime (Ascend Docker Runtime) and Huawei's
//! documented `docker run` for CANN images give them:
//!
//! - the chip's own `/dev/davinciN` (N: its device ID as npu-smi gives it), no other
//!   chip's;
//! - the driver's shared nodes: `/dev/davinci_manager`, `/dev/devmm_svm` (shared
//!   virtual memory), `/dev/hisi_hdc` (host-device communication);
//! - the driver's user space, read-only from the host: `/usr/local/Ascend/driver/lib64`
//!   and `/usr/local/Ascend/driver/version.info` (required: CANN's runtime loads them),
//!   and where the host has them `/usr/local/dcmi`, `/usr/local/bin/npu-smi` and
//!   `/etc/ascend_install.info` (verl's jobs run `npu-smi info` as a step);
//! - the group that owns the device files (`HwHiAiUser`'s), so the batch (another uid,
//!   no capability) may open them;
//! - `ASCEND_RT_VISIBLE_DEVICES`: `0,1,…` in the container (the chips it sees, numbered
//!   from 0), the device IDs on the host (`gpu exec`).
//!
//! Each device file must be a character device, not a link, and each chip's
//! `davinciN` must exist: anything else fails the hand-over (fail closed), and the
//! batch does not start. Ascend's driver publishes no sysfs class to check the numbers
//! against (AMD's KFD topology does), so the node is found by its device ID alone.
//! The host's paths are read under `CIBOX_DEV_ROOT` and `CIBOX_ASCEND_ROOT` (`/`), for
//! tests, as AMD's are under `CIBOX_SYSFS_ROOT`.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::handover::{DeviceNode, Handover, HandoverError, ReadOnlyMount, Vendor};
use crate::gpu::pool::PoolGpu;
use crate::manifest::{GpuDriver, is_npu_id};

pub struct Ascend;

/// The driver's nodes every chip's user needs.
const SHARED_NODES: [&str; 3] = ["davinci_manager", "devmm_svm", "hisi_hdc"];
/// The driver's user space: (path, required).
const USER_SPACE: [(&str, bool); 5] = [
    ("/usr/local/Ascend/driver/lib64", true),
    ("/usr/local/Ascend/driver/version.info", true),
    ("/usr/local/dcmi", false),
    ("/usr/local/bin/npu-smi", false),
    ("/etc/ascend_install.info", false),
];

/// Where the host's Ascend files are: `/`, or `CIBOX_ASCEND_ROOT` (for tests).
fn host_root() -> PathBuf {
    std::env::var_os("CIBOX_ASCEND_ROOT")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/"), PathBuf::from)
}

impl Vendor for Ascend {
    fn name(&self) -> &'static str {
        "Ascend"
    }

    fn owns(&self, id: &str) -> bool {
        is_npu_id(id)
    }

    /// The engine's GPU driver does not matter: Ascend's NPUs go by device file.
    fn container(&self, units: &[PoolGpu], _driver: GpuDriver) -> Result<Handover, HandoverError> {
        let id = units.first().map_or("", |g| g.uuid.as_str());
        let fail = |id: &str, why: String| HandoverError::Unresolved {
            vendor: "Ascend",
            id: id.to_string(),
            why,
        };
        let dev = crate::util::dev_root();
        let mut devices = Vec::new();
        for u in units {
            let name = format!("davinci{}", u.index);
            devices.push(node(&dev, &name).map_err(|why| fail(&u.uuid, why))?);
        }
        for name in SHARED_NODES {
            devices.push(node(&dev, name).map_err(|why| fail(id, why))?);
        }
        distinct(&devices).map_err(|why| fail(id, why))?;
        let root = host_root();
        let mut mounts = Vec::new();
        for (path, required) in USER_SPACE {
            let host = root.join(path.trim_start_matches('/'));
            match std::fs::symlink_metadata(&host) {
                Ok(md) if !md.file_type().is_symlink() => {
                    driver_own(&host, &md).map_err(|why| fail(id, why))?;
                    mounts.push(ReadOnlyMount {
                        host,
                        container: path.to_string(),
                    });
                }
                Ok(_) => {
                    return Err(fail(
                        id,
                        format!("{} is a link, not the driver's own", host.display()),
                    ));
                }
                Err(_) if !required => {}
                Err(e) => return Err(fail(id, format!("{}: {e}", host.display()))),
            }
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
            env: vec![("ASCEND_RT_VISIBLE_DEVICES".into(), indices.join(","))],
            mounts,
        })
    }

    fn host_env(&self, units: &[PoolGpu]) -> Vec<(String, String)> {
        let ids: Vec<String> = units.iter().map(|g| g.index.to_string()).collect();
        vec![("ASCEND_RT_VISIBLE_DEVICES".into(), ids.join(","))]
    }
}

/// A folder or file of the driver's user space is bound into every NPU batch: it must be
/// reached through no link, and be one only root or cibox's user can change, all the
/// way down (else another local user decides what every batch loads).
fn driver_own(host: &Path, md: &std::fs::Metadata) -> Result<(), String> {
    let real = std::fs::canonicalize(host).map_err(|e| format!("{}: {e}", host.display()))?;
    if real != host {
        return Err(format!(
            "{} is reached through a link (it is {}), not the driver's own",
            host.display(),
            real.display()
        ));
    }
    let me = rustix::process::geteuid().as_raw();
    if (md.uid() != 0 && md.uid() != me) || md.mode() & 0o022 != 0 {
        return Err(format!(
            "{} may be changed by others (owner {}, mode {:o})",
            host.display(),
            md.uid(),
            md.mode() & 0o7777
        ));
    }
    match crate::ownership::changeable_by_others(host, me) {
        Some(why) => Err(format!("{}: {why}", host.display())),
        None => Ok(()),
    }
}

/// No two of the nodes handed over may be one device (a `davinci1` made with
/// `davinci0`'s numbers would give one chip to two leases): Ascend's driver gives each
/// chip and each shared node numbers of its own. Their numbers themselves are not
/// checked: the driver takes its majors at load time, under names no documentation
/// cibox could find ties to each node.
fn distinct(devices: &[DeviceNode]) -> Result<(), String> {
    let mut seen: Vec<(u64, &Path)> = Vec::new();
    for d in devices {
        let rdev = std::fs::symlink_metadata(&d.host)
            .map_err(|e| format!("{}: {e}", d.host.display()))?
            .rdev();
        if let Some((_, other)) = seen.iter().find(|(r, _)| *r == rdev) {
            return Err(format!(
                "{} and {} are one device ({}:{}): a chip's node must be its own",
                other.display(),
                d.host.display(),
                nix::sys::stat::major(rdev),
                nix::sys::stat::minor(rdev)
            ));
        }
        seen.push((rdev, &d.host));
    }
    Ok(())
}

/// `dev/<name>`, which must be a character device (not a link to one).
fn node(dev: &Path, name: &str) -> Result<DeviceNode, String> {
    let host = dev.join(name);
    let md = std::fs::symlink_metadata(&host).map_err(|e| format!("{}: {e}", host.display()))?;
    if !md.file_type().is_char_device() {
        return Err(format!("{} is not a character device", host.display()));
    }
    Ok(DeviceNode {
        host,
        container: format!("/dev/{name}"),
    })
}

#[cfg(test)]
mod driver_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A chip's node with another chip's numbers is refused: one chip, two leases.
    #[test]
    fn two_nodes_of_one_device_are_refused() {
        assert!(nix::unistd::geteuid().is_root(), "mknod needs root");
        let dev = tempfile::tempdir().unwrap();
        for (n, minor) in [
            ("davinci0", 0),
            ("davinci1", 0),
            ("davinci_manager", 10),
            ("devmm_svm", 11),
            ("hisi_hdc", 12),
        ] {
            nix::sys::stat::mknod(
                &dev.path().join(n),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                nix::sys::stat::makedev(4001, minor),
            )
            .unwrap();
        }
        let nodes: Vec<DeviceNode> = ["davinci0", "davinci1", "davinci_manager"]
            .iter()
            .map(|n| node(dev.path(), n).unwrap())
            .collect();
        let err = distinct(&nodes).unwrap_err();
        assert!(err.contains("are one device (4001:0)"), "{err}");
        assert!(distinct(&[nodes[0].clone(), nodes[2].clone()]).is_ok());
    }

    /// The driver's folder reached through a link in a parent (`usr/local/Ascend` a
    /// link to a folder anyone may write) is refused (found by an attack: only the
    /// last component was checked).
    #[test]
    fn a_driver_folder_behind_a_link_to_a_folder_anyone_may_write_is_refused() {
        assert!(nix::unistd::geteuid().is_root(), "mknod needs root");
        let dev = tempfile::tempdir().unwrap();
        for (minor, n) in ["davinci0", "davinci_manager", "devmm_svm", "hisi_hdc"]
            .iter()
            .enumerate()
        {
            nix::sys::stat::mknod(
                &dev.path().join(n),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                nix::sys::stat::makedev(4001, minor as u64),
            )
            .unwrap();
        }
        let root = tempfile::tempdir().unwrap();
        let evil = tempfile::tempdir().unwrap();
        std::fs::set_permissions(evil.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::create_dir_all(evil.path().join("driver/lib64")).unwrap();
        std::fs::set_permissions(
            evil.path().join("driver/lib64"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        std::fs::write(evil.path().join("driver/version.info"), "x").unwrap();
        std::fs::create_dir_all(root.path().join("usr/local")).unwrap();
        std::os::unix::fs::symlink(evil.path(), root.path().join("usr/local/Ascend")).unwrap();
        unsafe {
            std::env::set_var("CIBOX_DEV_ROOT", dev.path());
            std::env::set_var("CIBOX_ASCEND_ROOT", root.path());
        }
        let units = [PoolGpu {
            index: 0,
            uuid: "NPU-0000:01:00.0".into(),
            parent: None,
        }];
        let h = Ascend.container(&units, GpuDriver::Nvidia);
        assert!(
            h.is_err(),
            "a driver folder behind a link, writable by anyone, was handed over: {:?}",
            h.map(|h| h.mounts)
        );
    }
}
