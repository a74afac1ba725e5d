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
