//! `container.devices` and `container.seccomp`: host devices beyond GPUs (RDMA's
//! `/dev/infiniband/*`) and a seccomp profile other than the engine's default. Both are
//! loosenings the host policy grants (its `grants.devices` patterns, and the profiles it
//! names in `grants.seccomp`); the manifest only asks, by path or by the profile's
//! name, never with a profile of its own.

use super::check::Checker;
use super::error::ManifestError;

/// Device paths a batch never gets this way: GPUs are cibox's to hand out, by lease.
const GPU_DEVICES: [&str; 4] = ["/dev/nvidia", "/dev/dri", "/dev/dxg", "/dev/kfd"];

/// Reads `devices`: paths (or glob patterns) under `/dev`, none a GPU's.
pub(super) fn validate_devices(
    check: &Checker<'_>,
    at: &[String],
    raw: &[String],
) -> Result<Vec<String>, ManifestError> {
    let mut out: Vec<String> = Vec::new();
    for (i, d) in raw.iter().enumerate() {
        let mut here = at.to_vec();
        here.extend(["devices".to_string(), i.to_string()]);
        let refuse = |why: &str| check.at(&here, format!("device `{d}` {why}"));
        let Some(rest) = d.strip_prefix("/dev/") else {
            return Err(refuse("must be a path under /dev"));
        };
        if rest.is_empty()
            || rest
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
            || d.contains([',', ':'])
            || d.chars().any(char::is_control)
        {
            return Err(refuse(
                "must name a device under /dev, without `.`, `..`, empty parts, `,`, `:` or control characters",
            ));
        }
        if GPU_DEVICES.iter().any(|g| d.starts_with(g)) {
            return Err(refuse(
                "is a GPU's: GPUs are leased by cibox (`gpus:`), never mapped by path",
            ));
        }
        if glob::Pattern::new(d).is_err() {
            return Err(refuse("is not a valid pattern"));
        }
        if out.contains(d) {
            return Err(refuse("is named twice"));
        }
        out.push(d.clone());
    }
    Ok(out)
}

/// Reads `seccomp`: `default` (the engine's profile), or the name of a profile the host
/// policy defines (`unconfined` among them, where it grants that).
pub(super) fn validate_seccomp(
    check: &Checker<'_>,
    at: &[String],
    raw: Option<&str>,
) -> Result<Option<String>, ManifestError> {
    match raw {
        None | Some("default") => Ok(None),
        Some(name) => {
            let ok = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if !ok {
                let mut here = at.to_vec();
                here.push("seccomp".into());
                return Err(check.at(
                    &here,
                    format!("`{name}` is not a profile name: `default`, or a name the host policy's grants.seccomp defines (letters, digits, `_`, `-`, `.`)"),
                ));
            }
            Ok(Some(name.to_string()))
        }
    }
}
