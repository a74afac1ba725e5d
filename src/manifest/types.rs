//! The batch-level types as read: [`Batch`] and what decides it passed
//! ([`BatchVerdict`]), [`Layer`], and the small `source:` and `workflows:` sections.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::units::Span;

use super::container::ContainerConfig;
use super::values::{ser_display, ser_display_opt};

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    #[serde(default)]
    pub install: Vec<String>,
}

/// What decides whether a batch passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BatchVerdict {
    /// Its JUnit reports (and its steps' exit status).
    #[default]
    Junit,
    /// Its steps' exit status alone, each step recorded as a test case: for tests that
    /// are scripts and write no JUnit.
    ExitCode,
}

/// Which endings of a batch run it again, under `retries:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryOn {
    /// Its tests or steps failed: the default.
    Failed,
    /// It hit its timeout: retried only when asked (a batch that hangs once tends to
    /// hang again, and each attempt costs the whole timeout).
    Timeout,
    /// The engine or the host failed it: retried only when asked (a broken host
    /// stays broken; the next attempt may get other GPUs).
    InfraError,
}

/// How often a batch that did not pass runs again (`retries:`), each attempt in a
/// fresh container with GPUs leased anew.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Retries {
    /// How many more times it may run: 0 runs it once.
    pub count: u32,
    /// Which endings run it again.
    pub on: Vec<RetryOn>,
}

impl Default for Retries {
    fn default() -> Self {
        Retries {
            count: 0,
            on: vec![RetryOn::Failed],
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Batch {
    pub description: Option<String>,
    pub gpus: u32,
    /// The model its GPUs must be (a glob over the model name the probe reports,
    /// `*H100*`): only the pool's GPUs of that model are leased to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// How many nodes it spans under Slurm, `gpus` on each (1: one node; more need
    /// `container.network: host` for the ranks to meet).
    pub nodes: u32,
    /// How many shards it runs as: one container (or CI job) each, with its GPUs, told
    /// its index and the count (`CIBOX_SHARD_INDEX`, `CIBOX_SHARD_COUNT`); 1: unsharded.
    pub shards: u32,
    #[serde(serialize_with = "ser_display")]
    pub timeout: Span,
    pub preflight: Vec<String>,
    pub run: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub fast_env: BTreeMap<String, String>,
    pub allow_empty: bool,
    /// How long it is expected to run (`est_time`), for partitions and the order of a
    /// parallel run; a recorded time (`--timings`) wins over it.
    #[serde(
        serialize_with = "ser_display_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub est_time: Option<Span>,
    /// How often it runs again when it did not pass.
    pub retries: Retries,
    /// Its failure is recorded and shown but does not fail the run (`soft_fail`).
    pub soft_fail: bool,
    /// The test files this batch runs (globs), for `cibox changed --unregistered`.
    pub tests: Vec<String>,
    /// The top-level `container` with this batch's own keys laid over it.
    pub container: ContainerConfig,
    /// Free data for templates (a mapping of plain values).
    pub meta: serde_json::Value,
    pub verdict: BatchVerdict,
    /// The name of the image it runs in (a key of `images`): its own, else `default`.
    /// Run as part of a layer that names an image, it runs in that one instead.
    pub image: String,
    /// Whether it names its image itself (or through `defaults`).
    #[serde(skip)]
    pub image_named: bool,
    /// How the source is installed for it, instead of its image's `install` (or
    /// `source.install`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub install: Option<Vec<String>>,
    /// The caches it uses, by name (keys of the manifest's `caches`).
    pub caches: Vec<String>,
    /// The test list it is an entry of (`each:` of that batch), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    /// The test file, for a batch `cibox changed run` made from `changed.run`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_file: Option<String>,
    /// The folder its preflight and run steps run in (absolute in its container; the
    /// source's, `/work`, when not set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// The queue or runner label its CI step goes to, beside its GPU model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// A person starts it in CI (a block step): for templates; `cibox` runs it when asked.
    pub manual: bool,
    /// The change groups (`changed.groups`) whose change selects it in a pipeline that
    /// follows the diff (`workflow render --base`); none: always selected.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Layer {
    pub description: Option<String>,
    /// Resolved batch names, in manifest order for `all`, as written otherwise.
    pub batches: Vec<String>,
    /// Whether the layer ran with `batches: all`.
    pub all: bool,
    pub fast: bool,
    /// Once one of its batches failed, none of the rest starts (`fail_fast`).
    pub fail_fast: bool,
    /// Free data for templates (a mapping of plain values).
    pub meta: serde_json::Value,
    /// The image its batches run in when run as part of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its warm-up and the budget that sizes its parts.
    #[serde(flatten)]
    pub shape: LayerShape,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowsConfig {
    #[serde(default = "default_workflows_dir")]
    pub dir: PathBuf,
    /// Where Buildkite pipeline templates are (`*.yml.j2`), when the project has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buildkite: Option<PathBuf>,
}

fn default_workflows_dir() -> PathBuf {
    PathBuf::from(".github/workflows")
}

impl Default for WorkflowsConfig {
    fn default() -> Self {
        WorkflowsConfig {
            dir: default_workflows_dir(),
            buildkite: None,
        }
    }
}

/// A layer's warm-up and budget, once its batches are known.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LayerShape {
    /// The batch that runs first, alone, in each part of the layer (`--partition`), its
    /// failure keeping the part's other batches from starting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup: Option<String>,
    /// How long one part may take: the parts are sized so that each is expected within
    /// 3/4 of it, warm-up included.
    #[serde(
        serialize_with = "super::values::ser_display_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub budget: Option<Span>,
}
