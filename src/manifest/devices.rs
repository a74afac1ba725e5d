//! `container.devices` and `container.seccomp`: host devices beyond GPUs (RDMA's
//! `/dev/infiniband/*`) and a seccomp profile other than the engine's default. Both are
//! loosenings the host policy grants (its `grants.devices` patterns, and the profiles it
//! names in `grants.seccomp`); the manifest only asks, by path or by the profile's
//! name, never with a profile of its own.

use super::check::Checker;
use super::error::ManifestError;

/// Device paths a batch never gets this way: GPUs are cibox's to hand out, by lease.
const GPU_DEVICES: [&str; 8] = [
    "/dev/nvidia",
    "/dev/dri",
    "/dev/dxg",
    "/dev/kfd",
    "/dev/davinci",
    "/dev/devmm_svm",
    "/dev/hisi_hdc",
    "/dev/mtgpu",
];

/// Reads `devices`: paths (or glob patterns) under `/dev`, none a GPU's, each written as
/// the path alone or as `{path: PATH, optional: true}` (one a host may lack: a mixed
/// fleet's InfiniBand). The paths, and those of them that are optional.
pub(super) fn validate_devices(
    check: &Checker<'_>,
    at: &[String],
    raw: &[serde_json::Value],
) -> Result<(Vec<String>, Vec<String>), ManifestError> {
    let mut out: Vec<String> = Vec::new();
    let mut optional: Vec<String> = Vec::new();
    for (i, item) in raw.iter().enumerate() {
        let mut here = at.to_vec();
        here.extend(["devices".to_string(), i.to_string()]);
        let (d, is_optional) = match item {
            serde_json::Value::String(d) => (d.clone(), false),
            serde_json::Value::Object(map)
                if map.keys().all(|k| k == "path" || k == "optional")
                    && map.get("path").is_some_and(|p| p.is_string())
                    && map.get("optional").is_none_or(|o| o.is_boolean()) =>
            {
                (
                    map["path"].as_str().unwrap_or_default().to_string(),
                    map.get("optional")
                        .and_then(|o| o.as_bool())
                        .unwrap_or(false),
                )
            }
            other => {
                return Err(check.at(
                    &here,
                    format!(
                        "`{}` is not a device: write a path under /dev, or `{{path: PATH, optional: true}}` for one a host may lack",
                        crate::util::escape(&other.to_string())
                    ),
                ));
            }
        };
        let d = &d;
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
        if is_optional {
            optional.push(d.clone());
        }
    }
    Ok((out, optional))
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
