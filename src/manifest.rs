//! `cibox.yaml`, the batch manifest (docs/interface.md §4): the one source of truth for
//! batches, layers, the image and the GPU pool.
//!
//! Loading goes text → positioned YAML tree ([`crate::yaml`]) → serde into raw structs
//! that refuse unknown keys → semantic checks → [`Manifest`]. Every error names the
//! file, line, column and key path.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::units::{Size, Span};
use crate::util::{did_you_mean, hex};
use crate::yaml::{self, Mark, Node};

pub const FILE_NAME: &str = "cibox.yaml";

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(
        "no {FILE_NAME} in {start} or any folder above it (up to the git root); pass --manifest PATH or set CIBOX_MANIFEST"
    )]
    NotFound { start: String },
    #[error("cannot read manifest {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}:{mark}: {message}")]
    At {
        path: String,
        mark: Mark,
        message: String,
    },
    #[error("{var}: {message}")]
    Env { var: &'static str, message: String },
}

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
    pub layers: IndexMap<String, Layer>,
    pub changed: Option<ChangedConfig>,
    pub workflows: WorkflowsConfig,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    /// The qualified image (checked where it is used: a malformed ID is an image refusal).
    pub id: Option<String>,
    /// Where `image fetch` gets it: `REPOSITORY@sha256:…`, pinned by digest.
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    #[serde(default)]
    pub locks: Vec<String>,
    pub nix: Option<String>,
    pub dockerfile: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    #[serde(default)]
    pub install: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    None,
    Bridge,
    Host,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuDriver {
    /// `--gpus device=UUID`: a device request for the NVIDIA runtime.
    Nvidia,
    /// `nvidia.com/gpu=UUID` CDI device names.
    Cdi,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ContainerConfig {
    pub cpus: Option<f64>,
    #[serde(serialize_with = "ser_display_opt")]
    pub memory: Option<Size>,
    #[serde(serialize_with = "ser_display")]
    pub shm: Size,
    /// The size of each of `/work` and `/tmp` (memory-backed, so charged to `memory`).
    #[serde(serialize_with = "ser_display")]
    pub disk: Size,
    /// The size of `/reports` (memory-backed too), and the most that is copied out.
    #[serde(serialize_with = "ser_display")]
    pub reports_size: Size,
    pub pids: u32,
    pub network: Network,
    pub env: BTreeMap<String, String>,
    pub pass_env: Vec<String>,
    pub gpu_driver: GpuDriver,
    /// Host folders (or files) mounted read-only: models, datasets, caches.
    pub mounts: Vec<HostMount>,
    pub ipc: Ipc,
    /// By name (`memlock`, `nofile`, …); -1 is unlimited.
    pub ulimits: BTreeMap<String, Ulimit>,
    /// Capabilities given back after dropping all, from [`CAP_ADD_ALLOWED`].
    pub cap_add: Vec<String>,
    pub user: ContainerUser,
}

impl ContainerConfig {
    /// What this container allows beyond cibox's locked-down default, for the record.
    pub fn loosenings(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        if !self.mounts.is_empty() {
            out.insert("mounts".into(), serde_json::json!(self.mounts));
        }
        if self.ipc == Ipc::Host {
            out.insert("ipc".into(), "host".into());
        }
        if !self.ulimits.is_empty() {
            out.insert("ulimits".into(), serde_json::json!(self.ulimits));
        }
        if !self.cap_add.is_empty() {
            out.insert("cap_add".into(), serde_json::json!(self.cap_add));
        }
        if self.user != ContainerUser::Invoker {
            out.insert("user".into(), self.user.to_string().into());
        }
        if self.network != Network::None {
            out.insert("network".into(), serde_json::json!(self.network));
        }
        serde_json::Value::Object(out)
    }
}

/// A host path mounted read-only at `target`; `mark` is where the manifest names it,
/// for errors found when a run checks the host.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostMount {
    pub source: PathBuf,
    pub target: String,
    /// The source as the kernel resolves it, once a run has checked it on its host:
    /// what the engine mounts.
    #[serde(rename = "resolved", skip_serializing_if = "Option::is_none")]
    pub host_path: Option<PathBuf>,
    /// Mount points below the source on this host, found by the same check.
    #[serde(skip)]
    pub submounts: Vec<PathBuf>,
    #[serde(skip)]
    pub mark: Mark,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ipc {
    /// The container's own IPC namespace (its `/dev/shm` sized by `shm`).
    Private,
    /// The host's: NCCL's shared-memory transport between processes, as `--ipc=host`.
    Host,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Ulimit {
    pub soft: i64,
    pub hard: i64,
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

/// Who a batch runs as inside its container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerUser {
    /// The invoking uid:gid (65534:65534 when cibox runs as root).
    Invoker,
    /// uid 0 in the container, still without capabilities and with no-new-privileges.
    Root,
    Ids(u32, u32),
}

impl fmt::Display for ContainerUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContainerUser::Invoker => f.write_str("invoker"),
            ContainerUser::Root => f.write_str("root"),
            ContainerUser::Ids(u, g) => write!(f, "{u}:{g}"),
        }
    }
}

impl serde::Serialize for ContainerUser {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The variable that names the ID of image `name` for a run (`CIBOX_IMAGE_<NAME>`, the
/// name upper-cased, every other character `_`).
pub fn image_variable(name: &str) -> String {
    let upper: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("CIBOX_IMAGE_{upper}")
}

/// The image of batches that name none.
pub const DEFAULT_IMAGE: &str = "default";

/// The capabilities `container.cap_add` may give back: what NCCL and profilers need.
pub const CAP_ADD_ALLOWED: [&str; 3] = ["IPC_LOCK", "SYS_NICE", "SYS_PTRACE"];

/// `ulimit` names the engine knows.
const ULIMIT_NAMES: [&str; 15] = [
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
];

/// Which GPUs CI may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolSpec {
    All,
    /// Indices (`"0"`) or UUIDs (`"GPU-…"`), as written.
    Devices(Vec<String>),
}

impl fmt::Display for PoolSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolSpec::All => f.write_str("all"),
            PoolSpec::Devices(d) => f.write_str(&d.join(",")),
        }
    }
}

impl serde::Serialize for PoolSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PoolSpec::All => s.serialize_str("all"),
            PoolSpec::Devices(d) => d.serialize(s),
        }
    }
}

impl PoolSpec {
    /// Parses `all` or a comma-separated list of indices and UUIDs.
    pub fn parse_list(text: &str) -> Result<PoolSpec, String> {
        let t = text.trim();
        if t == "all" {
            return Ok(PoolSpec::All);
        }
        let items: Vec<String> = t.split(',').map(|s| s.trim().to_string()).collect();
        Self::from_items(items)
    }

    fn from_items(items: Vec<String>) -> Result<PoolSpec, String> {
        if items.is_empty() || items.iter().all(|s| s.is_empty()) {
            return Err("the GPU pool is empty: write `all` or a list of indices or UUIDs".into());
        }
        let mut seen = std::collections::HashSet::new();
        for item in &items {
            let index_ok = !item.is_empty() && item.bytes().all(|b| b.is_ascii_digit());
            let uuid_ok = is_gpu_uuid(item);
            if !index_ok && !uuid_ok {
                return Err(format!(
                    "`{item}` is neither a GPU index (0, 1, …) nor a GPU UUID (GPU-xxxxxxxx-…)"
                ));
            }
            if !seen.insert(item.as_str()) {
                return Err(format!("`{item}` appears twice in the GPU pool"));
            }
        }
        Ok(PoolSpec::Devices(items))
    }
}

impl<'de> Deserialize<'de> for PoolSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Index(u64),
            List(Vec<serde_json::Value>),
        }
        let raw = Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected `all`, a list of GPU indices or UUIDs, or a comma-separated string",
            )
        })?;
        let res = match raw {
            Raw::Text(t) => PoolSpec::parse_list(&t),
            Raw::Index(i) => PoolSpec::from_items(vec![i.to_string()]),
            Raw::List(items) => items
                .into_iter()
                .map(|v| match v {
                    serde_json::Value::String(s) => Ok(s),
                    serde_json::Value::Number(n) if n.is_u64() => Ok(n.to_string()),
                    other => Err(format!("`{other}` is not a GPU index or UUID")),
                })
                .collect::<Result<Vec<_>, _>>()
                .and_then(PoolSpec::from_items),
        };
        res.map_err(serde::de::Error::custom)
    }
}

/// `gpu.probe`: which backend asks the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeChoice {
    /// NVML when `libnvidia-ml.so.1` can be loaded, else nvidia-smi; nvidia-smi when
    /// `CIBOX_NVIDIA_SMI` names one.
    Auto,
    /// NVML only: a library that cannot be loaded fails closed.
    Nvml,
    /// nvidia-smi only.
    NvidiaSmi,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct IdlePolicy {
    #[serde(default = "default_idle_memory")]
    pub max_memory_mib: u64,
    #[serde(default)]
    pub max_utilization: u32,
}

fn default_idle_memory() -> u64 {
    256
}

impl Default for IdlePolicy {
    fn default() -> Self {
        IdlePolicy {
            max_memory_mib: default_idle_memory(),
            max_utilization: 0,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuConfig {
    pub pool: PoolSpec,
    /// Which backend asks the driver what the GPUs do.
    pub probe: ProbeChoice,
    pub lock_dir: PathBuf,
    pub idle: IdlePolicy,
    #[serde(serialize_with = "ser_display")]
    pub wait: Span,
    /// flock on NFS/SMB is not trustworthy; refused unless this is set.
    pub allow_network_lock_dir: bool,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            pool: PoolSpec::All,
            probe: ProbeChoice::Auto,
            lock_dir: PathBuf::from("/run/lock/cibox"),
            idle: IdlePolicy::default(),
            wait: Span(std::time::Duration::ZERO),
            allow_network_lock_dir: false,
        }
    }
}

impl GpuConfig {
    /// The defaults with the `CIBOX_*` overrides, for hosts without a manifest.
    pub fn from_env() -> Result<GpuConfig, ManifestError> {
        let mut g = GpuConfig::default();
        g.apply_env(|k| std::env::var(k).ok())?;
        Ok(g)
    }

    /// `CIBOX_GPU_POOL`, `CIBOX_GPU_PROBE`, `CIBOX_GPU_LOCK_DIR` and
    /// `CIBOX_ALLOW_NETWORK_LOCK_DIR=1`.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ManifestError> {
        let env_err = |var, message: String| ManifestError::Env { var, message };
        if let Some(v) = get("CIBOX_GPU_POOL") {
            self.pool = PoolSpec::parse_list(&v).map_err(|e| env_err("CIBOX_GPU_POOL", e))?;
        }
        if let Some(v) = get("CIBOX_GPU_PROBE").filter(|v| !v.is_empty()) {
            self.probe = match v.as_str() {
                "auto" => ProbeChoice::Auto,
                "nvml" => ProbeChoice::Nvml,
                "nvidia-smi" => ProbeChoice::NvidiaSmi,
                _ => {
                    return Err(env_err(
                        "CIBOX_GPU_PROBE",
                        format!("`{v}`: use auto, nvml or nvidia-smi"),
                    ));
                }
            };
        }
        if let Some(v) = get("CIBOX_GPU_LOCK_DIR") {
            if v.is_empty() {
                return Err(env_err("CIBOX_GPU_LOCK_DIR", "is empty".into()));
            }
            self.lock_dir = PathBuf::from(v);
        }
        if let Some(v) = get("CIBOX_ALLOW_NETWORK_LOCK_DIR") {
            self.allow_network_lock_dir = match v.as_str() {
                "1" | "true" => true,
                "0" | "false" | "" => false,
                _ => {
                    return Err(env_err(
                        "CIBOX_ALLOW_NETWORK_LOCK_DIR",
                        format!("`{v}`: use 1 or 0"),
                    ));
                }
            };
        }
        Ok(())
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Batch {
    pub description: Option<String>,
    pub gpus: u32,
    #[serde(serialize_with = "ser_display")]
    pub timeout: Span,
    pub preflight: Vec<String>,
    pub run: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub fast_env: BTreeMap<String, String>,
    pub allow_empty: bool,
    /// The test files this batch runs (globs), for `cibox changed --unregistered`.
    pub tests: Vec<String>,
    /// The top-level `container` with this batch's own keys laid over it.
    pub container: ContainerConfig,
    /// Free data for templates (a mapping of plain values).
    pub meta: serde_json::Value,
    pub verdict: BatchVerdict,
    /// The name of the image it runs in (a key of `images`).
    pub image: String,
    /// The test file, for a batch `cibox changed run` made from `changed.run`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_file: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Layer {
    pub description: Option<String>,
    /// Resolved batch names, in manifest order for `all`, as written otherwise.
    pub batches: Vec<String>,
    /// Whether the layer ran with `batches: all`.
    pub all: bool,
    pub fast: bool,
    /// Free data for templates (a mapping of plain values).
    pub meta: serde_json::Value,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ChangedConfig {
    pub patterns: Vec<String>,
    pub gpus_marker: String,
    pub default_gpus: u32,
    /// How one changed test file runs in a container (`cibox changed run`).
    pub run: Option<ChangedRun>,
}

/// `changed.run`: a batch template for one test file, named in the container by
/// `$CIBOX_TEST_FILE` (never pasted into the command). Keys not given come from
/// `defaults`, the container from the top-level `container`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChangedRun {
    pub command: String,
    #[serde(serialize_with = "ser_display")]
    pub timeout: Span,
    pub preflight: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub fast_env: BTreeMap<String, String>,
    pub allow_empty: bool,
    pub container: ContainerConfig,
    pub verdict: BatchVerdict,
    /// The image test files run in.
    pub image: String,
}

impl ChangedRun {
    /// The batch that runs one test file with `gpus` GPUs: `CIBOX_TEST_FILE` names
    /// the file in the container, never the command line.
    pub fn batch_for(&self, file: &str, gpus: u32) -> Batch {
        let mut env = self.env.clone();
        env.insert("CIBOX_TEST_FILE".into(), file.to_string());
        Batch {
            description: Some(format!("changed test file {file}")),
            gpus,
            timeout: self.timeout,
            preflight: self.preflight.clone(),
            run: vec![self.command.clone()],
            env,
            fast_env: self.fast_env.clone(),
            allow_empty: self.allow_empty,
            tests: vec![file.to_string()],
            container: self.container.clone(),
            meta: serde_json::json!({ "test_file": file }),
            verdict: self.verdict,
            image: self.image.clone(),
            changed_file: Some(file.to_string()),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChanged {
    patterns: Vec<String>,
    #[serde(default = "default_marker")]
    gpus_marker: String,
    #[serde(default = "default_gpus")]
    default_gpus: u32,
    run: Option<RawChangedRun>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChangedRun {
    command: String,
    timeout: Option<Span>,
    #[serde(default)]
    preflight: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, EnvValue>,
    #[serde(default)]
    fast_env: BTreeMap<String, EnvValue>,
    #[serde(default)]
    allow_empty: bool,
    container: Option<RawContainer>,
    verdict: Option<BatchVerdict>,
    image: Option<String>,
}

/// The `defaults` keys that `changed.run` takes (the rest describe named batches).
const CHANGED_RUN_DEFAULTS: [&str; 8] = [
    "image",
    "verdict",
    "timeout",
    "preflight",
    "env",
    "fast_env",
    "allow_empty",
    "container",
];

fn default_marker() -> String {
    "NUM_GPUS".into()
}

fn default_gpus() -> u32 {
    8
}

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowsConfig {
    #[serde(default = "default_workflows_dir")]
    pub dir: PathBuf,
}

fn default_workflows_dir() -> PathBuf {
    PathBuf::from(".github/workflows")
}

impl Default for WorkflowsConfig {
    fn default() -> Self {
        WorkflowsConfig {
            dir: default_workflows_dir(),
        }
    }
}

fn ser_display<T: fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn ser_display_opt<T: fmt::Display, S: serde::Serializer>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

// ---------------------------------------------------------------------------------
// Raw, as written.

/// An environment value: strings, and numbers for convenience (`FAST_TEST: 1`).
#[derive(Debug, Clone)]
struct EnvValue(String);

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    version: u32,
    project: String,
    image: Option<ImageConfig>,
    #[serde(default)]
    images: IndexMap<String, ImageConfig>,
    #[serde(default)]
    source: SourceConfig,
    #[serde(default)]
    container: RawContainer,
    #[serde(default)]
    gpu: RawGpu,
    batches: IndexMap<String, RawBatch>,
    #[serde(default)]
    layers: IndexMap<String, RawLayer>,
    changed: Option<RawChanged>,
    #[serde(default)]
    workflows: WorkflowsConfig,
    /// Laid under every batch by `prepare`; read here only so that a wrong value is an
    /// error even where every batch sets its own.
    #[allow(dead_code)]
    defaults: Option<RawDefaults>,
}

/// `defaults:`: any batch key, each optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawDefaults {
    description: Option<String>,
    gpus: Option<u32>,
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
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawContainer {
    cpus: Option<f64>,
    memory: Option<Size>,
    shm: Option<Size>,
    disk: Option<Size>,
    reports_size: Option<Size>,
    pids: Option<i64>,
    network: Option<Network>,
    #[serde(default)]
    env: BTreeMap<String, EnvValue>,
    #[serde(default)]
    pass_env: Vec<String>,
    gpu_driver: Option<GpuDriver>,
    #[serde(default)]
    mounts: Vec<serde_json::Value>,
    ipc: Option<Ipc>,
    #[serde(default)]
    ulimits: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    cap_add: Vec<String>,
    user: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpu {
    pool: Option<PoolSpec>,
    probe: Option<ProbeChoice>,
    lock_dir: Option<PathBuf>,
    #[serde(default)]
    idle: IdlePolicy,
    wait: Option<Span>,
    #[serde(default)]
    allow_network_lock_dir: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBatch {
    description: Option<String>,
    gpus: i64,
    /// Required; an `Option` so that its absence is named (serde would complain about
    /// the missing value's unit).
    timeout: Option<Span>,
    #[serde(default)]
    preflight: Vec<String>,
    run: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, EnvValue>,
    #[serde(default)]
    fast_env: BTreeMap<String, EnvValue>,
    #[serde(default)]
    allow_empty: bool,
    #[serde(default)]
    tests: Vec<String>,
    /// The top-level `container` with this batch's keys laid over it (see `prepare`).
    container: Option<RawContainer>,
    meta: Option<serde_json::Value>,
    verdict: Option<BatchVerdict>,
    image: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawLayerBatches {
    Named(String),
    List(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLayer {
    description: Option<String>,
    batches: RawLayerBatches,
    #[serde(default)]
    fast: bool,
    meta: Option<serde_json::Value>,
    /// The image of its batches that name none.
    image: Option<String>,
}

// ---------------------------------------------------------------------------------
// Loading.

/// The largest manifest file read.
const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// The CPU limits the engine takes: it refuses less than a hundredth of a CPU, and a
/// value that small would otherwise round to "no limit".
const CPUS_RANGE: &str = "must be between 0.01 and 4096";

fn cpus_in_range(cpus: f64) -> bool {
    cpus.is_finite() && (0.01..=4096.0).contains(&cpus)
}

/// The places that hold a mapping, `*` for any key. serde would fill a struct from a
/// list by position (`container: [0.5, 256m, …, host]` would set the network without
/// naming it): a mapping must be written as one.
const MAPPINGS: &[&[&str]] = &[
    &[],
    &["image"],
    &["images"],
    &["images", "*"],
    &["source"],
    &["container"],
    &["container", "env"],
    &["container", "ulimits"],
    &["gpu"],
    &["gpu", "idle"],
    &["batches"],
    &["batches", "*"],
    &["batches", "*", "env"],
    &["batches", "*", "fast_env"],
    &["batches", "*", "container"],
    &["batches", "*", "container", "env"],
    &["batches", "*", "container", "ulimits"],
    &["batches", "*", "meta"],
    &["layers", "*", "meta"],
    &["layers"],
    &["layers", "*"],
    &["changed"],
    &["changed", "run"],
    &["changed", "run", "env"],
    &["changed", "run", "container"],
    &["workflows"],
];

/// Refuses a list or a value where [`MAPPINGS`] says a mapping belongs.
fn require_maps(node: &Node, check: &Checker<'_>, at: &[String]) -> Result<(), ManifestError> {
    let expected = |path: &[String]| {
        MAPPINGS.iter().any(|m| {
            m.len() == path.len() && m.iter().zip(path).all(|(p, seg)| *p == "*" || p == seg)
        })
    };
    if !expected(at) {
        return Ok(());
    }
    let yaml::NodeValue::Map(entries) = &node.value else {
        // `key:` with nothing after it is null, which serde takes as "not given".
        if matches!(&node.value, yaml::NodeValue::Scalar { text, plain: true } if text.is_empty() || text == "~" || text == "null")
        {
            return Ok(());
        }
        let what = if at.is_empty() {
            "the manifest".to_string()
        } else {
            format!("`{}`", at.join("."))
        };
        return Err(check.at(
            at,
            format!("{what} must be a mapping (`key: value` lines), not a list or a single value"),
        ));
    };
    for (k, v) in entries {
        let mut path = at.to_vec();
        path.push(k.scalar_text().unwrap_or_default().to_string());
        require_maps(v, check, &path)?;
    }
    Ok(())
}

/// `b` laid over `a`: mappings merge key by key (recursively), anything else in `b`
/// replaces `a`. Entries from `a` keep their positions, so an error in a default points
/// at the default.
fn overlay(a: &Node, b: Node) -> Node {
    match (&a.value, b.value) {
        (yaml::NodeValue::Map(base), yaml::NodeValue::Map(over)) => {
            let mut entries: Vec<(Node, Node)> = Vec::new();
            for (k, v) in over {
                let key = k.scalar_text().unwrap_or_default().to_string();
                let merged = match base.iter().find(|(bk, _)| bk.scalar_text() == Some(&key)) {
                    Some((_, bv)) => overlay(bv, v),
                    None => v,
                };
                entries.push((k, merged));
            }
            for (k, v) in base {
                let key = k.scalar_text().unwrap_or_default();
                if !entries
                    .iter()
                    .any(|(have, _)| have.scalar_text() == Some(key))
                {
                    entries.push((k.clone(), v.clone()));
                }
            }
            Node {
                value: yaml::NodeValue::Map(entries),
                mark: b.mark,
            }
        }
        (_, value) => Node {
            value,
            mark: b.mark,
        },
    }
}

/// Before the manifest is read: top-level `x-*` keys are dropped (a place for anchors,
/// the compose convention), `defaults:` is laid under every batch, and the top-level
/// `container:` under each batch's own `container:` (a batch overrides any key).
fn prepare(root: Node) -> Result<Node, (Mark, String)> {
    let Node { value, mark } = root;
    let yaml::NodeValue::Map(entries) = value else {
        return Ok(Node { value, mark });
    };
    let mut defaults: Option<Node> = None;
    let mut kept = Vec::new();
    for (k, v) in entries {
        match k.scalar_text() {
            Some(name) if name.starts_with("x-") => {}
            Some("defaults") => {
                if !matches!(v.value, yaml::NodeValue::Map(_)) {
                    return Err((
                        v.mark,
                        "defaults: must be a mapping of batch keys (`timeout: 1h`, `allow_empty: true`, …)".into(),
                    ));
                }
                // Kept as well, so that its own values are read (typed) even where
                // every batch overrides them.
                kept.push((k, v.clone()));
                defaults = Some(v);
            }
            _ => kept.push((k, v)),
        }
    }
    let container = kept
        .iter()
        .find(|(k, _)| k.scalar_text() == Some("container"))
        .map(|(_, v)| v.clone());
    for (k, v) in &mut kept {
        if k.scalar_text() != Some("batches") {
            continue;
        }
        let yaml::NodeValue::Map(batches) = &mut v.value else {
            continue;
        };
        for (_, batch) in batches.iter_mut() {
            if !matches!(batch.value, yaml::NodeValue::Map(_)) {
                continue;
            }
            let mut b = std::mem::replace(
                batch,
                Node {
                    value: yaml::NodeValue::Seq(Vec::new()),
                    mark: batch.mark,
                },
            );
            if let Some(d) = &defaults {
                b = overlay(d, b);
            }
            if let Some(top) = &container
                && let yaml::NodeValue::Map(fields) = &mut b.value
                && let Some((_, own)) = fields
                    .iter_mut()
                    .find(|(k, _)| k.scalar_text() == Some("container"))
            {
                let mine = std::mem::replace(
                    own,
                    Node {
                        value: yaml::NodeValue::Seq(Vec::new()),
                        mark: own.mark,
                    },
                );
                *own = overlay(top, mine);
            }
            *batch = b;
        }
    }
    // `changed.run` is a batch template: the defaults that fit it, and the container.
    for (k, v) in &mut kept {
        if k.scalar_text() != Some("changed") {
            continue;
        }
        let yaml::NodeValue::Map(fields) = &mut v.value else {
            continue;
        };
        let Some((_, run)) = fields
            .iter_mut()
            .find(|(k, _)| k.scalar_text() == Some("run"))
        else {
            continue;
        };
        if !matches!(run.value, yaml::NodeValue::Map(_)) {
            continue;
        }
        let mut r = std::mem::replace(
            run,
            Node {
                value: yaml::NodeValue::Seq(Vec::new()),
                mark: run.mark,
            },
        );
        if let Some(Node {
            value: yaml::NodeValue::Map(d),
            mark,
        }) = &defaults
        {
            let fitting = Node {
                value: yaml::NodeValue::Map(
                    d.iter()
                        .filter(|(k, _)| {
                            k.scalar_text()
                                .is_some_and(|k| CHANGED_RUN_DEFAULTS.contains(&k))
                        })
                        .cloned()
                        .collect(),
                ),
                mark: *mark,
            };
            r = overlay(&fitting, r);
        }
        if let Some(top) = &container
            && let yaml::NodeValue::Map(fields) = &mut r.value
        {
            match fields
                .iter_mut()
                .find(|(k, _)| k.scalar_text() == Some("container"))
            {
                Some((_, own)) => {
                    let mine = std::mem::replace(
                        own,
                        Node {
                            value: yaml::NodeValue::Seq(Vec::new()),
                            mark: own.mark,
                        },
                    );
                    *own = overlay(top, mine);
                }
                None => fields.push((
                    Node {
                        value: yaml::NodeValue::Scalar {
                            text: "container".into(),
                            plain: true,
                        },
                        mark: top.mark,
                    },
                    top.clone(),
                )),
            }
        }
        *run = r;
    }
    Ok(Node {
        value: yaml::NodeValue::Map(kept),
        mark,
    })
}

/// Finds `cibox.yaml` from `start` upwards, stopping at the git root.
pub fn find(start: &Path) -> Result<PathBuf, ManifestError> {
    let mut dir = Some(start);
    while let Some(d) = dir {
        let candidate = d.join(FILE_NAME);
        if candidate.is_file() {
            return Ok(candidate);
        }
        if d.join(".git").exists() {
            break;
        }
        dir = d.parent();
    }
    Err(ManifestError::NotFound {
        start: start.display().to_string(),
    })
}

/// Where a check failed: the key path and the tree to find its position in.
struct Checker<'a> {
    file: String,
    root: &'a Node,
}

impl Checker<'_> {
    fn at<S: AsRef<str>>(&self, path: &[S], message: impl fmt::Display) -> ManifestError {
        let node = self.root.locate(path);
        let key_path = path
            .iter()
            .map(|s| s.as_ref())
            .collect::<Vec<_>>()
            .join(".");
        ManifestError::At {
            path: self.file.clone(),
            mark: node.mark,
            message: if key_path.is_empty() {
                message.to_string()
            } else {
                format!("{key_path}: {message}")
            },
        }
    }

    /// Like [`Checker::at`] but points at the key of the last segment.
    fn at_key<S: AsRef<str>>(&self, path: &[S], message: impl fmt::Display) -> ManifestError {
        let mut err = self.at(path, message);
        if let (Some((last, parent)), ManifestError::At { mark, .. }) =
            (path.split_last(), &mut err)
            && let Some(k) = self.root.locate(parent).key(last.as_ref())
        {
            *mark = k.mark;
        }
        err
    }
}

impl Manifest {
    /// Reads and validates a manifest file, then applies the `CIBOX_*` overrides.
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        let read_err = |e: std::io::Error| ManifestError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        // Found on disk, so anyone's: a plain file (a FIFO would block), read only so far.
        let (file, _) = crate::util::open_plain(path, true).map_err(read_err)?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_MANIFEST_BYTES as u64 + 1),
            &mut bytes,
        )
        .map_err(read_err)?;
        // A manifest is a few kilobytes; one of megabytes is no manifest.
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::Read {
                path: path.display().to_string(),
                reason: format!(
                    "larger than {} MiB, the most a manifest may have",
                    MAX_MANIFEST_BYTES >> 20
                ),
            });
        }
        let text = String::from_utf8(bytes.clone()).map_err(|_| ManifestError::Read {
            path: path.display().to_string(),
            reason: "not UTF-8 text".into(),
        })?;
        let mut m = Self::parse(&text, path)?;
        m.digest = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
        m.apply_env(|k| std::env::var(k).ok())?;
        Ok(m)
    }

    /// Parses manifest text; `path` is used for messages and to anchor relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Manifest, ManifestError> {
        let file = path.display().to_string();
        let root = yaml::parse(text)
            .map_err(|e| ManifestError::At {
                path: file.clone(),
                mark: e.mark,
                message: format!("YAML syntax: {}", e.message),
            })?
            .ok_or_else(|| ManifestError::At {
                path: file.clone(),
                mark: Mark { line: 1, col: 1 },
                message: "the manifest is empty; start with `version: 1`".into(),
            })?;
        let root = prepare(root).map_err(|(mark, message)| ManifestError::At {
            path: file.clone(),
            mark,
            message,
        })?;
        let check = Checker {
            file: file.clone(),
            root: &root,
        };
        require_maps(&root, &check, &[])?;
        let raw: RawManifest =
            serde_path_to_error::deserialize(root.to_json()).map_err(|e| serde_error(&check, e))?;
        let dir = path
            .parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .unwrap_or(Path::new("."))
            .to_path_buf();
        validate(raw, &check, path.to_path_buf(), dir)
    }

    /// `CIBOX_CPUS`, `CIBOX_MEMORY`, `CIBOX_SHM`, `CIBOX_GPU_POOL`, `CIBOX_GPU_LOCK_DIR`
    /// override the manifest; a bad value names the variable.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ManifestError> {
        let env_err = |var, message: String| ManifestError::Env { var, message };
        if let Some(v) = get("CIBOX_CPUS") {
            let cpus: f64 = v
                .parse()
                .ok()
                .filter(|c: &f64| cpus_in_range(*c))
                .ok_or_else(|| {
                    env_err(
                        "CIBOX_CPUS",
                        format!(
                            "`{}` is not a CPU count: {CPUS_RANGE}",
                            crate::util::escape(&v)
                        ),
                    )
                })?;
            for c in self.containers_mut() {
                c.cpus = Some(cpus);
            }
        }
        if let Some(v) = get("CIBOX_MEMORY") {
            let memory: Size = v.parse().map_err(|e| env_err("CIBOX_MEMORY", e))?;
            for c in self.containers_mut() {
                c.memory = Some(memory);
            }
        }
        if let Some(v) = get("CIBOX_SHM") {
            let shm: Size = v.parse().map_err(|e| env_err("CIBOX_SHM", e))?;
            for c in self.containers_mut() {
                c.shm = shm;
            }
        }
        self.gpu.apply_env(&get)?;
        Ok(())
    }

    /// The top-level container and each batch's: what a `CIBOX_*` override changes.
    fn containers_mut(&mut self) -> impl Iterator<Item = &mut ContainerConfig> {
        std::iter::once(&mut self.container)
            .chain(self.batches.values_mut().map(|b| &mut b.container))
            .chain(
                self.changed
                    .iter_mut()
                    .filter_map(|c| c.run.as_mut())
                    .map(|r| &mut r.container),
            )
    }

    /// Resolves a path written in the manifest against the manifest's folder.
    pub fn resolve(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }
}

fn serde_error(
    check: &Checker<'_>,
    err: serde_path_to_error::Error<serde_json::Error>,
) -> ManifestError {
    let path: Vec<String> = err
        .path()
        .iter()
        .filter_map(|seg| match seg {
            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
            serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
            serde_path_to_error::Segment::Enum { variant } => Some(variant.clone()),
            serde_path_to_error::Segment::Unknown => None,
        })
        .collect();
    let inner = err.inner().to_string();
    if let Some((bad, expected)) = parse_unknown(&inner, "unknown field `") {
        let hint = did_you_mean(&bad, &expected)
            .map(|s| format!("; did you mean `{s}`?"))
            .unwrap_or_else(|| format!("; known keys: {}", expected.join(", ")));
        // serde_path_to_error includes the unknown key in the path; point at the key.
        let mut p = path.clone();
        if p.last() != Some(&bad) {
            p.push(bad.clone());
        }
        return check.at_key(&p, format!("unknown key `{bad}`{hint}"));
    }
    if let Some((bad, expected)) = parse_unknown(&inner, "unknown variant `") {
        let hint = did_you_mean(&bad, &expected)
            .map(|s| format!("did you mean `{s}`?"))
            .unwrap_or_else(|| format!("expected one of {}", expected.join(", ")));
        return check.at(&path, format!("`{bad}` is not allowed here; {hint}"));
    }
    if let Some(field) = inner
        .strip_prefix("missing field `")
        .and_then(|r| r.split('`').next())
    {
        return check.at(&path, format!("missing required key `{field}`"));
    }
    let message = inner.replace("invalid type: ", "wrong type: got ");
    check.at(&path, message)
}

/// Pulls the offending name and the expected names out of serde's message
/// ("unknown field `x`, expected one of `a`, `b`" / "expected `a`").
fn parse_unknown(msg: &str, prefix: &str) -> Option<(String, Vec<String>)> {
    let rest = msg.strip_prefix(prefix)?;
    let (bad, tail) = rest.split_once('`')?;
    let expected = tail
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    Some((bad.to_string(), expected))
}

/// Whether `s` may name a batch (as the manifest requires, and a run record must).
pub fn is_batch_name(s: &str) -> bool {
    is_name(s, true)
}

fn is_name(s: &str, upper_ok: bool) -> bool {
    let mut bytes = s.bytes();
    let first_ok = |b: u8| {
        b.is_ascii_digit() || b.is_ascii_lowercase() || (upper_ok && b.is_ascii_uppercase())
    };
    matches!(bytes.next(), Some(b) if first_ok(b))
        && bytes.all(|b| first_ok(b) || matches!(b, b'_' | b'.' | b'-'))
}

fn is_env_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

fn env_map(
    check: &Checker<'_>,
    path: &[&str],
    raw: BTreeMap<String, EnvValue>,
) -> Result<BTreeMap<String, String>, ManifestError> {
    raw.into_iter()
        .map(|(k, v)| {
            if !is_env_name(&k) {
                let mut p = path.to_vec();
                p.push(&k);
                return Err(check.at_key(&p, "not a valid environment variable name"));
            }
            if v.0.contains('\0') {
                let mut p = path.to_vec();
                p.push(&k);
                return Err(check.at(&p, "contains a NUL byte, which no environment can hold"));
            }
            Ok((k, v.0))
        })
        .collect()
}

/// Where the engine's socket usually is: mounting it (or a folder holding it) hands
/// the batch root on the host.
pub const ENGINE_SOCKETS: [&str; 3] = [
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
];

/// Whether a host path may be mounted into a batch container (read-only). Checked on the
/// path as written when the manifest is read, and on the resolved path before a run.
pub fn check_mount_source(p: &Path) -> Result<(), String> {
    if !p.is_absolute() {
        return Err("must be an absolute host path".into());
    }
    if p.components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err("must not contain `..`".into());
    }
    let under = |root: &str| p.starts_with(root);
    if p == Path::new("/") {
        return Err("is the whole host".into());
    }
    if ["/proc", "/sys", "/dev", "/boot", "/etc"]
        .iter()
        .any(|r| under(r))
    {
        return Err("is the host's system, kernel or device files".into());
    }
    if ["/home", "/root"].iter().any(|r| under(r))
        || std::env::var_os("HOME").is_some_and(|h| !h.is_empty() && h != "/" && p.starts_with(&h))
    {
        return Err("is in a home folder, where keys and tokens live; keep shared models and data elsewhere (e.g. /data)".into());
    }
    let engine = ENGINE_SOCKETS
        .iter()
        .any(|s| Path::new(s).starts_with(p) || p.starts_with(s))
        || [
            "/var/lib/docker",
            "/var/lib/containerd",
            "/run/docker",
            "/var/run/docker",
        ]
        .iter()
        .any(|r| under(r) || Path::new(r).starts_with(p));
    if engine {
        return Err("holds the container engine's socket or state (root on the host)".into());
    }
    // Where services keep their sockets (a read-only mount does not stop `connect`),
    // state, caches of secrets and logs, and where everyone's temporary files and
    // session sockets are (X11, ssh-agent).
    if ["/run", "/var", "/tmp", "/snap", "/opt/containerd"]
        .iter()
        .any(|r| under(r))
    {
        return Err("is where the host's services keep sockets, state and logs, or where everyone's temporary files and session sockets are; keep shared models and data in a folder of their own (e.g. /data)".into());
    }
    Ok(())
}

/// Where a mount may go in the container: not over what cibox provides or the system.
pub fn check_mount_target(t: &str) -> Result<(), String> {
    let p = Path::new(t);
    if !p.is_absolute() {
        return Err("must be an absolute path in the container".into());
    }
    if p.components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err("must not contain `..`".into());
    }
    if t.contains([',', ':']) {
        return Err("must not contain `,` or `:`".into());
    }
    if t.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    if p == Path::new("/") {
        return Err("is the container's root".into());
    }
    let reserved = [
        "/src",
        "/work",
        "/tmp",
        "/reports",
        "/proc",
        "/sys",
        "/dev",
        "/etc",
        "/bin",
        "/sbin",
        "/usr",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/run",
        "/var/run",
        "/.dockerenv",
    ];
    if let Some(r) = reserved.iter().find(|r| p.starts_with(r)) {
        return Err(format!("is under `{r}`, which cibox or the image provides"));
    }
    Ok(())
}

/// Checks that `name` is one of the manifest's images.
fn known_image(
    check: &Checker<'_>,
    images: &IndexMap<String, ImageConfig>,
    at: &[&str],
    name: &str,
) -> Result<(), ManifestError> {
    if images.contains_key(name) {
        return Ok(());
    }
    let known: Vec<String> = images.keys().cloned().collect();
    let hint = did_you_mean(name, &known)
        .map(|s| format!("did you mean `{s}`?"))
        .unwrap_or_else(|| format!("images: {}", known.join(", ")));
    Err(check.at(
        at,
        format!("`{name}` is not an image of this manifest; {hint}"),
    ))
}

/// `meta`: a mapping of plain data (strings, numbers, booleans, lists and mappings of
/// them), passed to templates untouched.
fn plain_meta(
    check: &Checker<'_>,
    at: &[&str],
    meta: Option<serde_json::Value>,
) -> Result<serde_json::Value, ManifestError> {
    fn plain(v: &serde_json::Value, path: &mut Vec<String>) -> Result<(), Vec<String>> {
        match v {
            serde_json::Value::Null => Err(path.clone()),
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(i.to_string());
                    plain(item, path)?;
                    path.pop();
                }
                Ok(())
            }
            serde_json::Value::Object(map) => {
                for (k, item) in map {
                    path.push(k.clone());
                    plain(item, path)?;
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
    plain(&meta, &mut path).map_err(|bad| {
        check.at(
            &bad,
            "is empty (null): meta holds plain data only (strings, numbers, booleans, lists, mappings); quote it, \"\", if you mean an empty string",
        )
    })?;
    Ok(meta)
}

/// Reads a `container:` block (the top-level one, or a batch's merged over it).
fn validate_container(
    check: &Checker<'_>,
    at: &[&str],
    c: RawContainer,
) -> Result<ContainerConfig, ManifestError> {
    let at_key =
        |key: &[&str]| -> Vec<String> { at.iter().chain(key).map(|s| s.to_string()).collect() };
    if let Some(cpus) = c.cpus
        && !cpus_in_range(cpus)
    {
        return Err(check.at(&at_key(&["cpus"]), CPUS_RANGE));
    }
    let pids = c.pids.unwrap_or(4096);
    if pids <= 0 || pids > u32::MAX as i64 {
        return Err(check.at(&at_key(&["pids"]), "must be a positive whole number"));
    }
    for (i, name) in c.pass_env.iter().enumerate() {
        if !is_env_name(name) {
            return Err(check.at(
                &at_key(&["pass_env", &i.to_string()]),
                format!("`{name}` is not a valid environment variable name"),
            ));
        }
    }
    for (field, size) in [("disk", c.disk), ("reports_size", c.reports_size)] {
        if size.is_some_and(|s| s.0 < 1 << 20) {
            return Err(check.at(&at_key(&[field]), "must be at least 1m"));
        }
    }
    let mut mounts = Vec::new();
    for (i, m) in c.mounts.iter().enumerate() {
        let idx = i.to_string();
        let here = at_key(&["mounts", &idx]);
        let (source, target) = match m {
            serde_json::Value::String(text) => match text.split_once(':') {
                Some((s, t)) => (s.to_string(), t.to_string()),
                None => (text.clone(), text.clone()),
            },
            serde_json::Value::Object(o) => {
                if let Some(k) = o.keys().find(|k| *k != "source" && *k != "target") {
                    return Err(check.at(
                        &here,
                        format!("unknown key `{k}`; a mount has `source` and `target` (always read-only)"),
                    ));
                }
                let text = |k: &str| o.get(k).and_then(|v| v.as_str()).map(str::to_string);
                match (text("source"), text("target")) {
                    (Some(s), Some(t)) => (s, t),
                    (Some(s), None) => (s.clone(), s),
                    _ => {
                        return Err(check.at(
                            &here,
                            "needs `source:` (a host path) and may have `target:`",
                        ));
                    }
                }
            }
            _ => {
                return Err(check.at(
                    &here,
                    "a mount is `SOURCE:TARGET` or {source: …, target: …}",
                ));
            }
        };
        let mark = check.root.locate(&here).mark;
        let source_path = PathBuf::from(&source);
        if let Err(why) = check_mount_source(&source_path) {
            return Err(check.at(&here, format!("source `{source}`: {why}")));
        }
        if let Err(why) = check_mount_target(&target) {
            return Err(check.at(&here, format!("target `{target}`: {why}")));
        }
        let normal: PathBuf = Path::new(&target).components().collect();
        if let Some(other) = mounts.iter().position(|m: &HostMount| {
            Path::new(&m.target).components().collect::<PathBuf>() == normal
        }) {
            return Err(check.at(
                &here,
                format!("target `{target}` is also the target of mount {other}; each mount needs its own"),
            ));
        }
        mounts.push(HostMount {
            source: source_path,
            target,
            host_path: None,
            submounts: Vec::new(),
            mark,
        });
    }
    let mut ulimits = BTreeMap::new();
    for (name, value) in &c.ulimits {
        let here = at_key(&["ulimits", name]);
        if !ULIMIT_NAMES.contains(&name.as_str()) {
            return Err(check.at(
                &here,
                format!(
                    "`{name}` is not a ulimit; known: {}",
                    ULIMIT_NAMES.join(", ")
                ),
            ));
        }
        let one = |v: &serde_json::Value| -> Option<i64> {
            match v {
                serde_json::Value::String(s) if s == "unlimited" => Some(-1),
                serde_json::Value::Number(n) => n.as_i64().filter(|n| *n >= 0),
                _ => None,
            }
        };
        let limit = match value {
            serde_json::Value::Object(o) => match (
                o.get("soft").and_then(one),
                o.get("hard").and_then(one),
                o.len(),
            ) {
                (Some(soft), Some(hard), 2) => Ulimit { soft, hard },
                _ => return Err(check.at(&here, "is a number, `unlimited`, or {soft: …, hard: …}")),
            },
            v => match one(v) {
                Some(n) => Ulimit { soft: n, hard: n },
                None => {
                    return Err(check.at(&here, "is a number, `unlimited`, or {soft: …, hard: …}"));
                }
            },
        };
        if limit.hard != -1 && (limit.soft == -1 || limit.soft > limit.hard) {
            return Err(check.at(&here, "the soft limit is above the hard one"));
        }
        // Below these the batch's shell cannot start (or fork, or open its files).
        let floor = match name.as_str() {
            "nofile" | "nproc" => 64,
            "stack" => 65536,
            "fsize" => 1 << 20,
            "data" => 64 << 20,
            _ => 0,
        };
        if limit.soft != -1 && limit.soft < floor {
            return Err(check.at(
                &here,
                format!(
                    "{} is too low for the batch's own shell to work; at least {floor}",
                    limit.soft
                ),
            ));
        }
        ulimits.insert(name.clone(), limit);
    }
    let mut cap_add = Vec::new();
    for (i, cap) in c.cap_add.iter().enumerate() {
        let name = cap.to_ascii_uppercase();
        let name = name.strip_prefix("CAP_").unwrap_or(&name).to_string();
        if !CAP_ADD_ALLOWED.contains(&name.as_str()) {
            return Err(check.at(
                &at_key(&["cap_add", &i.to_string()]),
                format!(
                    "`{cap}` is not allowed; cap_add takes only {} (every other capability stays dropped)",
                    CAP_ADD_ALLOWED.join(", ")
                ),
            ));
        }
        if cap_add.contains(&name) {
            return Err(check.at(
                &at_key(&["cap_add", &i.to_string()]),
                format!("`{cap}` is listed twice"),
            ));
        }
        cap_add.push(name);
    }
    let user = match c.user.as_deref() {
        None | Some("invoker") => ContainerUser::Invoker,
        Some("root") => ContainerUser::Root,
        Some(text) => {
            // Not 0 (that is `root`, said so) and not 2^32-1, which means "none" to
            // the kernel.
            let id = |s: &str| {
                s.parse::<u32>()
                    .ok()
                    .filter(|n| (1..u32::MAX).contains(n) && !s.starts_with('+'))
            };
            let ids = text
                .split_once(':')
                .and_then(|(u, g)| Some((id(u)?, id(g)?)));
            match ids {
                Some((u, g)) => ContainerUser::Ids(u, g),
                None => {
                    return Err(check.at(
                        &at_key(&["user"]),
                        format!("`{text}` is not `invoker`, `root` or `UID:GID` (numbers from 1 to 4294967294; for uid or gid 0 write `root`)"),
                    ));
                }
            }
        }
    };
    // Capabilities reach only a root process: without ambient capabilities (which
    // no-new-privileges keeps out) any other user's are cleared when it starts.
    if !cap_add.is_empty() && user != ContainerUser::Root {
        return Err(check.at(
            &at_key(&["cap_add"]),
            format!(
                "takes effect only with `user: root` (a batch running as {user} gets no capability); add `user: root` or drop cap_add"
            ),
        ));
    }
    Ok(ContainerConfig {
        cpus: c.cpus,
        memory: c.memory,
        shm: c.shm.unwrap_or(Size(1 << 30)),
        disk: c.disk.unwrap_or(Size(10 << 30)),
        reports_size: c.reports_size.unwrap_or(Size(1 << 30)),
        pids: pids as u32,
        network: c.network.unwrap_or(Network::None),
        env: env_map(
            check,
            &at_key(&["env"])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            c.env,
        )?,
        pass_env: c.pass_env,
        gpu_driver: c.gpu_driver.unwrap_or(GpuDriver::Nvidia),
        mounts,
        ipc: c.ipc.unwrap_or(Ipc::Private),
        ulimits,
        cap_add,
        user,
    })
}

fn validate(
    raw: RawManifest,
    check: &Checker<'_>,
    path: PathBuf,
    dir: PathBuf,
) -> Result<Manifest, ManifestError> {
    if raw.version != 1 {
        return Err(check.at(
            &["version"],
            format!(
                "version {} is not supported; this cibox reads version 1",
                raw.version
            ),
        ));
    }
    if !is_name(&raw.project, false) {
        return Err(check.at(
            &["project"],
            format!(
                "`{}` is not a valid project name: use [a-z0-9][a-z0-9_.-]* (it becomes part of container names and labels)",
                raw.project
            ),
        ));
    }
    let images: IndexMap<String, ImageConfig> = match (raw.image, raw.images.is_empty()) {
        (Some(_), false) => {
            return Err(check.at(
                &["images"],
                "write either `image:` (one image) or `images:` (named ones, with `default`), not both",
            ));
        }
        (Some(one), true) => IndexMap::from([(DEFAULT_IMAGE.to_string(), one)]),
        (None, true) => IndexMap::from([(DEFAULT_IMAGE.to_string(), ImageConfig::default())]),
        (None, false) => raw.images,
    };
    let written_as = |name: &str| -> Vec<String> {
        if images.len() == 1 && check.root.get("images").is_none() {
            vec!["image".to_string()]
        } else {
            vec!["images".to_string(), name.to_string()]
        }
    };
    let mut variables: BTreeMap<String, &String> = BTreeMap::new();
    for (name, img) in &images {
        let at = written_as(name);
        let at_key =
            |k: &str| -> Vec<String> { at.iter().cloned().chain([k.to_string()]).collect() };
        if !is_name(name, true) {
            return Err(check.at_key(
                &at,
                format!(
                    "`{name}` is not a valid image name: use letters, digits, `_`, `.` and `-`"
                ),
            ));
        }
        if let Some(other) = variables.insert(image_variable(name), name) {
            return Err(check.at_key(
                &at,
                format!(
                    "`{name}` and `{other}` would share the variable {} that picks an image's ID; rename one",
                    image_variable(name)
                ),
            ));
        }
        if img.nix.is_some() && img.dockerfile.is_some() {
            return Err(check.at(
                &at,
                "set either `nix` or `dockerfile` as the image recipe, not both",
            ));
        }
        if let Some(r) = &img.reference
            && let Err(why) = crate::image::PinnedRef::parse(r)
        {
            return Err(check.at(&at_key("ref"), why));
        }
        if let Some(id) = &img.id
            && let Err(why) = crate::image::ImageId::parse(id.trim())
        {
            return Err(check.at(&at_key("id"), why));
        }
        for (i, pat) in img.locks.iter().enumerate() {
            if pat.is_empty() || Path::new(pat).is_absolute() || pat.split('/').any(|c| c == "..") {
                let mut here = at_key("locks");
                here.push(i.to_string());
                return Err(check.at(
                    &here,
                    format!("`{pat}` must be a relative path inside the manifest's folder"),
                ));
            }
        }
    }
    if !images.contains_key(DEFAULT_IMAGE) {
        let named: Vec<&String> = raw
            .batches
            .iter()
            .filter(|(_, b)| b.image.is_none())
            .map(|(n, _)| n)
            .collect();
        if let Some(first) = named.first() {
            return Err(check.at(
                &["batches", first.as_str()],
                format!(
                    "names no `image`, and `images` has no `{DEFAULT_IMAGE}`: add `image: NAME` (one of {}) or an image named `{DEFAULT_IMAGE}`",
                    images.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }

    let top_container = raw.container.clone();
    let container = validate_container(check, &["container"], raw.container)?;

    if raw.gpu.idle.max_utilization > 100 {
        return Err(check.at(
            &["gpu", "idle", "max_utilization"],
            "is a percentage: 0 to 100",
        ));
    }
    let gpu = GpuConfig {
        pool: raw.gpu.pool.unwrap_or(PoolSpec::All),
        probe: raw.gpu.probe.unwrap_or(ProbeChoice::Auto),
        lock_dir: raw
            .gpu
            .lock_dir
            .unwrap_or_else(|| PathBuf::from("/run/lock/cibox")),
        idle: raw.gpu.idle,
        wait: raw.gpu.wait.unwrap_or(Span(std::time::Duration::ZERO)),
        allow_network_lock_dir: raw.gpu.allow_network_lock_dir,
    };

    if raw.batches.is_empty() {
        return Err(check.at(&["batches"], "define at least one batch"));
    }
    let mut batches = IndexMap::new();
    // Batches that name their image (themselves or through `defaults`): a layer's
    // `image` does not change theirs.
    let mut explicit_image = std::collections::HashSet::new();
    // Which layer gave an image-less batch its image.
    let mut image_from_layer: std::collections::HashMap<String, String> = Default::default();
    for (name, b) in raw.batches {
        if !is_name(&name, true) {
            return Err(check.at_key(
                &["batches", &name],
                format!("`{name}` is not a valid batch name: use letters, digits, `_`, `.` and `-`, starting with a letter or digit"),
            ));
        }
        if b.gpus < 0 {
            return Err(check.at(
                &["batches", &name, "gpus"],
                format!("must be 0 or more, got {}", b.gpus),
            ));
        }
        if b.gpus > u32::MAX as i64 {
            return Err(check.at(&["batches", &name, "gpus"], "is too large"));
        }
        let Some(timeout) = b.timeout else {
            return Err(check.at(
                &["batches", &name],
                "missing required key `timeout`: add one (`timeout: 30m`), or set it for every batch under `defaults:`",
            ));
        };
        if timeout.0.is_zero() {
            return Err(check.at(&["batches", &name, "timeout"], "must be more than 0s"));
        }
        if b.run.is_empty() || b.run.iter().all(|s| s.trim().is_empty()) {
            return Err(check.at(&["batches", &name, "run"], "needs at least one command"));
        }
        let batch_container = match b.container {
            Some(c) => validate_container(check, &["batches", &name, "container"], c)?,
            None => validate_container(check, &["container"], top_container.clone())?,
        };
        let batch = Batch {
            description: b.description,
            gpus: b.gpus as u32,
            timeout,
            preflight: b.preflight,
            run: b.run,
            env: env_map(check, &["batches", &name, "env"], b.env)?,
            fast_env: env_map(check, &["batches", &name, "fast_env"], b.fast_env)?,
            allow_empty: b.allow_empty,
            tests: b.tests,
            container: batch_container,
            meta: plain_meta(check, &["batches", &name, "meta"], b.meta)?,
            verdict: b.verdict.unwrap_or_default(),
            image: match &b.image {
                Some(img) => {
                    known_image(check, &images, &["batches", &name, "image"], img)?;
                    img.clone()
                }
                None => DEFAULT_IMAGE.to_string(),
            },
            changed_file: None,
        };
        if b.image.is_some() {
            explicit_image.insert(name.clone());
        }
        batches.insert(name, batch);
    }

    let known: Vec<String> = batches.keys().cloned().collect();
    let mut layers = IndexMap::new();
    for (name, l) in raw.layers {
        if !is_name(&name, true) {
            return Err(check.at_key(
                &["layers", &name],
                format!("`{name}` is not a valid layer name: use letters, digits, `_`, `.` and `-`, starting with a letter or digit (it reaches workflow files)"),
            ));
        }
        let (list, all) = match l.batches {
            RawLayerBatches::Named(s) if s == "all" => (known.clone(), true),
            RawLayerBatches::Named(s) => {
                return Err(check.at(
                    &["layers", &name, "batches"],
                    format!("`{s}` is not a list of batches; write `all` or [name, …]"),
                ));
            }
            RawLayerBatches::List(v) => (v, false),
        };
        if list.is_empty() {
            return Err(check.at(&["layers", &name, "batches"], "lists no batch"));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, b) in list.iter().enumerate() {
            let at = ["layers", &name, "batches", &i.to_string()];
            if !batches.contains_key(b) {
                let hint = did_you_mean(b, &known)
                    .map(|s| format!("; did you mean `{s}`?"))
                    .unwrap_or_else(|| format!("; defined batches: {}", known.join(", ")));
                return Err(check.at(&at, format!("batch `{b}` is not defined{hint}")));
            }
            if !seen.insert(b) {
                return Err(check.at(&at, format!("batch `{b}` is listed twice")));
            }
        }
        if let Some(img) = &l.image {
            known_image(check, &images, &["layers", &name, "image"], img)?;
            for b in &list {
                if explicit_image.contains(b) {
                    continue;
                }
                if let Some(other) = image_from_layer.get(b)
                    && batches[b].image != *img
                {
                    return Err(check.at(
                        &["layers", &name, "image"],
                        format!(
                            "batch `{b}` is in layer `{other}` too, which gives it image `{}`: name its image on the batch",
                            batches[b].image
                        ),
                    ));
                }
                image_from_layer.insert(b.clone(), name.clone());
                if let Some(batch) = batches.get_mut(b) {
                    batch.image = img.clone();
                }
            }
        }
        let meta = plain_meta(check, &["layers", &name, "meta"], l.meta)?;
        layers.insert(
            name,
            Layer {
                description: l.description,
                batches: list,
                all,
                fast: l.fast,
                meta,
            },
        );
    }

    let changed = match raw.changed {
        None => None,
        Some(ch) => {
            if ch.patterns.is_empty() {
                return Err(check.at(&["changed", "patterns"], "lists no pattern"));
            }
            if !is_env_name(&ch.gpus_marker) {
                return Err(check.at(
                    &["changed", "gpus_marker"],
                    "must be a Python identifier such as NUM_GPUS",
                ));
            }
            let run = match ch.run {
                None => None,
                Some(r) => {
                    let Some(timeout) = r.timeout.filter(|t| !t.0.is_zero()) else {
                        return Err(check.at(
                            &["changed", "run"],
                            "needs a `timeout` of more than 0s (here or under `defaults:`)",
                        ));
                    };
                    if r.command.trim().is_empty() {
                        return Err(check.at(&["changed", "run", "command"], "is empty"));
                    }
                    let container = match r.container {
                        Some(c) => validate_container(check, &["changed", "run", "container"], c)?,
                        None => validate_container(check, &["container"], top_container.clone())?,
                    };
                    Some(ChangedRun {
                        command: r.command,
                        timeout,
                        preflight: r.preflight,
                        env: env_map(check, &["changed", "run", "env"], r.env)?,
                        fast_env: env_map(check, &["changed", "run", "fast_env"], r.fast_env)?,
                        allow_empty: r.allow_empty,
                        container,
                        verdict: r.verdict.unwrap_or_default(),
                        image: match r.image {
                            Some(img) => {
                                known_image(check, &images, &["changed", "run", "image"], &img)?;
                                img
                            }
                            None => DEFAULT_IMAGE.to_string(),
                        },
                    })
                }
            };
            Some(ChangedConfig {
                patterns: ch.patterns,
                gpus_marker: ch.gpus_marker,
                default_gpus: ch.default_gpus,
                run,
            })
        }
    };

    Ok(Manifest {
        path,
        dir,
        digest: String::new(),
        project: raw.project,
        image: images
            .get(DEFAULT_IMAGE)
            .or_else(|| images.values().next())
            .cloned()
            .unwrap_or_default(),
        images,
        source: raw.source,
        container,
        gpu,
        batches,
        layers,
        changed,
        workflows: raw.workflows,
    })
}

/// `GPU-` and the 8-4-4-4-12 hex groups nvidia-smi prints.
pub fn is_gpu_uuid(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
version: 1
project: demo
image:
  locks: [flake.lock]
batches:
  cpu:
    description: CPU tests
    gpus: 0
    timeout: 15m
    run: ["pytest"]
  "4a":
    gpus: 1
    timeout: 30m
    env: {A: "1", B: 2}
    run: ["pytest fp8"]
layers:
  "1": {batches: [cpu]}
  "3": {batches: all, fast: false}
"#;

    fn parse(text: &str) -> Result<Manifest, String> {
        Manifest::parse(text, Path::new("cibox.yaml")).map_err(|e| e.to_string())
    }

    /// A manifest for real GPU tests: defaults, merge keys, `x-*` anchors, meta, and a
    /// batch overriding container keys.
    const REAL: &str = r#"
version: 1
project: rl
x-nccl: &nccl
  ipc: host
  ulimits: {memlock: unlimited, stack: 67108864, nofile: {soft: 1024, hard: 65536}}
  cap_add: [SYS_NICE, cap_ipc_lock]
image: {locks: [flake.lock]}
container:
  mounts: ["/data/models:/models", {source: /data/datasets}]
  user: root
  env: {A: top}
defaults:
  timeout: 2h
  allow_empty: true
  env: {SHARED: "1"}
  meta: {runner: gpu-8x}
batches:
  e2e:
    gpus: 8
    run: [bash tests/e2e.sh]
    env: {OWN: "2"}
    meta: {label: run-ci-e2e}
    container:
      <<: *nccl
      network: bridge
      env: {B: mine}
  cpu:
    gpus: 0
    timeout: 10m
    run: [pytest]
    container: {user: invoker, mounts: []}
layers:
  gpu: {batches: [e2e], meta: {label: run-ci-gpu, deps: [flash-attn]}}
"#;

    #[test]
    fn a_manifest_for_real_gpu_tests() {
        let m = parse(REAL).unwrap();
        let e2e = &m.batches["e2e"];
        assert_eq!(e2e.timeout.to_string(), "2h");
        assert!(e2e.allow_empty);
        assert_eq!(e2e.env["SHARED"], "1");
        assert_eq!(e2e.env["OWN"], "2");
        // Mappings merge key by key: the batch's meta and env keep the defaults'.
        assert_eq!(
            e2e.meta,
            serde_json::json!({"label": "run-ci-e2e", "runner": "gpu-8x"})
        );
        let c = &e2e.container;
        assert_eq!(c.ipc, Ipc::Host);
        assert_eq!(c.network, Network::Bridge);
        assert_eq!(c.cap_add, ["SYS_NICE", "IPC_LOCK"]);
        assert_eq!(c.ulimits["memlock"], Ulimit { soft: -1, hard: -1 });
        assert_eq!(
            c.ulimits["nofile"],
            Ulimit {
                soft: 1024,
                hard: 65536
            }
        );
        assert_eq!(c.user, ContainerUser::Root);
        assert_eq!(c.env["A"], "top");
        assert_eq!(c.env["B"], "mine");
        let mounts: Vec<(String, &str)> = c
            .mounts
            .iter()
            .map(|m| (m.source.display().to_string(), m.target.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                ("/data/models".to_string(), "/models"),
                ("/data/datasets".to_string(), "/data/datasets")
            ]
        );
        // The other batch overrides the user and drops the mounts; the rest is the top's.
        let cpu = &m.batches["cpu"].container;
        assert_eq!(cpu.user, ContainerUser::Invoker);
        assert!(cpu.mounts.is_empty());
        assert_eq!(cpu.ipc, Ipc::Private);
        assert_eq!(m.batches["cpu"].timeout.to_string(), "10m");
        assert_eq!(m.layers["gpu"].meta["deps"][0], "flash-attn");
        // What the record says was loosened.
        let loose = e2e.container.loosenings();
        assert_eq!(loose["ipc"], "host");
        assert_eq!(loose["user"], "root");
        assert_eq!(loose["network"], "bridge");
        assert_eq!(cpu.loosenings(), serde_json::json!({}));
    }

    #[test]
    fn real_gpu_settings_refuse_bad_input_with_a_position() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "/data/models:/models",
                "/proc:/p",
                "cibox.yaml:10:12: container.mounts.0: source `/proc`: is the host's system",
            ),
            (
                "/data/models:/models",
                "/home/ci/.cache:/cache",
                "container.mounts.0: source `/home/ci/.cache`: is in a home folder",
            ),
            (
                "/data/models:/models",
                "/var/run/docker.sock:/s",
                "container.mounts.0: source `/var/run/docker.sock`: holds the container engine's socket",
            ),
            (
                "/data/models:/models",
                "/var/run:/r",
                "holds the container engine's socket",
            ),
            (
                "/data/models:/models",
                "/:/host",
                "source `/`: is the whole host",
            ),
            (
                "/data/models:/models",
                "data/models:/models",
                "container.mounts.0: source `data/models`: must be an absolute host path",
            ),
            (
                "/data/models:/models",
                "/data/models:/work/m",
                "target `/work/m`: is under `/work`",
            ),
            (
                "cap_ipc_lock",
                "SYS_ADMIN",
                "batches.e2e.container.cap_add.1: `SYS_ADMIN` is not allowed; cap_add takes only IPC_LOCK, SYS_NICE, SYS_PTRACE",
            ),
            (
                "user: root",
                "user: admin",
                "container.user: `admin` is not `invoker`, `root` or `UID:GID`",
            ),
            (
                "memlock: unlimited",
                "memlock: lots",
                "ulimits.memlock: is a number, `unlimited`, or {soft: …, hard: …}",
            ),
            (
                "memlock: unlimited",
                "memlok: 1",
                "`memlok` is not a ulimit",
            ),
            (
                "      <<: *nccl",
                "      <<: 3",
                "cibox.yaml:25:11: YAML syntax: a merge key (`<<`) takes a mapping or a list of mappings",
            ),
            (
                "meta: {label: run-ci-e2e}",
                "meta: {label: ~}",
                "batches.e2e.meta.label: is empty (null)",
            ),
            (
                "meta: {label: run-ci-e2e}",
                "meta: [a]",
                "batches.e2e.meta: `batches.e2e.meta` must be a mapping",
            ),
            (
                "ipc: host",
                "ipc: shareable",
                "`shareable` is not allowed here",
            ),
            (
                "defaults:\n  timeout: 2h",
                "defaults:\n  timout: 2h",
                "unknown key `timout`; did you mean `timeout`?",
            ),
            (
                "/data/models:/models",
                "/run/dbus:/dbus",
                "source `/run/dbus`: is where the host's services keep sockets",
            ),
            (
                "{source: /data/datasets}",
                "{source: /data/datasets, target: /models/}",
                "target `/models/` is also the target of mount 0",
            ),
            (
                "/data/models:/models",
                "/data/models:/sbin/x",
                "target `/sbin/x`: is under `/sbin`",
            ),
            (
                "\"/data/models:/models\"",
                "{source: /data/models, target: \"/m\\nx\"}",
                "must not contain control characters",
            ),
            (
                "user: root",
                "user: \"4294967295:1\"",
                "numbers from 1 to 4294967294",
            ),
            (
                "user: root",
                "user: \"65534:0\"",
                "for uid or gid 0 write `root`",
            ),
            (
                "user: root",
                "user: \"1000:1000\"",
                "container.cap_add: takes effect only with `user: root` (a batch running as 1000:1000 gets no capability)",
            ),
            (
                "nofile: {soft: 1024, hard: 65536}",
                "nofile: 0",
                "ulimits.nofile: 0 is too low for the batch's own shell to work; at least 64",
            ),
            (
                "cap_ipc_lock",
                "\"SYS_NICE \"",
                "`SYS_NICE ` is not allowed",
            ),
            (
                "cap_ipc_lock",
                "sys_nice",
                "cap_add.1: `sys_nice` is listed twice",
            ),
            (
                "defaults:\n  timeout: 2h",
                "defaults:\n  timeout: 2h\n  gpus: many",
                "cibox.yaml:15:9: defaults.gpus: wrong type",
            ),
        ];
        for (from, to, want) in cases {
            assert!(REAL.contains(from), "{from}");
            let err = parse(&REAL.replacen(from, to, 1)).unwrap_err();
            assert!(err.contains(want), "{to}: {err}");
        }
        // Without defaults, a batch without a timeout says so.
        let err = parse(&REAL.replace("defaults:\n  timeout: 2h\n", "defaults:\n")).unwrap_err();
        assert!(
            err.contains("batches.e2e: missing required key `timeout`"),
            "{err}"
        );
    }

    #[test]
    fn changed_run_takes_the_defaults_that_fit_and_the_container() {
        let text = REAL.replace(
            "layers:",
            "changed:\n  patterns: [\"tests/**/test_*.py\"]\n  run:\n    command: pytest \"$CIBOX_TEST_FILE\"\n    container: {ipc: host}\nlayers:",
        );
        let mut m = parse(&text).unwrap();
        // CIBOX_* overrides reach every container, the template's too.
        m.apply_env(|k| (k == "CIBOX_MEMORY").then(|| "2g".to_string()))
            .unwrap();
        assert_eq!(m.batches["e2e"].container.memory.unwrap().to_string(), "2g");
        let run = m.changed.unwrap().run.unwrap();
        assert_eq!(run.container.memory.unwrap().to_string(), "2g");
        assert_eq!(run.timeout.to_string(), "2h");
        assert!(run.allow_empty);
        assert_eq!(run.env["SHARED"], "1");
        assert_eq!(run.container.ipc, Ipc::Host);
        assert_eq!(run.container.user, ContainerUser::Root);
        assert_eq!(run.container.mounts.len(), 2);
        let no_default = text
            .replace("defaults:\n  timeout: 2h\n", "defaults:\n")
            .replace("    gpus: 8\n", "    gpus: 8\n    timeout: 1h\n");
        let err = parse(&no_default).unwrap_err();
        assert!(err.contains("changed.run: needs a `timeout`"), "{err}");
    }

    #[test]
    fn named_images_per_batch_and_layer() {
        let text = "version: 1\nproject: p\nimages:\n  default: {locks: [a.lock]}\n  megatron: {locks: [m.lock], dockerfile: m/Dockerfile}\nbatches:\n  cpu: {gpus: 0, timeout: 1m, run: [x]}\n  e2e: {gpus: 8, timeout: 1h, run: [x]}\n  own: {gpus: 1, timeout: 1h, run: [x], image: default}\nlayers:\n  mega: {batches: [e2e, own], image: megatron}\n";
        let m = parse(text).unwrap();
        assert_eq!(m.batches["cpu"].image, "default");
        assert_eq!(m.batches["e2e"].image, "megatron");
        assert_eq!(
            m.batches["own"].image, "default",
            "a batch's own image wins"
        );
        assert_eq!(m.images["megatron"].locks, ["m.lock"]);
        assert_eq!(m.image.locks, ["a.lock"], "image is the default one");
        // The single `image:` form is the default image.
        let one = parse(GOOD).unwrap();
        assert_eq!(one.images.keys().collect::<Vec<_>>(), ["default"]);
        let cases: &[(&str, &str, &str)] = &[
            (
                "image: default}",
                "image: megatorn}",
                "cibox.yaml:9:48: batches.own.image: `megatorn` is not an image of this manifest; did you mean `megatron`?",
            ),
            (
                "image: megatron}",
                "image: nope}",
                "layers.mega.image: `nope` is not an image of this manifest",
            ),
            (
                "  default: {locks: [a.lock]}\n",
                "",
                "batches.cpu: names no `image`, and `images` has no `default`",
            ),
            (
                "images:\n",
                "image: {locks: [x]}\nimages:\n",
                "images: write either `image:` (one image) or `images:`",
            ),
            (
                "  megatron: {",
                "  \"m t\": {",
                "`m t` is not a valid image name",
            ),
            (
                "  megatron: {",
                "  a_b: {locks: [x]}\n  a-b: {",
                "`a-b` and `a_b` would share the variable CIBOX_IMAGE_A_B",
            ),
        ];
        for (from, to, want) in cases {
            assert!(text.contains(from), "{from}");
            let err = parse(&text.replacen(from, to, 1)).unwrap_err();
            assert!(err.contains(want), "{to}: {err}");
        }
        let two_layers = text.replace(
            "layers:\n",
            "layers:\n  other: {batches: [e2e], image: default}\n",
        );
        let err = parse(&two_layers).unwrap_err();
        assert!(err.contains("batch `e2e` is in layer `other` too"), "{err}");
    }

    #[test]
    fn good_manifest() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.project, "demo");
        assert_eq!(m.batches.keys().collect::<Vec<_>>(), ["cpu", "4a"]);
        assert_eq!(m.batches["4a"].env["B"], "2");
        assert_eq!(m.layers["3"].batches, ["cpu", "4a"]);
        assert_eq!(m.gpu.pool, PoolSpec::All);
        assert_eq!(m.container.network, Network::None);
    }

    #[test]
    fn unknown_key_names_position_and_suggestion() {
        let err = parse(&GOOD.replace("    gpus: 1", "    gpu: 1\n    gpus: 1")).unwrap_err();
        assert!(
            err.starts_with(
                "cibox.yaml:13:5: batches.4a.gpu: unknown key `gpu`; did you mean `gpus`?"
            ),
            "{err}"
        );
    }

    #[test]
    fn negative_gpus() {
        let err = parse(&GOOD.replace("gpus: 1", "gpus: -1")).unwrap_err();
        assert!(
            err.contains("cibox.yaml:13:11: batches.4a.gpus: must be 0 or more"),
            "{err}"
        );
    }

    #[test]
    fn wrong_type() {
        let err = parse(&GOOD.replace("gpus: 1", "gpus: many")).unwrap_err();
        assert!(err.contains("batches.4a.gpus: wrong type"), "{err}");
    }

    #[test]
    fn duplicate_batch() {
        let dup = GOOD.replace(
            "layers:",
            "  cpu:\n    gpus: 0\n    timeout: 1m\n    run: [x]\nlayers:",
        );
        let err = parse(&dup).unwrap_err();
        assert!(err.contains("duplicate key `cpu`"), "{err}");
    }

    #[test]
    fn undefined_batch_in_layer() {
        let err = parse(&GOOD.replace("[cpu]", "[cpuu]")).unwrap_err();
        assert!(
            err.contains("layers.1.batches.0: batch `cpuu` is not defined; did you mean `cpu`?"),
            "{err}"
        );
    }

    #[test]
    fn bad_duration_and_project() {
        let err = parse(&GOOD.replace("15m", "15 minutes")).unwrap_err();
        assert!(err.contains("batches.cpu.timeout: bad duration"), "{err}");
        let err = parse(&GOOD.replace("project: demo", "project: Demo!")).unwrap_err();
        assert!(
            err.contains("cibox.yaml:3:10: project: `Demo!` is not a valid project name"),
            "{err}"
        );
    }

    #[test]
    fn env_overrides() {
        let mut m = parse(GOOD).unwrap();
        m.apply_env(|k| (k == "CIBOX_GPU_POOL").then(|| "0,2".to_string()))
            .unwrap();
        assert_eq!(m.gpu.pool, PoolSpec::Devices(vec!["0".into(), "2".into()]));
        let err = m
            .apply_env(|k| (k == "CIBOX_MEMORY").then(|| "lots".to_string()))
            .unwrap_err();
        assert!(
            err.to_string().starts_with("CIBOX_MEMORY: bad size"),
            "{err}"
        );
    }

    #[test]
    fn pool_forms() {
        assert_eq!(PoolSpec::parse_list("all").unwrap(), PoolSpec::All);
        assert!(PoolSpec::parse_list("0,x").is_err());
        assert!(PoolSpec::parse_list("0,0").is_err());
        assert!(PoolSpec::parse_list("").is_err());
        let m = parse(&GOOD.replace("batches:\n  cpu", "gpu: {pool: [0, 3]}\nbatches:\n  cpu"))
            .unwrap();
        assert_eq!(m.gpu.pool, PoolSpec::Devices(vec!["0".into(), "3".into()]));
    }
}
