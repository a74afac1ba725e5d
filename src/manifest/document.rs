//! The validated manifest: what `cibox.yaml` says, every section resolved.

use std::path::PathBuf;

use indexmap::IndexMap;

use super::caches::CacheSpec;
use super::changed::ChangedConfig;
use super::container::ContainerConfig;
use super::gpu::GpuConfig;
use super::images::ImageConfig;
use super::types::{Batch, Layer, SourceConfig, WorkflowsConfig};

/// The validated manifest.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// The file it was read from.
    pub path: PathBuf,
    /// Its folder: lock files, recipes and templates are relative to it.
    pub dir: PathBuf,
    /// `sha256:` of the file's bytes, recorded in run records.
    pub digest: String,
    pub project: String,
    /// The default image (`image:`, or `images.default`).
    pub image: ImageConfig,
    /// Every image by name, `default` included: each with its own locks, recipe, ID.
    pub images: IndexMap<String, ImageConfig>,
    pub source: SourceConfig,
    pub container: ContainerConfig,
    pub gpu: GpuConfig,
    pub batches: IndexMap<String, Batch>,
    /// Test lists: each family (a batch with `each:`) and the batches of its entries.
    pub families: IndexMap<String, Vec<String>>,
    /// The test lists the project's code prints (`collect:`), by family: until
    /// collected ([`Manifest::with_collected`]) such a family has no entries.
    pub collectors: IndexMap<String, super::collect::CollectSpec>,
    /// The collectors' lists, once they are in (`batches` then holds their entries).
    pub collected: Option<super::collect::Collected>,
    pub layers: IndexMap<String, Layer>,
    pub changed: Option<ChangedConfig>,
    pub workflows: WorkflowsConfig,
    /// Folders the tests write and later batches reuse, by name.
    pub caches: IndexMap<String, CacheSpec>,
}

impl Manifest {
    /// Resolves a path written in the manifest against the manifest's folder.
    pub fn resolve(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }
}

impl Manifest {
    /// The lockset of image `name`: its lock files as they are now. A pattern that
    /// matches nothing or cannot be read is said at its place in the manifest.
    pub fn lockset(&self, name: &str) -> Result<crate::image::Lockset, crate::error::Error> {
        use crate::image::lockset::LocksetError;
        let locks = &self.images[name].locks;
        crate::image::Lockset::compute(&self.dir, locks).map_err(|e| {
            let pattern = match &e {
                LocksetError::NoMatch { pattern, .. }
                | LocksetError::BadPattern { pattern, .. } => Some(pattern.as_str()),
                _ => None,
            };
            match pattern.and_then(|p| self.lock_mark(name, p)) {
                Some(mark) => super::error::ManifestError::At {
                    path: self.path.display().to_string(),
                    mark,
                    message: e.to_string(),
                }
                .into(),
                None => e.into(),
            }
        })
    }

    /// Where the manifest says `path` (map keys, list indices), or the nearest place it
    /// has (read again: for an error's position only).
    pub fn mark_of(&self, path: &[&str]) -> Option<crate::yaml::Mark> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let root = crate::yaml::parse(&text).ok()??;
        Some(root.locate(path).mark)
    }

    /// Where the manifest names lock pattern `pattern` of image `name` (read again: an
    /// error's position only).
    fn lock_mark(&self, name: &str, pattern: &str) -> Option<crate::yaml::Mark> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let root = crate::yaml::parse(&text).ok()??;
        let mut places = vec![root.get("images").and_then(|i| i.get(name))];
        if name == super::DEFAULT_IMAGE {
            places.push(root.get("image"));
        }
        places
            .into_iter()
            .flatten()
            .filter_map(|img| img.get("locks"))
            .find_map(|locks| match &locks.value {
                crate::yaml::NodeValue::Seq(items) => items
                    .iter()
                    .find(|i| i.scalar_text() == Some(pattern))
                    .map(|i| i.mark),
                _ => None,
            })
    }
}
