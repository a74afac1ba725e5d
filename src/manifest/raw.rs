//! The manifest as written: serde structs that refuse unknown keys, filled from the
//! YAML tree after `prepare` (so a batch already holds its defaults and the top-level
//! container). The sections with checks of their own keep their raw form beside them
//! (`RawContainer`, `RawGpu`, `RawChanged`).

use std::collections::BTreeMap;

use indexmap::IndexMap;
use serde::Deserialize;

use crate::units::Span;

use super::caches::RawCache;
use super::changed::RawChanged;
use super::collect::RawCollect;
use super::container::RawContainer;
use super::each::RawEntry;
use super::gpu::RawGpu;
use super::images::ImageConfig;
use super::schedule::RawRetries;
use super::types::{BatchVerdict, SourceConfig, WorkflowsConfig};
use super::values::EnvValue;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawManifest {
    pub(super) version: u32,
    pub(super) project: String,
    pub(super) image: Option<ImageConfig>,
    #[serde(default)]
    pub(super) images: IndexMap<String, ImageConfig>,
    #[serde(default)]
    pub(super) source: SourceConfig,
    #[serde(default)]
    pub(super) container: RawContainer,
    #[serde(default)]
    pub(super) gpu: RawGpu,
    pub(super) batches: IndexMap<String, RawBatch>,
    #[serde(default)]
    pub(super) layers: IndexMap<String, RawLayer>,
    pub(super) changed: Option<RawChanged>,
    #[serde(default)]
    pub(super) workflows: WorkflowsConfig,
    #[serde(default)]
    pub(super) caches: IndexMap<String, RawCache>,
    /// Laid under every batch by `prepare`; read here only so that a wrong value is an
    /// error even where every batch sets its own.
    #[allow(dead_code)]
    defaults: Option<RawDefaults>,
}

/// `defaults:`: any batch key, each optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub(super) struct RawDefaults {
    description: Option<String>,
    gpus: Option<u32>,
    gpu_model: Option<String>,
    nodes: Option<u32>,
    shards: Option<i64>,
    timeout: Option<Span>,
    preflight: Option<Vec<String>>,
    run: Option<Vec<String>>,
    env: Option<BTreeMap<String, EnvValue>>,
    fast_env: Option<BTreeMap<String, EnvValue>>,
    allow_empty: Option<bool>,
    tests: Option<Vec<String>>,
    container: Option<RawContainer>,
    meta: Option<serde_json::Value>,
    verdict: Option<BatchVerdict>,
    image: Option<String>,
    install: Option<Vec<String>>,
    caches: Option<Vec<String>>,
    est_time: Option<Span>,
    retries: Option<RawRetries>,
    soft_fail: Option<bool>,
    working_dir: Option<String>,
    queue: Option<String>,
    manual: Option<bool>,
    changes: Option<Vec<String>>,
}

/// A batch, with `defaults:` laid under it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBatch {
    pub(super) description: Option<String>,
    pub(super) gpus: i64,
    /// The model its GPUs must be (a glob).
    pub(super) gpu_model: Option<String>,
    /// Nodes of a Slurm cluster the batch spans (one container on each).
    pub(super) nodes: Option<i64>,
    /// How many containers (or CI jobs) the batch is split over, each running its steps
    /// with its own index (`shards`).
    pub(super) shards: Option<i64>,
    /// Required; an `Option` so that its absence is named (serde would complain about
    /// the missing value's unit).
    pub(super) timeout: Option<Span>,
    #[serde(default)]
    pub(super) preflight: Vec<String>,
    pub(super) run: Vec<String>,
    #[serde(default)]
    pub(super) env: BTreeMap<String, EnvValue>,
    #[serde(default)]
    pub(super) fast_env: BTreeMap<String, EnvValue>,
    #[serde(default)]
    pub(super) allow_empty: bool,
    #[serde(default)]
    pub(super) tests: Vec<String>,
    /// The top-level `container` with this batch's keys laid over it (see `prepare`).
    pub(super) container: Option<RawContainer>,
    pub(super) meta: Option<serde_json::Value>,
    pub(super) verdict: Option<BatchVerdict>,
    pub(super) image: Option<String>,
    pub(super) install: Option<Vec<String>>,
    /// The caches it uses (none given: every cache of the manifest).
    pub(super) caches: Option<Vec<String>>,
    /// How long it is expected to run.
    pub(super) est_time: Option<Span>,
    /// How often it runs again when it did not pass.
    pub(super) retries: Option<RawRetries>,
    /// Its failure does not fail the run.
    #[serde(default)]
    pub(super) soft_fail: bool,
    /// The folder its steps run in (`working_dir`), relative to the source or absolute.
    pub(super) working_dir: Option<String>,
    /// The queue or runner label its CI step goes to.
    pub(super) queue: Option<String>,
    /// A person starts it (a block step).
    #[serde(default)]
    pub(super) manual: bool,
    /// The change groups that select it in a pipeline that follows the diff.
    #[serde(default)]
    pub(super) changes: Vec<String>,
    /// A test list: one batch per entry (see `each`).
    pub(super) each: Option<Vec<RawEntry>>,
    /// A test list the project's code prints at run time (see `collect`).
    pub(super) collect: Option<RawCollect>,
}

/// A layer's `batches:`, `all` or a list of names.
#[derive(Debug)]
pub(super) enum RawLayerBatches {
    Named(String),
    List(Vec<String>),
}

impl<'de> Deserialize<'de> for RawLayerBatches {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        super::values::scalar_or_compound(
            d,
            (
                true,
                "a layer's `batches` is `all` or a list of batch names",
            ),
            RawLayerBatches::Named,
            RawLayerBatches::List,
        )
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLayer {
    pub(super) description: Option<String>,
    pub(super) batches: RawLayerBatches,
    #[serde(default)]
    pub(super) fast: bool,
    /// Once one of its batches failed, none of the rest starts.
    #[serde(default)]
    pub(super) fail_fast: bool,
    pub(super) meta: Option<serde_json::Value>,
    /// The image of its batches that name none.
    pub(super) image: Option<String>,
    /// The batch that runs first in each part.
    pub(super) warmup: Option<String>,
    /// How long one part may take.
    pub(super) budget: Option<Span>,
}
