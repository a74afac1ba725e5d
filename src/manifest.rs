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
    pub image: ImageConfig,
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
}

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
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Layer {
    pub description: Option<String>,
    /// Resolved batch names, in manifest order for `all`, as written otherwise.
    pub batches: Vec<String>,
    /// Whether the layer ran with `batches: all`.
    pub all: bool,
    pub fast: bool,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChangedConfig {
    pub patterns: Vec<String>,
    #[serde(default = "default_marker")]
    pub gpus_marker: String,
    #[serde(default = "default_gpus")]
    pub default_gpus: u32,
}

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
    #[serde(default)]
    image: ImageConfig,
    #[serde(default)]
    source: SourceConfig,
    #[serde(default)]
    container: RawContainer,
    #[serde(default)]
    gpu: RawGpu,
    batches: IndexMap<String, RawBatch>,
    #[serde(default)]
    layers: IndexMap<String, RawLayer>,
    changed: Option<ChangedConfig>,
    #[serde(default)]
    workflows: WorkflowsConfig,
}

#[derive(Debug, Default, Deserialize)]
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
    timeout: Span,
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
    &["source"],
    &["container"],
    &["container", "env"],
    &["gpu"],
    &["gpu", "idle"],
    &["batches"],
    &["batches", "*"],
    &["batches", "*", "env"],
    &["batches", "*", "fast_env"],
    &["layers"],
    &["layers", "*"],
    &["changed"],
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
            self.container.cpus = Some(cpus);
        }
        if let Some(v) = get("CIBOX_MEMORY") {
            self.container.memory = Some(v.parse().map_err(|e| env_err("CIBOX_MEMORY", e))?);
        }
        if let Some(v) = get("CIBOX_SHM") {
            self.container.shm = v.parse().map_err(|e| env_err("CIBOX_SHM", e))?;
        }
        self.gpu.apply_env(&get)?;
        Ok(())
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
            Ok((k, v.0))
        })
        .collect()
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
    if raw.image.nix.is_some() && raw.image.dockerfile.is_some() {
        return Err(check.at(
            &["image"],
            "set either `nix` or `dockerfile` as the image recipe, not both",
        ));
    }
    for (i, pat) in raw.image.locks.iter().enumerate() {
        if pat.is_empty() || Path::new(pat).is_absolute() || pat.split('/').any(|c| c == "..") {
            return Err(check.at(
                &["image", "locks", &i.to_string()],
                format!("`{pat}` must be a relative path inside the manifest's folder"),
            ));
        }
    }

    let c = raw.container;
    if let Some(cpus) = c.cpus
        && !cpus_in_range(cpus)
    {
        return Err(check.at(&["container", "cpus"], CPUS_RANGE));
    }
    let pids = c.pids.unwrap_or(4096);
    if pids <= 0 || pids > u32::MAX as i64 {
        return Err(check.at(&["container", "pids"], "must be a positive whole number"));
    }
    for (i, name) in c.pass_env.iter().enumerate() {
        if !is_env_name(name) {
            return Err(check.at(
                &["container", "pass_env", &i.to_string()],
                format!("`{name}` is not a valid environment variable name"),
            ));
        }
    }
    for (field, size) in [("disk", c.disk), ("reports_size", c.reports_size)] {
        if size.is_some_and(|s| s.0 < 1 << 20) {
            return Err(check.at(&["container", field], "must be at least 1m"));
        }
    }
    let container = ContainerConfig {
        cpus: c.cpus,
        memory: c.memory,
        shm: c.shm.unwrap_or(Size(1 << 30)),
        disk: c.disk.unwrap_or(Size(10 << 30)),
        reports_size: c.reports_size.unwrap_or(Size(1 << 30)),
        pids: pids as u32,
        network: c.network.unwrap_or(Network::None),
        env: env_map(check, &["container", "env"], c.env)?,
        pass_env: c.pass_env,
        gpu_driver: c.gpu_driver.unwrap_or(GpuDriver::Nvidia),
    };

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
        if b.timeout.0.is_zero() {
            return Err(check.at(&["batches", &name, "timeout"], "must be more than 0s"));
        }
        if b.run.is_empty() || b.run.iter().all(|s| s.trim().is_empty()) {
            return Err(check.at(&["batches", &name, "run"], "needs at least one command"));
        }
        let batch = Batch {
            description: b.description,
            gpus: b.gpus as u32,
            timeout: b.timeout,
            preflight: b.preflight,
            run: b.run,
            env: env_map(check, &["batches", &name, "env"], b.env)?,
            fast_env: env_map(check, &["batches", &name, "fast_env"], b.fast_env)?,
            allow_empty: b.allow_empty,
            tests: b.tests,
        };
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
        layers.insert(
            name,
            Layer {
                description: l.description,
                batches: list,
                all,
                fast: l.fast,
            },
        );
    }

    if let Some(ch) = &raw.changed {
        if ch.patterns.is_empty() {
            return Err(check.at(&["changed", "patterns"], "lists no pattern"));
        }
        if !is_env_name(&ch.gpus_marker) {
            return Err(check.at(
                &["changed", "gpus_marker"],
                "must be a Python identifier such as NUM_GPUS",
            ));
        }
    }

    Ok(Manifest {
        path,
        dir,
        digest: String::new(),
        project: raw.project,
        image: raw.image,
        source: raw.source,
        container,
        gpu,
        batches,
        layers,
        changed: raw.changed,
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
