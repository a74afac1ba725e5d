//! A run's devices and seccomp profiles, as the host has them now: each batch's device
//! patterns expanded and checked against the host policy's grants, and each profile it
//! names read from where the policy keeps it (see [`crate::host::devices`]).

use std::path::PathBuf;

use crate::host::HostPolicy;
use crate::host::devices::{expand_devices, seccomp_option};
use crate::manifest::{Manifest, ManifestError};

/// What one batch gets beyond GPUs.
#[derive(Debug, Clone, Default)]
pub struct BatchDevices {
    pub devices: Vec<PathBuf>,
    /// Optional device patterns that match nothing on this host.
    pub absent: Vec<String>,
    /// The profile's name and the engine's security option for it.
    pub seccomp: Option<(String, String)>,
}

/// Each batch's devices and profile, by batch name.
pub type HostDevices = indexmap::IndexMap<String, BatchDevices>;

/// Expands and checks the devices and profiles of the batches `names` on this host;
/// a refusal names the batch and where its manifest asks.
pub fn check_devices(
    manifest: &Manifest,
    names: &[String],
    policy: &HostPolicy,
) -> Result<HostDevices, ManifestError> {
    let mut out = HostDevices::new();
    for name in names {
        let Some(batch) = manifest.batches.get(name) else {
            continue;
        };
        let c = &batch.container;
        if c.devices.is_empty() && c.seccomp.is_none() {
            continue;
        }
        let at = |key: &'static str, message: String| ManifestError::At {
            path: manifest.path.display().to_string(),
            mark: c.marks.get(key).copied().unwrap_or_default(),
            message: format!("batches.{name}.container.{key}: {message}"),
        };
        let (devices, absent) =
            expand_devices(&policy.grants.devices, &c.devices, &c.optional_devices)
                .map_err(|why| at("devices", why))?;
        let seccomp = match &c.seccomp {
            None => None,
            Some(profile) => {
                let granted = policy.grants.seccomp.get(profile).ok_or_else(|| {
                    at(
                        "seccomp",
                        format!("profile `{profile}` is not one the host policy names"),
                    )
                })?;
                let option = seccomp_option(profile, granted).map_err(|why| at("seccomp", why))?;
                Some((profile.clone(), option))
            }
        };
        out.insert(
            name.clone(),
            BatchDevices {
                devices,
                absent,
                seccomp,
            },
        );
    }
    Ok(out)
}
