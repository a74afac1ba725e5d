//! `gpu:`, the GPU pool CI may use: [`GpuConfig`] ([`PoolSpec`], [`ProbeChoice`],
//! [`IdlePolicy`]), its raw form and checks, and the `CIBOX_GPU_*` overrides that also
//! apply on hosts without a manifest.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use crate::units::Span;

use super::check::Checker;
use super::error::ManifestError;
use super::values::ser_display;

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
            let uuid_ok = is_gpu_id(item);
            if !index_ok && !uuid_ok {
                return Err(format!(
                    "`{item}` is neither a GPU index (0, 1, …) nor a GPU's UUID as its probe prints it (GPU-xxxxxxxx-…, a MIG slice's MIG-xxxxxxxx-…, an AMD GPU's GPU-<16 hex digits>)"
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
    /// The vendor present: nvidia-smi when `CIBOX_NVIDIA_SMI` names one, rocm-smi when
    /// `CIBOX_ROCM_SMI` does; else NVML when `libnvidia-ml.so.1` can be loaded, else
    /// rocm-smi when AMD's compute driver (KFD) shows a GPU, npu-smi when Ascend's
    /// driver is loaded (`/dev/davinci_manager`), xpu-smi when Intel's (`i915`, `xe`)
    /// drives a DRM node, mthreads-gmi when Moore Threads' is (`/dev/mtgpu.0`), else
    /// nvidia-smi. `CIBOX_NPU_SMI`, `CIBOX_XPU_SMI` and `CIBOX_MTHREADS_GMI` choose
    /// theirs as the other variables do.
    Auto,
    /// NVML only: a library that cannot be loaded fails closed.
    Nvml,
    /// nvidia-smi only.
    NvidiaSmi,
    /// AMD's GPUs through `rocm-smi` (ROCm SMI) only.
    RocmSmi,
    /// Huawei Ascend NPUs through `npu-smi` only.
    NpuSmi,
    /// Intel GPUs through `xpu-smi` only.
    XpuSmi,
    /// Moore Threads GPUs through `mthreads-gmi` only.
    MthreadsGmi,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
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
    /// The host facts above that the manifest or a `CIBOX_GPU_*` variable set, and
    /// which of them did (`gpu.lock_dir in cibox.yaml`), for a host policy that pins
    /// them to compare against.
    #[serde(skip)]
    pub given: Vec<(&'static str, String)>,
    /// The host policy's pool: the pool above may only choose among these GPUs.
    #[serde(skip)]
    pub host_pool: Option<PoolSpec>,
}

impl GpuConfig {
    /// Who set host fact `key` (`lock_dir`, `probe`, …), if anyone did.
    pub fn given_by(&self, key: &str) -> Option<&str> {
        self.given
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, by)| by.as_str())
    }
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
            given: Vec::new(),
            host_pool: None,
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
            self.given.push(("pool", "CIBOX_GPU_POOL".into()));
        }
        if let Some(v) = get("CIBOX_GPU_PROBE").filter(|v| !v.is_empty()) {
            self.probe = match v.as_str() {
                "auto" => ProbeChoice::Auto,
                "nvml" => ProbeChoice::Nvml,
                "nvidia-smi" => ProbeChoice::NvidiaSmi,
                "rocm-smi" => ProbeChoice::RocmSmi,
                "npu-smi" => ProbeChoice::NpuSmi,
                "xpu-smi" => ProbeChoice::XpuSmi,
                "mthreads-gmi" => ProbeChoice::MthreadsGmi,
                _ => {
                    return Err(env_err(
                        "CIBOX_GPU_PROBE",
                        format!(
                            "`{v}`: use auto, nvml, nvidia-smi, rocm-smi, npu-smi, xpu-smi or mthreads-gmi"
                        ),
                    ));
                }
            };
            self.given.push(("probe", "CIBOX_GPU_PROBE".into()));
        }
        if let Some(v) = get("CIBOX_GPU_LOCK_DIR") {
            if v.is_empty() {
                return Err(env_err("CIBOX_GPU_LOCK_DIR", "is empty".into()));
            }
            self.lock_dir = PathBuf::from(v);
            self.given.push(("lock_dir", "CIBOX_GPU_LOCK_DIR".into()));
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
            self.given.push((
                "allow_network_lock_dir",
                "CIBOX_ALLOW_NETWORK_LOCK_DIR".into(),
            ));
        }
        Ok(())
    }
}
/// `GPU-` and the 8-4-4-4-12 hex groups nvidia-smi prints: an NVIDIA GPU's UUID.
pub fn is_gpu_uuid(s: &str) -> bool {
    s.strip_prefix("GPU-")
        .is_some_and(crate::util::is_uuid_groups)
}

/// `MIG-` and the 8-4-4-4-12 hex groups: a MIG slice's UUID as drivers since R470 print
/// it (the older `MIG-GPU-…/GI/CI` form names no file and is not one).
pub fn is_mig_uuid(s: &str) -> bool {
    s.strip_prefix("MIG-")
        .is_some_and(crate::util::is_uuid_groups)
}

/// `GPU-` and 16 hex digits: an AMD GPU's unique ID as ROCm names it (`rocminfo`'s
/// `Uuid`, what `ROCR_VISIBLE_DEVICES` takes).
pub fn is_amd_gpu_id(s: &str) -> bool {
    s.strip_prefix("GPU-")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Any of the identities a GPU probe gives a leasable unit: an NVIDIA GPU's UUID, a MIG
/// slice's, an AMD GPU's unique ID. Each is also a safe file name (the lock files).
pub fn is_gpu_id(s: &str) -> bool {
    is_gpu_uuid(s)
        || is_mig_uuid(s)
        || is_amd_gpu_id(s)
        || is_npu_id(s)
        || is_xpu_id(s)
        || is_mtt_id(s)
}

/// `XPU-` and a PCI address in lower case (`XPU-0000:29:00.0`): an Intel GPU's identity
/// (see `gpu::probe::xpu_smi`).
pub fn is_xpu_id(s: &str) -> bool {
    s.strip_prefix("XPU-")
        .is_some_and(|pci| is_npu_id(&format!("NPU-{pci}")))
}

/// `MTT-` and hex groups separated by dashes: a Moore Threads GPU's UUID (see
/// `gpu::probe::mthreads_gmi`).
pub fn is_mtt_id(s: &str) -> bool {
    s.strip_prefix("MTT-").is_some_and(|u| {
        (8..=64).contains(&u.len())
            && u.split('-')
                .all(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_hexdigit()))
    })
}

/// `NPU-` and a PCI address in lower case (`NPU-0000:c1:00.0`): an Ascend chip's
/// identity (see `gpu::probe::npu_smi`).
pub fn is_npu_id(s: &str) -> bool {
    let Some(pci) = s.strip_prefix("NPU-") else {
        return false;
    };
    let hex = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let mut parts = pci.split(':');
    let (Some(domain), Some(bus), Some(rest), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Some((slot, func)) = rest.split_once('.') else {
        return false;
    };
    hex(domain, 4) && hex(bus, 2) && hex(slot, 2) && hex(func, 1)
}

/// The longest `gpu_model` glob: model names are a few dozen characters.
const MAX_MODEL_GLOB: usize = 200;

/// Checks a `gpu_model` glob (`*H100*`): text a model name could match, `*` and `?`
/// its wildcards; why not, when it is not.
pub fn check_model_glob(glob: &str) -> Result<(), String> {
    if glob.trim().is_empty() {
        return Err(
            "is empty: write a glob over the model name the probe reports, such as `*H100*`".into(),
        );
    }
    if glob.len() > MAX_MODEL_GLOB {
        return Err(format!("is longer than {MAX_MODEL_GLOB} characters"));
    }
    if glob.chars().any(char::is_control) {
        return Err("holds a control character".into());
    }
    Ok(())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGpu {
    pool: Option<PoolSpec>,
    probe: Option<ProbeChoice>,
    lock_dir: Option<PathBuf>,
    idle: Option<IdlePolicy>,
    wait: Option<Span>,
    allow_network_lock_dir: Option<bool>,
}

/// Reads `gpu:`.
pub(super) fn validate_gpu(check: &Checker<'_>, gpu: RawGpu) -> Result<GpuConfig, ManifestError> {
    let idle = gpu.idle.clone().unwrap_or_default();
    if idle.max_utilization > 100 {
        return Err(check.at(
            &["gpu", "idle", "max_utilization"],
            "is a percentage: 0 to 100",
        ));
    }
    let given = [
        ("pool", gpu.pool.is_some()),
        ("probe", gpu.probe.is_some()),
        ("lock_dir", gpu.lock_dir.is_some()),
        ("idle", gpu.idle.is_some()),
        (
            "allow_network_lock_dir",
            gpu.allow_network_lock_dir.is_some(),
        ),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(key, _)| (key, format!("gpu.{key} in {}", check.file)))
    .collect();
    Ok(GpuConfig {
        pool: gpu.pool.unwrap_or(PoolSpec::All),
        probe: gpu.probe.unwrap_or(ProbeChoice::Auto),
        lock_dir: gpu
            .lock_dir
            .unwrap_or_else(|| PathBuf::from("/run/lock/cibox")),
        idle,
        wait: gpu.wait.unwrap_or(Span(std::time::Duration::ZERO)),
        allow_network_lock_dir: gpu.allow_network_lock_dir.unwrap_or(false),
        given,
        host_pool: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::tests::{GOOD, parse};

    #[test]
    fn a_batch_a_default_and_a_test_list_entry_may_ask_for_a_gpu_model() {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1m, run: [x], gpu_model: \"*H100*\"}\nbatches:\n  h: {gpus: 1}\n  a: {gpus: 1, gpu_model: \"*A100*\"}\n  fam:\n    gpus: 1\n    each:\n      - {file: t/one.py}\n      - {file: t/two.py, gpu_model: \"*B200*\"}\n      - {file: t/any.py, gpu_model: null}\n";
        let m = parse(text).unwrap();
        let model = |b: &str| m.batches[b].gpu_model.clone();
        assert_eq!(model("h").as_deref(), Some("*H100*"));
        assert_eq!(model("a").as_deref(), Some("*A100*"));
        assert_eq!(model("fam-one").as_deref(), Some("*H100*"));
        assert_eq!(model("fam-two").as_deref(), Some("*B200*"));
        assert_eq!(model("fam-any"), None);
        for (bad, says) in [
            ("gpu_model: \"\"", "batches.a.gpu_model: is empty"),
            (
                "gpu_model: \"a\\u0007b\"",
                "batches.a.gpu_model: holds a control character",
            ),
        ] {
            let err = parse(&text.replace("gpu_model: \"*A100*\"", bad)).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let err = parse(&text.replace("gpu_model: \"*B200*\"", "gpu_model: \" \"")).unwrap_err();
        assert!(err.contains("each.1.gpu_model: is empty"), "{err}");
        let err = parse(&text.replace("gpu_model: \"*A100*\"", "gpu_model: [x]")).unwrap_err();
        assert!(err.contains("gpu_model"), "{err}");
        // `changed.run` takes it from `defaults` too, and gives it to a file's batch.
        let m = parse(&format!(
            "{text}changed: {{patterns: [\"t/**/*.py\"], run: {{command: x}}}}\n"
        ))
        .unwrap();
        let run = m.changed.as_ref().and_then(|c| c.run.as_ref()).unwrap();
        assert_eq!(run.gpu_model.as_deref(), Some("*H100*"));
        assert_eq!(
            run.batch_for("t/x.py", 2).gpu_model.as_deref(),
            Some("*H100*")
        );
    }

    #[test]
    fn pool_forms() {
        assert_eq!(PoolSpec::parse_list("all").unwrap(), PoolSpec::All);
        assert!(PoolSpec::parse_list("0,x").is_err());
        assert!(PoolSpec::parse_list("0,0").is_err());
        assert!(PoolSpec::parse_list("").is_err());
        // A MIG slice's UUID and an AMD GPU's unique ID are units of their own.
        let units = "0,MIG-4f1c3e2a-0000-5b6c-8d7e-000000000001,GPU-18f68e602b8a790f";
        assert_eq!(PoolSpec::parse_list(units).unwrap().to_string(), units);
        // The old MIG form names no file.
        assert!(PoolSpec::parse_list("MIG-GPU-4f1c3e2a-0000-5b6c-8d7e-000000000001/1/0").is_err());
        assert!(PoolSpec::parse_list("GPU-18f68e602b8a790").is_err());
        let m = parse(&GOOD.replace("batches:\n  cpu", "gpu: {pool: [0, 3]}\nbatches:\n  cpu"))
            .unwrap();
        assert_eq!(m.gpu.pool, PoolSpec::Devices(vec!["0".into(), "3".into()]));
    }
}
