//! The policy's `caches:` section: where a project's caches live on this host, how
//! big each may grow, and whether runs here write through. Only the host can say the
//! last: in a job a pull request's workflow runs, every variable and flag cibox sees is
//! the pull request's to set; a host that only trusted workflows reach (a runner group
//! restricted to protected branches, say) can say so here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::PolicyError;
use crate::units::Size;

/// What the host grants for caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachePolicy {
    /// The store, as cibox sees it.
    pub root: PathBuf,
    /// The store as the engine sees it, when cibox runs in a container of the engine's
    /// host and the policy says so (else it is found from the engine, or is `root`).
    pub host_root: Option<PathBuf>,
    /// The most a cache may hold, unless `sizes` names it.
    pub size: u64,
    /// Caps by `PROJECT/NAME`.
    pub sizes: BTreeMap<String, u64>,
    /// The memory-backed layer an untrusted run writes into, per cache.
    pub private_size: u64,
    /// Runs on this host write through.
    pub trusted: bool,
    /// Projects whose manifests may use caches here (`None`: any).
    pub projects: Option<Vec<String>>,
}

impl CachePolicy {
    /// The cap of `project`'s cache `name`.
    pub fn cap(&self, project: &str, name: &str) -> u64 {
        self.sizes
            .get(&format!("{project}/{name}"))
            .copied()
            .unwrap_or(self.size)
    }

    /// One line for `cibox host policy` and `doctor`.
    pub fn summary(&self) -> String {
        format!(
            "caches in {} ({} each, {} private layer; {})",
            self.root.display(),
            Size(self.size),
            Size(self.private_size),
            if self.trusted {
                "runs here write through"
            } else {
                "no run here writes through"
            }
        )
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCaches {
    root: PathBuf,
    host_root: Option<PathBuf>,
    size: Option<Size>,
    #[serde(default)]
    sizes: BTreeMap<String, Size>,
    private_size: Option<Size>,
    #[serde(default)]
    trusted: bool,
    projects: Option<Vec<String>>,
}

/// Reads `caches:`; `here` places an error at a key.
pub(super) fn cache_policy(
    raw: RawCaches,
    here: &dyn Fn(&[&str], String) -> PolicyError,
) -> Result<CachePolicy, PolicyError> {
    for (key, path) in [
        ("root", Some(&raw.root)),
        ("host_root", raw.host_root.as_ref()),
    ] {
        // The engine hands the paths to the kernel in one option string.
        if let Some(p) = path
            && (!p.is_absolute()
                || p == Path::new("/")
                || p.components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
                || p.to_str()
                    .is_none_or(|s| s.contains([',', ':']) || s.chars().any(char::is_control)))
        {
            return Err(here(
                &["caches", key],
                format!(
                    "`{}` must be an absolute folder other than /, without `..`, `,`, `:` or control characters",
                    p.display()
                ),
            ));
        }
    }
    for name in raw.sizes.keys() {
        let ok = name.split_once('/').is_some_and(|(p, n)| {
            crate::cache::is_folder_name(p) && crate::cache::is_folder_name(n)
        });
        if !ok {
            return Err(here(
                &["caches", "sizes", name],
                format!("`{name}` is not `PROJECT/NAME`"),
            ));
        }
    }
    Ok(CachePolicy {
        root: raw.root,
        host_root: raw.host_root,
        size: raw.size.map_or(10 << 30, |s| s.0),
        sizes: raw.sizes.into_iter().map(|(k, v)| (k, v.0)).collect(),
        private_size: raw.private_size.map_or(1 << 30, |s| s.0),
        trusted: raw.trusted,
        projects: raw.projects,
    })
}
