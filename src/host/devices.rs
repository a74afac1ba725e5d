//! Devices and seccomp profiles the host grants: `grants.devices` (patterns of host
//! device paths a batch may be given, RDMA's `/dev/infiniband/*` say) and
//! `grants.seccomp` (profiles by name: a JSON file the admin owns, or `unconfined`).
//! A manifest names a device path or pattern and a profile's name; what it gets is
//! expanded and checked on the host before each run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::admin_file::{read_small, trusted_file};
use super::error::PolicyError;

/// A seccomp profile the policy names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeccompProfile {
    /// No filter at all.
    Unconfined,
    /// The engine's profile format, in a file only root (or the invoking user) can
    /// change.
    File(PathBuf),
}

/// Reads `grants.devices` and `grants.seccomp`.
pub(super) fn device_grants(
    devices: Vec<String>,
    seccomp: BTreeMap<String, String>,
    here: &dyn Fn(&[&str], String) -> PolicyError,
) -> Result<(Vec<String>, BTreeMap<String, SeccompProfile>), PolicyError> {
    for (i, d) in devices.iter().enumerate() {
        let ok = d.starts_with("/dev/")
            && d.len() > 5
            && !d.split('/').any(|c| c == "..")
            && glob::Pattern::new(d).is_ok();
        if !ok {
            return Err(here(
                &["grants", "devices", &i.to_string()],
                format!("`{d}` is not a device path or pattern under /dev"),
            ));
        }
    }
    let mut profiles = BTreeMap::new();
    for (name, value) in seccomp {
        let profile = match value.as_str() {
            "unconfined" => SeccompProfile::Unconfined,
            p if Path::new(p).is_absolute() => SeccompProfile::File(PathBuf::from(p)),
            _ => {
                return Err(here(
                    &["grants", "seccomp", &name],
                    format!("`{value}` is neither `unconfined` nor an absolute path to a profile"),
                ));
            }
        };
        if name == "default" {
            return Err(here(
                &["grants", "seccomp", &name],
                "`default` is the engine's own profile and needs no grant".into(),
            ));
        }
        profiles.insert(name, profile);
    }
    Ok((devices, profiles))
}

/// Whether the manifest's device path or pattern `asked` lies within a granted one.
/// A pattern is taken as text, so `/dev/infiniband/uverbs*` lies within
/// `/dev/infiniband/*`, and `/dev/*` within nothing narrower.
pub fn device_granted(granted: &[String], asked: &str) -> bool {
    granted.iter().any(|g| {
        glob::Pattern::new(g).is_ok_and(|p| {
            p.matches_with(
                asked,
                glob::MatchOptions {
                    require_literal_separator: true,
                    ..Default::default()
                },
            )
        })
    })
}

/// The host devices `asked` names now: each pattern expanded, each match resolved
/// (links followed) to a character or block device under `/dev` that a granted pattern
/// still covers, in folders only root (or the invoking user) can change, and none a
/// GPU's by its device numbers (see [`gpu_device`]), whatever its name says. A pattern
/// that matches nothing is refused (the batch would run without what it needs) unless
/// it is one of `optional`: those are returned second, as absent here.
pub fn expand_devices(
    granted: &[String],
    asked: &[String],
    optional: &[String],
) -> Result<(Vec<PathBuf>, Vec<String>), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let gpus = GpuNumbers::of_this_host();
    let me = nix::unistd::geteuid().as_raw();
    let mut out = Vec::new();
    let mut absent = Vec::new();
    for pattern in asked {
        let paths = glob::glob(pattern).map_err(|e| format!("device `{pattern}`: {e}"))?;
        let mut found = 0;
        for p in paths.flatten() {
            let real =
                std::fs::canonicalize(&p).map_err(|e| format!("device {}: {e}", p.display()))?;
            let named = if real == p {
                format!("device `{pattern}` names {}", p.display())
            } else {
                format!(
                    "device `{pattern}` names {}, which resolves to {}",
                    p.display(),
                    real.display()
                )
            };
            let md =
                std::fs::metadata(&real).map_err(|e| format!("device {}: {e}", real.display()))?;
            let ft = md.file_type();
            if !(ft.is_char_device() || ft.is_block_device()) {
                return Err(format!("{} is not a device", p.display()));
            }
            let whose = ft
                .is_char_device()
                .then(|| gpus.judge(md.rdev()).or_else(|| vendor_node(&real)))
                .flatten();
            if let Some(whose) = whose {
                return Err(format!(
                    "{named}, {whose}: GPUs are leased by cibox (`gpus:`), never mapped by path; name only the devices the batch needs beyond its GPUs"
                ));
            }
            let text = real.to_string_lossy();
            if !text.starts_with("/dev/") || !device_granted(granted, &text) {
                return Err(format!(
                    "{} resolves to {}, which the host policy's grants.devices does not cover",
                    p.display(),
                    real.display()
                ));
            }
            if let Some(why) = crate::ownership::changeable_by_others(&real, me) {
                return Err(format!("{named}, which {why}"));
            }
            if !out.contains(&real) {
                out.push(real);
            }
            found += 1;
        }
        if found == 0 {
            if optional.contains(pattern) {
                absent.push(pattern.clone());
                continue;
            }
            return Err(format!(
                "device `{pattern}` matches no device on this host (`{{path: {pattern}, optional: true}}` runs without it where a host lacks it)"
            ));
        }
    }
    Ok((out, absent))
}

/// NVIDIA's fixed character major (`/dev/nvidia0…`, `nvidiactl`, `nvidia-modeset`).
const NVIDIA_MAJOR: u64 = 195;
/// The DRM major (`/dev/dri/card*`, `renderD*`): AMD's and Intel's GPUs, NVIDIA's too.
const DRM_MAJOR: u64 = 226;
/// The misc major, under which WSL's `/dev/dxg` has a minor of its own.
const MISC_MAJOR: u64 = 10;

/// The device numbers of GPUs on this host: NVIDIA's and DRM's fixed majors, and those
/// `/proc/devices` lists for the drivers that take one when they load (`nvidia-uvm`,
/// `nvidia-caps`, `nvidia-nvswitch`, …, AMD's `kfd`), and `/proc/misc`'s `dxg`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuNumbers {
    /// Character majors, with the driver's name.
    majors: Vec<(u64, String)>,
    /// Minors of the misc major.
    misc: Vec<(u64, String)>,
}

impl GpuNumbers {
    /// From this host's `/proc/devices` and `/proc/misc` (either unreadable: the fixed
    /// majors alone), and the major sysfs gives AMD's compute driver
    /// (`class/kfd/kfd/dev`: the one cibox checks `/dev/kfd` against when it hands AMD
    /// GPUs over).
    pub fn of_this_host() -> GpuNumbers {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let mut numbers = GpuNumbers::from_lists(&read("/proc/devices"), &read("/proc/misc"));
        let kfd = crate::util::sysfs_root().join("class/kfd/kfd/dev");
        if let Some(major) = std::fs::read_to_string(kfd)
            .ok()
            .and_then(|t| t.trim().split_once(':')?.0.parse::<u64>().ok())
            && !numbers.majors.iter().any(|(m, _)| *m == major)
        {
            numbers.majors.push((major, "kfd".into()));
        }
        numbers
    }

    /// From the text of `/proc/devices` and `/proc/misc`.
    pub fn from_lists(devices: &str, misc: &str) -> GpuNumbers {
        let mut majors = vec![
            (NVIDIA_MAJOR, "nvidia".to_string()),
            (DRM_MAJOR, "drm".to_string()),
        ];
        // Character devices come first; block devices (after their heading) are not
        // GPUs.
        for line in devices.lines() {
            if line.trim_start().starts_with("Block devices") {
                break;
            }
            let mut words = line.split_whitespace();
            let (Some(Ok(major)), Some(name)) = (words.next().map(str::parse::<u64>), words.next())
            else {
                continue;
            };
            if is_gpu_driver(name) && !majors.iter().any(|(m, _)| *m == major) {
                majors.push((major, name.to_string()));
            }
        }
        let misc = misc
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                let minor = words.next()?.parse::<u64>().ok()?;
                let name = words.next()?;
                is_gpu_driver(name).then(|| (minor, name.to_string()))
            })
            .collect();
        GpuNumbers { majors, misc }
    }

    /// Whose GPU the character device `rdev` is (`char device 195:0, NVIDIA's GPU
    /// driver's (nvidia)`); `None` when it is no GPU's.
    pub fn judge(&self, rdev: u64) -> Option<String> {
        let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
        let name = self
            .majors
            .iter()
            .find(|(m, _)| *m == major)
            .map(|(_, n)| n)
            .or_else(|| {
                (major == MISC_MAJOR)
                    .then(|| self.misc.iter().find(|(m, _)| *m == minor).map(|(_, n)| n))
                    .flatten()
            })?;
        let vendor = match name.as_str() {
            n if n.starts_with("nvidia") => "NVIDIA's GPU driver's",
            "kfd" => "AMD's GPU compute driver's",
            "drm" => "a GPU's (DRM)",
            "dxg" => "WSL's GPU driver's",
            _ => "a GPU driver's",
        };
        Some(format!("char device {major}:{minor}, {vendor} ({name})"))
    }
}

/// Whether a driver's name in `/proc/devices` or `/proc/misc` is a GPU's (an NPU's:
/// Ascend's `davinci…`, `devdrv…`; Moore Threads' `mtgpu…`).
fn is_gpu_driver(name: &str) -> bool {
    name.starts_with("nvidia")
        || name.starts_with("davinci")
        || name.starts_with("devdrv")
        || name.starts_with("mtgpu")
        || matches!(name, "kfd" | "drm" | "dxg" | "devmm_svm" | "hisi_hdc")
}

/// Whose the device file at `real` is by its name, for the vendors whose drivers'
/// numbers are given at load time under names cibox cannot be sure of: Ascend's
/// (`/dev/davinci*`, `davinci_manager`, `devmm_svm`, `hisi_hdc`) and Moore Threads'
/// (`/dev/mtgpu*`). Leased by cibox, never mapped by path.
fn vendor_node(real: &Path) -> Option<String> {
    let name = real.file_name()?.to_str()?;
    let vendor = if name.starts_with("davinci") || matches!(name, "devmm_svm" | "hisi_hdc") {
        "Ascend's NPU driver's"
    } else if name.starts_with("mtgpu") {
        "Moore Threads' GPU driver's"
    } else {
        return None;
    };
    Some(format!("{}, {vendor}", real.display()))
}

/// The engine's security option for `profile`: `seccomp=unconfined`, or the profile's
/// JSON, read from a file only root (or the invoking user) can change.
pub fn seccomp_option(name: &str, profile: &SeccompProfile) -> Result<String, String> {
    match profile {
        SeccompProfile::Unconfined => Ok("seccomp=unconfined".into()),
        SeccompProfile::File(path) => {
            let fail =
                |why: String| format!("seccomp profile `{name}` ({}): {why}", path.display());
            trusted_file(path).map_err(fail)?;
            let bytes = read_small(path).map_err(fail)?;
            let json: serde_json::Value =
                serde_json::from_slice(&bytes).map_err(|e| fail(format!("is not JSON: {e}")))?;
            if !json.is_object() {
                return Err(fail("is not a profile (a JSON object)".into()));
            }
            Ok(format!("seccomp={json}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_lies_within_a_granted_one_as_text() {
        let g = vec!["/dev/infiniband/*".to_string()];
        assert!(device_granted(&g, "/dev/infiniband/uverbs0"));
        assert!(device_granted(&g, "/dev/infiniband/uverbs*"));
        assert!(device_granted(&g, "/dev/infiniband/*"));
        assert!(!device_granted(&g, "/dev/*"));
        assert!(!device_granted(&g, "/dev/infiniband/x/y"));
        assert!(!device_granted(&g, "/dev/sda"));
    }

    #[test]
    fn gpus_are_told_by_their_device_numbers() {
        let devices = "Character devices:\n  1 mem\n 10 misc\n195 nvidia-frontend\n226 drm\n235 nvidia-caps\n510 nvidia-uvm\n511 kfd\n\nBlock devices:\n  7 loop\n259 nvidia-fake\n";
        let misc = " 58 dxg\n229 fuse\n";
        let gpus = GpuNumbers::from_lists(devices, misc);
        let dev = |major, minor| nix::sys::stat::makedev(major, minor);
        let said = gpus.judge(dev(195, 0)).unwrap();
        assert!(said.contains("195:0") && said.contains("NVIDIA"), "{said}");
        assert!(gpus.judge(dev(195, 255)).is_some(), "nvidiactl");
        assert!(gpus.judge(dev(510, 0)).unwrap().contains("nvidia-uvm"));
        assert!(gpus.judge(dev(235, 1)).unwrap().contains("nvidia-caps"));
        assert!(gpus.judge(dev(511, 0)).unwrap().contains("AMD"));
        assert!(gpus.judge(dev(226, 128)).is_some(), "a render node");
        assert!(gpus.judge(dev(10, 58)).unwrap().contains("dxg"));
        assert_eq!(gpus.judge(dev(10, 229)), None, "fuse");
        assert_eq!(gpus.judge(dev(1, 3)), None, "/dev/null");
        assert_eq!(
            gpus.judge(dev(259, 0)),
            None,
            "a block major is not a char one"
        );
        // Without the lists, the fixed majors still count.
        let bare = GpuNumbers::from_lists("", "");
        assert!(bare.judge(dev(195, 3)).is_some() && bare.judge(dev(226, 0)).is_some());
    }
}
