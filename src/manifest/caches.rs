//! `caches:`: folders a project's tests write and later batches reuse (datasets,
//! converted checkpoints, compiled extensions), each named with the path the tests
//! expect in the container. The manifest only names them: the host policy places,
//! sizes and grants them, and says whether a run's writes are kept (see `crate::cache`).

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::Deserialize;

use super::check::Checker;
use super::container::ContainerConfig;
use super::error::ManifestError;
use super::mounts::check_mount_target;
use super::values::is_name;
use crate::yaml::Mark;

/// One cache as the manifest names it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CacheSpec {
    /// Where the batch sees it.
    pub path: String,
    #[serde(skip)]
    pub mark: Mark,
}

/// `NAME: PATH` or `NAME: {path: PATH}`.
#[derive(Debug)]
pub(super) enum RawCache {
    Path(String),
    Full(RawCacheFull),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCacheFull {
    path: String,
}

impl<'de> Deserialize<'de> for RawCache {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        super::values::scalar_or_compound(
            d,
            (
                false,
                "a cache is `NAME: /path/in/the/container` or `NAME: {path: /path/in/the/container}`",
            ),
            RawCache::Path,
            RawCache::Full,
        )
    }
}

/// Reads `caches:`: names a cache store can hold, paths where a mount could go, no
/// path inside another.
pub(super) fn validate_caches(
    check: &Checker<'_>,
    raw: IndexMap<String, RawCache>,
) -> Result<IndexMap<String, CacheSpec>, ManifestError> {
    let mut caches: IndexMap<String, CacheSpec> = IndexMap::new();
    for (name, c) in raw {
        if !is_name(&name, true) || name.len() > 64 {
            return Err(check.at_key(
                &["caches", &name],
                format!("`{name}` is not a valid cache name: use letters, digits, `_`, `.` and `-`, starting with a letter or digit"),
            ));
        }
        let path = match c {
            RawCache::Path(p) | RawCache::Full(RawCacheFull { path: p }) => p,
        };
        let here = ["caches", name.as_str()];
        if let Err(why) = check_mount_target(&path) {
            return Err(check.at(&here, format!("path `{path}`: {why}")));
        }
        if let Some((other, _)) = caches.iter().find(|(_, o)| overlap(&o.path, &path)) {
            return Err(check.at(
                &here,
                format!(
                    "path `{path}` overlaps cache `{other}`'s; each cache needs a folder of its own"
                ),
            ));
        }
        let mark = check.root.locate(&here).mark;
        caches.insert(name, CacheSpec { path, mark });
    }
    Ok(caches)
}

/// The caches a batch uses: those it names (`caches:`, or `[]` for none), else every
/// cache of the manifest. None may lie where one of its mounts goes.
pub(super) fn batch_caches(
    check: &Checker<'_>,
    at: &[&str],
    caches: &IndexMap<String, CacheSpec>,
    asked: Option<Vec<String>>,
    container: &ContainerConfig,
) -> Result<Vec<String>, ManifestError> {
    let names = match asked {
        None => caches.keys().cloned().collect(),
        Some(names) => {
            for (i, n) in names.iter().enumerate() {
                let here: Vec<String> = at
                    .iter()
                    .map(|s| s.to_string())
                    .chain(["caches".to_string(), i.to_string()])
                    .collect();
                if !caches.contains_key(n) {
                    let known: Vec<&str> = caches.keys().map(String::as_str).collect();
                    return Err(check.at(
                        &here,
                        format!(
                            "`{n}` is not a cache of this manifest (`caches:` names {})",
                            if known.is_empty() {
                                "none".to_string()
                            } else {
                                known.join(", ")
                            }
                        ),
                    ));
                }
                if names[..i].contains(n) {
                    return Err(check.at(&here, format!("`{n}` is named twice")));
                }
            }
            names
        }
    };
    for n in &names {
        let path = &caches[n].path;
        if let Some(m) = container.mounts.iter().find(|m| overlap(&m.target, path)) {
            let here: Vec<String> = at
                .iter()
                .map(|s| s.to_string())
                .chain(["container".to_string(), "mounts".to_string()])
                .collect();
            return Err(check.at(
                &here,
                format!(
                    "mount target `{}` overlaps cache `{n}` at `{path}`",
                    m.target
                ),
            ));
        }
    }
    Ok(names)
}

/// Whether one path is, or lies inside, the other.
fn overlap(a: &str, b: &str) -> bool {
    let (a, b): (PathBuf, PathBuf) = (
        Path::new(a).components().collect(),
        Path::new(b).components().collect(),
    );
    a.starts_with(&b) || b.starts_with(&a)
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::{GOOD, assert_refused, parse};

    /// GOOD with caches, and its `cpu` batch asking for `models`.
    fn with_caches() -> String {
        GOOD.replace(
            "batches:\n",
            "caches:\n  models: /cache/models\n  hf: {path: /root/.cache/huggingface}\nbatches:\n",
        )
        .replace(
            "    run: [\"pytest\"]\n",
            "    run: [\"pytest\"]\n    caches: [models]\n",
        )
    }

    #[test]
    fn a_cache_of_neither_form_is_named_with_both_forms() {
        assert_refused(
            &with_caches(),
            &[
                (
                    "models: /cache/models",
                    "models: 1",
                    "caches.models: a cache is `NAME: /path/in/the/container` or `NAME: {path: /path/in/the/container}`",
                ),
                (
                    "hf: {path: /root/.cache/huggingface}",
                    "hf: {path: /root/.cache/huggingface, size: 1G}",
                    "caches.hf.size: unknown key `size`; known keys: path",
                ),
            ],
        );
    }

    #[test]
    fn a_cache_path_or_name_that_traverses_or_collides_is_refused_with_its_place() {
        let base = with_caches();
        let m = parse(&base).unwrap();
        assert_eq!(m.caches["hf"].path, "/root/.cache/huggingface");
        assert_refused(
            &base,
            &[
                (
                    "models: /cache/models",
                    "models: /cache/../src",
                    "caches.models: path `/cache/../src`: must not contain `..`",
                ),
                (
                    "models: /cache/models",
                    "models: /src/models",
                    "caches.models: path `/src/models`: is under `/src`",
                ),
                ("models: /cache/models", "models: /work", "is under `/work`"),
                (
                    "models: /cache/models",
                    "models: /./reports/x",
                    "is under `/reports`",
                ),
                (
                    "models: /cache/models",
                    "models: //tmp//x",
                    "is under `/tmp`",
                ),
                (
                    "models: /cache/models",
                    "models: /",
                    "is the container's root",
                ),
                (
                    "models: /cache/models",
                    "models: cache/models",
                    "must be an absolute path",
                ),
                (
                    "models: /cache/models",
                    "models: \"/cache/a,upperdir=/x\"",
                    "must not contain `,` or `:`",
                ),
                (
                    "models: /cache/models",
                    "models: /root/.cache",
                    "caches.hf: path `/root/.cache/huggingface` overlaps cache `models`",
                ),
                (
                    "models: /cache/models",
                    "models: /root/.cache/huggingface/./hub",
                    "overlaps cache `models`",
                ),
                (
                    "models: /cache/models",
                    "\"..\": /cache/models",
                    "`..` is not a valid cache name",
                ),
                (
                    "models: /cache/models",
                    "\"a/b\": /cache/models",
                    "`a/b` is not a valid cache name",
                ),
                (
                    "caches: [models]",
                    "caches: [nope]",
                    "`nope` is not a cache of this manifest",
                ),
                (
                    "caches: [models]",
                    "caches: [models, models]",
                    "`models` is named twice",
                ),
                (
                    "    caches: [models]\n",
                    "    caches: [models]\n    container: {mounts: [\"/data/m:/cache\"]}\n",
                    "mount target `/cache` overlaps cache `models` at `/cache/models`",
                ),
            ],
        );
    }
}
