//! `cibox.yaml`, the batch manifest (docs/interface.md §4): the one source of truth for
//! batches, layers, the image and the GPU pool.
//!
//! Loading goes text → positioned YAML tree ([`crate::yaml`]) → serde into raw structs
//! that refuse unknown keys → semantic checks → [`Manifest`]. Every error names the
//! file, line, column and key path.
//!
//! This file owns the entry points (finding, loading and parsing a manifest, the
//! `CIBOX_*` overrides), [`Manifest`] and [`ManifestError`], and re-exports what the
//! rest of cibox uses. The rest, each file one concern, in the order loading uses them:
//!
//! - `tree.rs`: the YAML tree passes before serde (`x-*` keys, `defaults:` and the
//!   top-level `container:` laid under batches, mappings where mappings belong);
//! - `raw.rs`: the manifest as written, serde structs that refuse unknown keys;
//! - `check.rs`: where a check failed (a key path's position), serde's errors reworded;
//! - `validate.rs`: the top level, batches and layers, and the order of the checks;
//! - one file per section, its types, raw form and checks: `images.rs`, `container.rs`
//!   (with `mounts.rs`, the mount policy), `gpu.rs` (with the `CIBOX_GPU_*`
//!   overrides), `changed.rs` (with `patterns.rs`: globs and path prefixes),
//!   `schedule.rs` (a batch's expected time, retries and soft failure),
//!   `artifacts.rs` (a batch's `outputs` and `needs`: artifacts between layers);
//! - `types.rs`: batches, layers, `source:` and `workflows:` as read;
//! - `values.rs`: environment values, names, `meta`, serialising helpers.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::units::Size;
use crate::util::hex;
use crate::yaml::{self, Mark};

mod artifacts;
mod caches;
mod changed;
mod check;
mod chosen;
mod collect;
mod container;
mod devices;
mod document;
mod each;
mod error;
mod gpu;
mod images;
mod mounts;
mod patterns;
mod placement;
mod raw;
mod schedule;
mod tree;
mod types;
mod validate;
mod values;

pub use changed::{ChangedConfig, GroupKind, PatternKind, Renames};
pub use chosen::chosen_id;
pub use collect::{
    CollectSpec, Collected, CollectedEntry, MAX_COLLECT_BYTES, MAX_ENTRY_GPUS, parse_output,
};
pub use container::{
    CAP_ADD_ALLOWED, ContainerConfig, ContainerUser, GpuDriver, HostMount, Ipc, Network,
    ULIMIT_NAMES, Ulimit,
};
pub use document::Manifest;
pub use error::{FILE_NAME, ManifestError};
pub use gpu::{
    GpuConfig, IdlePolicy, PoolSpec, ProbeChoice, check_model_glob, is_amd_gpu_id, is_gpu_uuid,
    is_mig_uuid, is_mtt_id, is_npu_id, is_xpu_id,
};
pub use images::{DEFAULT_IMAGE, image_variable};
pub use mounts::{ENGINE_SOCKETS, check_mount_source};
pub use patterns::{Selector, compile_glob, github_glob, under_prefix};
pub use placement::{parts_for_budget, shard_unit};
pub use schedule::MAX_RETRIES;
pub use types::{Batch, BatchVerdict, Layer, Retries, RetryOn};
pub use values::is_batch_name;

use check::{Checker, serde_error};
use container::{CPUS_RANGE, cpus_in_range};
use raw::RawManifest;
use tree::{prepare, require_maps};
use validate::validate;

/// The largest manifest file read.
const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// Whether `e` says that no manifest was found (commands that serve a host without
/// one go on).
pub fn no_manifest(e: &crate::error::Error) -> bool {
    matches!(
        e.downcast_ref::<ManifestError>(),
        Some(ManifestError::NotFound { .. })
    )
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

impl Manifest {
    /// Reads and validates a manifest file, then applies the `CIBOX_*` overrides.
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        Self::load_as(path, None)
    }

    /// [`Manifest::load`], with the collectors' lists when they are in.
    fn load_as(path: &Path, collected: Option<&Collected>) -> Result<Manifest, ManifestError> {
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
        let mut m = Self::parse_with(&text, path, collected)?;
        m.digest = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
        m.apply_env(|k| std::env::var(k).ok())?;
        Ok(m)
    }

    /// Parses manifest text; `path` is used for messages and to anchor relative paths.
    #[cfg(test)]
    pub fn parse(text: &str, path: &Path) -> Result<Manifest, ManifestError> {
        Self::parse_with(text, path, None)
    }

    /// The manifest again, with the lists its collectors printed (`collect:`) made
    /// batches, as `each:` entries are; its file read anew must be the one read first
    /// (its digest), and the GPU settings stay as they were settled.
    pub fn with_collected(&self, collected: &Collected) -> Result<Manifest, ManifestError> {
        let again = Self::load_as(&self.path, Some(collected))?;
        if again.digest != self.digest {
            return Err(ManifestError::Read {
                path: self.path.display().to_string(),
                reason: "changed while its test lists were collected; run again".into(),
            });
        }
        Ok(Manifest {
            gpu: self.gpu.clone(),
            ..again
        })
    }

    /// [`Manifest::parse`], with the collectors' lists when they are in.
    fn parse_with(
        text: &str,
        path: &Path,
        collected: Option<&Collected>,
    ) -> Result<Manifest, ManifestError> {
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
        validate(raw, &check, path.to_path_buf(), dir, collected)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const GOOD: &str = r#"
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

    pub(super) fn parse(text: &str) -> Result<Manifest, String> {
        Manifest::parse(text, Path::new("cibox.yaml")).map_err(|e| e.to_string())
    }

    /// A manifest for real GPU tests: defaults, merge keys, `x-*` anchors, meta, and a
    /// batch overriding container keys.
    pub(super) const REAL: &str = r#"
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

    /// Each case: `from`, found in `base`, replaced by `to`, must be refused with a
    /// message that holds `want`.
    pub(super) fn assert_refused(base: &str, cases: &[(&str, &str, &str)]) {
        for (from, to, want) in cases {
            assert!(base.contains(from), "{from}");
            let err = parse(&base.replacen(from, to, 1)).unwrap_err();
            assert!(err.contains(want), "{to}: {err}");
        }
    }

    #[test]
    fn a_value_of_two_forms_names_both_when_it_is_neither() {
        assert_refused(
            GOOD,
            &[
                (
                    "timeout: 15m\n",
                    "timeout: 15m\n    retries: [1]\n",
                    "batches.cpu.retries: `retries` is a count (`2`) or `{count: 2, on: [infra_error]}`",
                ),
                (
                    "timeout: 15m\n",
                    "timeout: 15m\n    retries: {count: 1, of: [timeout]}\n",
                    "batches.cpu.retries.of: unknown key `of`; did you mean `on`?",
                ),
                (
                    "{batches: [cpu]}",
                    "{batches: {cpu: 1}}",
                    "batches: a layer's `batches` is `all` or a list of batch names",
                ),
            ],
        );
    }

    /// serde's untagged enums say "data did not match any variant of untagged enum
    /// RawX" to the user; a manifest type of two forms reads them through
    /// `values::scalar_or_compound` instead (an untagged enum inside it is fine).
    #[test]
    fn no_manifest_type_is_an_untagged_enum_the_user_would_hear_of() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/manifest");
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, line) in text.lines().enumerate() {
                if line == "#[serde(untagged)]" {
                    found.push(format!("{}:{}", path.display(), i + 1));
                }
            }
        }
        assert!(found.is_empty(), "top-level untagged enums: {found:?}");
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
    fn duplicate_batch() {
        let dup = GOOD.replace(
            "layers:",
            "  cpu:\n    gpus: 0\n    timeout: 1m\n    run: [x]\nlayers:",
        );
        let err = parse(&dup).unwrap_err();
        assert!(err.contains("duplicate key `cpu`"), "{err}");
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
}
