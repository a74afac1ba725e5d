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
/// still covers. A pattern that matches nothing is refused: the batch would run without
/// what it needs.
pub fn expand_devices(granted: &[String], asked: &[String]) -> Result<Vec<PathBuf>, String> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = Vec::new();
    for pattern in asked {
        let paths = glob::glob(pattern).map_err(|e| format!("device `{pattern}`: {e}"))?;
        let mut found = 0;
        for p in paths.flatten() {
            let real =
                std::fs::canonicalize(&p).map_err(|e| format!("device {}: {e}", p.display()))?;
            let ft = std::fs::metadata(&real)
                .map_err(|e| format!("device {}: {e}", real.display()))?
                .file_type();
            if !(ft.is_char_device() || ft.is_block_device()) {
                return Err(format!("{} is not a device", p.display()));
            }
            let text = real.to_string_lossy();
            if !text.starts_with("/dev/") || !device_granted(granted, &text) {
                return Err(format!(
                    "{} resolves to {}, which the host policy's grants.devices does not cover",
                    p.display(),
                    real.display()
                ));
            }
            if !out.contains(&real) {
                out.push(real);
            }
            found += 1;
        }
        if found == 0 {
            return Err(format!("device `{pattern}` matches no device on this host"));
        }
    }
    Ok(out)
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
}
