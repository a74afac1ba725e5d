//! Values and names the sections share: environment values ([`EnvValue`], [`env_map`]),
//! the name rules for projects, batches, layers, images and variables, `meta` (plain
//! data for templates), and the serialising helpers for values written as text.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use super::check::Checker;
use super::error::ManifestError;

/// An environment value: strings, and numbers for convenience (`FAST_TEST: 1`).
#[derive(Debug, Clone)]
pub(super) struct EnvValue(String);

impl<'de> Deserialize<'de> for EnvValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(EnvValue(s)),
            serde_json::Value::Number(n) => Ok(EnvValue(n.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "an environment value must be a string or a number, not `{other}`; quote it"
            ))),
        }
    }
}

/// Reads a value written in one of two forms, a scalar (`S`) or a compound (`M`: a
/// list where `list`, else a mapping), and says `forms` when it is neither: serde's
/// untagged enums would say "data did not match any variant". A compound that is
/// wrong keeps its own error (an unknown key, named; a value not allowed).
pub(super) fn scalar_or_compound<'de, D, S, M, T>(
    d: D,
    (list, forms): (bool, &str),
    scalar: fn(S) -> T,
    compound: fn(M) -> T,
) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    S: serde::de::DeserializeOwned,
    M: serde::de::DeserializeOwned,
{
    let v = serde_json::Value::deserialize(d)?;
    let is_compound = match &v {
        serde_json::Value::Array(_) => list,
        serde_json::Value::Object(_) => !list,
        _ => false,
    };
    if is_compound {
        serde_json::from_value::<M>(v)
            .map(compound)
            .map_err(serde::de::Error::custom)
    } else {
        serde_json::from_value::<S>(v)
            .map(scalar)
            .map_err(|_| serde::de::Error::custom(forms))
    }
}

pub(super) fn ser_display<T: fmt::Display, S: serde::Serializer>(
    v: &T,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

pub(super) fn ser_display_opt<T: fmt::Display, S: serde::Serializer>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

/// Whether `s` may name a batch (as the manifest requires, and a run record must).
pub fn is_batch_name(s: &str) -> bool {
    is_name(s, true)
}

pub(super) fn is_name(s: &str, upper_ok: bool) -> bool {
    let mut bytes = s.bytes();
    let first_ok = |b: u8| {
        b.is_ascii_digit() || b.is_ascii_lowercase() || (upper_ok && b.is_ascii_uppercase())
    };
    matches!(bytes.next(), Some(b) if first_ok(b))
        && bytes.all(|b| first_ok(b) || matches!(b, b'_' | b'.' | b'-'))
}

/// The variables that say which GPUs a batch sees: cibox's to set (its leased UUIDs, or
/// none), never a manifest's, which could widen what the runtime hands the batch;
/// NVIDIA's and AMD's (ROCm's) alike.
const CIBOX_GPU_VARIABLES: [&str; 5] = [
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
];

/// Why a manifest may not set or pass `name`, if it may not.
pub(super) fn reserved_env(name: &str) -> Option<&'static str> {
    CIBOX_GPU_VARIABLES.contains(&name).then_some(
        "is cibox's to set: a GPU batch sees exactly the GPUs it leased (by UUID), a CPU batch none; remove it",
    )
}

pub(super) fn env_map(
    check: &Checker<'_>,
    path: &[&str],
    raw: BTreeMap<String, EnvValue>,
) -> Result<BTreeMap<String, String>, ManifestError> {
    raw.into_iter()
        .map(|(k, v)| {
            if !crate::util::is_env_name(&k) {
                let mut p = path.to_vec();
                p.push(&k);
                return Err(check.at_key(&p, "not a valid environment variable name"));
            }
            if let Some(why) = reserved_env(&k) {
                let mut p = path.to_vec();
                p.push(&k);
                return Err(check.at_key(&p, why));
            }
            if v.0.contains('\0') {
                let mut p = path.to_vec();
                p.push(&k);
                return Err(check.at(&p, "contains a NUL byte, which no environment can hold"));
            }
            if k == "HOME" {
                let mut p = path.to_vec();
                p.push(&k);
                home(check, &p, &v.0)?;
            }
            Ok((k, v.0))
        })
        .collect()
}

/// `meta`: a mapping of plain data (strings, numbers, booleans, lists and mappings of
/// them), passed to templates untouched. With `removals`, a mapping's key may be `null`
/// (a test list's entry, whose `meta` is laid over its family's after this check).
pub(super) fn plain_meta(
    check: &Checker<'_>,
    at: &[&str],
    meta: Option<serde_json::Value>,
    removals: bool,
) -> Result<serde_json::Value, ManifestError> {
    fn plain(
        v: &serde_json::Value,
        path: &mut Vec<String>,
        removals: bool,
    ) -> Result<(), Vec<String>> {
        match v {
            serde_json::Value::Null => Err(path.clone()),
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(i.to_string());
                    plain(item, path, false)?;
                    path.pop();
                }
                Ok(())
            }
            serde_json::Value::Object(map) => {
                for (k, item) in map {
                    if removals && item.is_null() {
                        continue;
                    }
                    path.push(k.clone());
                    plain(item, path, removals)?;
                    path.pop();
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
    let Some(meta) = meta else {
        return Ok(serde_json::Value::Object(Default::default()));
    };
    let mut path: Vec<String> = at.iter().map(|s| s.to_string()).collect();
    if !meta.is_object() {
        return Err(check.at(
            &path,
            "must be a mapping of plain values (`label: run-ci-gpu`)",
        ));
    }
    plain(&meta, &mut path, removals).map_err(|bad| {
        check.at(
            &bad,
            "is empty (null): meta holds plain data only (strings, numbers, booleans, lists, mappings); quote it, \"\", if you mean an empty string",
        )
    })?;
    Ok(meta)
}

/// The longest `HOME` (Linux's `PATH_MAX`).
const MAX_HOME: usize = 4096;

/// A `HOME` the manifest sets (`env:` of the batch or of `container:`): honoured, so
/// it must be a folder's absolute path in the container.
pub(super) fn home(check: &Checker<'_>, at: &[&str], value: &str) -> Result<(), ManifestError> {
    if !value.starts_with('/') || value.len() > MAX_HOME || value.chars().any(char::is_control) {
        return Err(check.at(
            at,
            format!(
                "`{}` is not an absolute path: HOME is the batch's home folder in its container (`/tmp` when not set)",
                value.escape_debug()
            ),
        ));
    }
    Ok(())
}

/// Why `pass_env` may not name `name`, if it may not: the host's `HOME` is a folder
/// of the host, which the container does not have.
pub(super) fn not_passed(name: &str) -> Option<&'static str> {
    (name == "HOME").then_some(
        "is the host's home folder, which the container does not have: set `env: {HOME: /path}` for the batch's own (its default is `/tmp`)",
    )
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::{REAL, assert_refused};

    #[test]
    fn meta_holds_plain_values_only() {
        assert_refused(
            REAL,
            &[(
                "meta: {label: run-ci-e2e}",
                "meta: {label: [a, ~]}",
                "batches.e2e.meta.label.1: is empty (null)",
            )],
        );
    }
}
