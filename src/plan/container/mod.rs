//! The container a batch runs in: name, labels, environment, limits, mounts.
//!
//! Locked down: the invoking uid:gid (never root: 65534:65534 when cibox runs as root),
//! all capabilities dropped, no-new-privileges, an init process, pids/cpu/memory/shm
//! limits (swap adds nothing), network `none` unless the manifest says otherwise, the
//! source read-only at `/src` (its git credentials masked), only `/reports` writable
//! from the host, no engine socket, no host variable but `pass_env`.
//!
//! What a manifest may loosen, each recorded in `result.json`: read-only host mounts,
//! the host's IPC namespace, ulimits, three capabilities given back, and the user
//! (`root` in the container still has no other capability and no-new-privileges).

mod body;
pub mod caches;
pub mod devices;

pub mod mounts;
pub mod phases;
pub(crate) mod script;
pub mod snapshot;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use crate::image::ImageId;
use crate::labels::*;
use crate::manifest::{Batch, ContainerUser, GpuDriver, Ipc, Manifest, Network, Ulimit};
pub use mounts::ResolvedMount;
use script::script;

/// What names and labels a run's containers, the same for each of its batches.
pub struct Identity<'a> {
    pub project: &'a str,
    pub scope: &'a str,
    pub run_id: &'a str,
    pub host: &'a str,
    pub source: &'a Path,
    pub source_sha: Option<&'a str>,
    pub fast: bool,
    /// The host's values of `pass_env`.
    pub pass_env: &'a BTreeMap<String, String>,
    /// The lock dir holding the run's lock.
    pub lock_dir: &'a Path,
    /// The digest of the host policy in force, recorded with what it granted.
    pub policy_digest: Option<&'a str>,
}

pub use crate::util::sanitize;

#[derive(Debug, Clone)]
pub struct ContainerPlan {
    pub name: String,
    image: String,
    labels: HashMap<String, String>,
    env: Vec<String>,
    /// The manifest's variables for this batch (recorded; no host values).
    pub manifest_env: BTreeMap<String, String>,
    script: String,
    /// How many steps the script announces (install, preflight and run).
    steps_announced: usize,
    binds: Vec<String>,
    /// Who the batch runs as (`uid:gid`); the container's keeper is root.
    user: String,
    uid: u32,
    gid: u32,
    disk: u64,
    reports_size: u64,
    m_cpus: Option<f64>,
    memory: Option<i64>,
    shm: i64,
    pids: i64,
    network: Network,
    driver: GpuDriver,
    /// Host mounts, as the host check resolved them.
    mounts: Vec<ResolvedMount>,
    ipc: Ipc,
    ulimits: BTreeMap<String, Ulimit>,
    /// Where the manifest asks for them (`cibox.yaml:LINE:COL: `), for the engine's
    /// refusal of one.
    ulimits_at: String,
    cap_add: Vec<String>,
    /// Host devices it is given (beyond GPUs), as resolved on the host.
    devices: Vec<std::path::PathBuf>,
    /// The engine's security option for a granted seccomp profile.
    seccomp: Option<String>,
    /// The digest of the host policy in force, recorded with what it granted.
    policy_digest: Option<String>,
    /// What the container allows beyond the locked-down default, for the record.
    loosened: serde_json::Value,
    /// What starts the name of every container and volume of the run
    /// (`cibox-<project>-<scope>-`), and the run ID's first eight digits.
    run_prefix: String,
    run8: String,
}

impl ContainerPlan {
    /// What runs the batch: its script, in `sh`, as [`ContainerPlan::user`].
    pub fn steps(&self) -> Vec<String> {
        vec!["/bin/sh".into(), "-c".into(), self.script.clone()]
    }

    /// How many steps the script announces: no more phase lines than these are taken
    /// from a batch's output (the batch can print announcements of its own).
    pub fn steps_announced(&self) -> usize {
        self.steps_announced
    }

    /// The size of `/work` (`container.disk`): what the batch may write there.
    pub fn disk(&self) -> u64 {
        self.disk
    }

    /// The size of `/reports`, and so the most that is copied out of it.
    pub fn reports_size(&self) -> u64 {
        self.reports_size
    }

    /// What the container allows beyond the locked-down default, for the record.
    pub fn loosened(&self) -> serde_json::Value {
        self.loosened.clone()
    }

    /// Gives the container the devices and seccomp profile the host check resolved,
    /// and records them with what it loosens.
    pub fn grant_devices(&mut self, granted: devices::BatchDevices) {
        if let serde_json::Value::Object(map) = &mut self.loosened {
            if !granted.devices.is_empty() {
                map.insert("devices".into(), serde_json::json!(granted.devices));
            }
            if !granted.absent.is_empty() {
                // Optional devices this host lacks: the batch ran without them.
                map.insert("devices_absent".into(), serde_json::json!(granted.absent));
            }
            if let Some((name, _)) = &granted.seccomp {
                map.insert("seccomp".into(), name.clone().into());
            }
            if !map.is_empty()
                && let Some(digest) = &self.policy_digest
            {
                map.insert("policy".into(), digest.clone().into());
            }
        }
        self.devices = granted.devices;
        self.seccomp = granted.seccomp.map(|(_, option)| option);
    }

    /// The container of rank `rank` of a batch on `nodes` nodes of a Slurm job: named
    /// apart from the other ranks' (two may share an engine), with the rendezvous
    /// variables. Not in the record's `env`: they are the job's, not the manifest's.
    pub fn on_node(&mut self, rank: u32, nodes: u32, rendezvous: &BTreeMap<String, String>) {
        if nodes > 1 {
            self.name = format!("{}-n{rank}", self.name);
        }
        self.env
            .extend(rendezvous.iter().map(|(k, v)| format!("{k}={v}")));
    }

    /// The container of shard `index` (from 0) of a batch of `count` shards: named
    /// apart from its other shards', told which it is by cibox's variables and by
    /// Buildkite's (so a step written for a `parallelism: N` step, as vLLM's
    /// `pytest --shard-id=$$BUILDKITE_PARALLEL_JOB --num-shards=$$BUILDKITE_PARALLEL_JOB_COUNT`,
    /// runs unchanged). Not in the record's `env`: they are the run's, not the manifest's.
    pub fn on_shard(&mut self, index: u32, count: u32) {
        self.name = format!("{}-s{index}", self.name);
        for (k, v) in [
            ("CIBOX_SHARD_INDEX", index),
            ("CIBOX_SHARD_COUNT", count),
            ("BUILDKITE_PARALLEL_JOB", index),
            ("BUILDKITE_PARALLEL_JOB_COUNT", count),
        ] {
            self.env.retain(|e| !e.starts_with(&format!("{k}=")));
            self.env.push(format!("{k}={v}"));
        }
    }

    /// The container's variables as `K=V`, for tests outside this room.
    #[cfg(test)]
    pub fn env_for_test(&self) -> &[String] {
        &self.env
    }

    /// Through which runtime the batch's GPUs go, where their vendor's use one.
    pub fn gpu_driver(&self) -> GpuDriver {
        self.driver
    }

    /// Who the batch runs as, `uid:gid`.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The memory limit as the manifest writes it (`none` without one).
    pub fn memory_text(&self) -> String {
        self.memory.map_or("none".to_string(), |m| {
            crate::units::Size(m as u64).to_string()
        })
    }

    /// `user` is who the batch runs as (the invoker, or what its `container.user` says);
    /// `image` the image it runs in, by name and ID; `mounts` its host mounts as the
    /// host check resolved them.
    pub fn new(
        m: &Manifest,
        batch_name: &str,
        batch: &Batch,
        id: &Identity<'_>,
        user: (u32, u32),
        (image_name, image): (&str, &ImageId),
        mounts: Vec<ResolvedMount>,
    ) -> ContainerPlan {
        let c = &batch.container;
        let run_prefix = format!("cibox-{}-{}-", sanitize(id.project), sanitize(id.scope));
        let run8 = id.run_id[..8.min(id.run_id.len())].to_string();
        let name = format!("{run_prefix}{}-{run8}", sanitize(batch_name));
        let manifest_env = manifest_env(batch, id.fast);
        let env = environment(&manifest_env, batch_name, batch, id);
        let labels = HashMap::from([
            (LABEL_OWNER.to_string(), "cibox".to_string()),
            (LABEL_PROJECT.to_string(), id.project.to_string()),
            (LABEL_SCOPE.to_string(), id.scope.to_string()),
            (LABEL_RUN.to_string(), id.run_id.to_string()),
            (LABEL_BATCH.to_string(), batch_name.to_string()),
            (
                LABEL_SOURCE.to_string(),
                id.source_sha.unwrap_or("none").to_string(),
            ),
            (LABEL_GPUS.to_string(), String::new()),
            (LABEL_HOST.to_string(), id.host.to_string()),
            (
                LABEL_LOCK_DIR.to_string(),
                id.lock_dir.display().to_string(),
            ),
        ]);
        ContainerPlan {
            name,
            image: image.to_string(),
            labels,
            env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
            manifest_env,
            script: script(install_for(m, batch, image_name), batch),
            steps_announced: install_for(m, batch, image_name).len()
                + batch.preflight.len()
                + batch.run.len(),
            binds: vec![format!("{}:/src:ro", id.source.display())],
            user: format!("{}:{}", user.0, user.1),
            uid: user.0,
            gid: user.1,
            disk: c.disk.0,
            reports_size: c.reports_size.0,
            m_cpus: c.cpus,
            memory: c.memory.map(|s| s.0 as i64),
            shm: c.shm.0 as i64,
            pids: i64::from(c.pids),
            network: c.network,
            driver: c.gpu_driver,
            loosened: loosenings(batch, &mounts, id.policy_digest),
            mounts,
            ipc: c.ipc,
            ulimits: c.ulimits.clone(),
            ulimits_at: match c.marks.get("ulimits") {
                Some(mark) => format!("{}:{mark}: ", m.path.display()),
                None => format!("{}: ", m.path.display()),
            },
            cap_add: c.cap_add.clone(),
            devices: Vec::new(),
            seccomp: None,
            policy_digest: id.policy_digest.map(str::to_string),
            run_prefix,
            run8,
        }
    }

    /// The manifest's mistake in the engine's `reason` for not creating or starting
    /// the container, when it is one of its ulimits the engine cannot set (above its
    /// own hard limit, or for `nofile` above the host's `fs.nr_open`): which, and what
    /// to do. runc names the limit by its number (`error setting rlimit type 7`).
    pub fn refused_ulimit(&self, batch: &str, reason: &str) -> Option<UlimitRefused> {
        let by_number = reason
            .split("rlimit type ")
            .nth(1)
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| RLIMIT_NAMES.get(n).copied());
        let lower = reason.to_ascii_lowercase();
        let by_name = || {
            (lower.contains("ulimit") || lower.contains("rlimit"))
                .then(|| self.ulimits.keys().find(|n| lower.contains(n.as_str())))
                .flatten()
                .map(String::as_str)
        };
        let name = by_number.or_else(by_name)?;
        let limit = self.ulimits.get(name)?;
        Some(UlimitRefused {
            at: self.ulimits_at.clone(),
            batch: batch.to_string(),
            name: name.to_string(),
            soft: limit.soft,
            hard: limit.hard,
            reason: reason.to_string(),
        })
    }
}

/// A ulimit the manifest asks for that the engine cannot set: the manifest's mistake.
#[derive(Debug, thiserror::Error)]
#[error(
    "{at}batches.{batch}.container.ulimits.{name}: the engine cannot set it (soft {}, hard {}): {reason}; ask at most what the engine may set (its own hard limit, and for nofile the host's fs.nr_open)",
    shown_limit(*.soft),
    shown_limit(*.hard)
)]
pub struct UlimitRefused {
    /// Where the manifest asks for the ulimits (`cibox.yaml:LINE:COL: `).
    pub at: String,
    pub batch: String,
    pub name: String,
    pub soft: i64,
    pub hard: i64,
    /// What the engine said.
    pub reason: String,
}

impl crate::error::ErrorKind for UlimitRefused {
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }
}

/// A limit as the manifest writes it: a number, or `unlimited` for -1.
fn shown_limit(v: i64) -> String {
    if v == -1 {
        "unlimited".to_string()
    } else {
        v.to_string()
    }
}

/// How the source is installed for `batch` in image `image_name`: the batch's own
/// `install`, else the image's, else `source.install`.
fn install_for<'m>(m: &'m Manifest, batch: &'m Batch, image_name: &str) -> &'m [String] {
    batch
        .install
        .as_deref()
        .or_else(|| m.images.get(image_name).and_then(|i| i.install.as_deref()))
        .unwrap_or(&m.source.install)
}

/// The kernel's resource limits by number (`RLIMIT_*`), as the ulimits name them.
const RLIMIT_NAMES: [&str; 16] = [
    "cpu",
    "fsize",
    "data",
    "stack",
    "core",
    "rss",
    "nproc",
    "nofile",
    "memlock",
    "as",
    "locks",
    "sigpending",
    "msgqueue",
    "nice",
    "rtprio",
    "rttime",
];

/// The manifest-defined environment of a batch (no host values), for the record.
pub fn manifest_env(batch: &Batch, fast: bool) -> BTreeMap<String, String> {
    let mut env = batch.container.env.clone();
    env.extend(batch.env.clone());
    if fast {
        env.extend(batch.fast_env.clone());
    }
    env
}

/// The container's environment: the manifest's, the host values this batch's
/// `pass_env` names, and cibox's own.
fn environment(
    manifest_env: &BTreeMap<String, String>,
    batch_name: &str,
    batch: &Batch,
    id: &Identity<'_>,
) -> BTreeMap<String, String> {
    let mut env = manifest_env.clone();
    // Only what this batch's `pass_env` names (each batch may name its own).
    env.extend(
        id.pass_env
            .iter()
            .filter(|(k, _)| batch.container.pass_env.contains(k))
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    // The manifest's HOME (checked absolute), else `/tmp`: never the host's (`pass_env`
    // may not name it).
    env.entry("HOME".into()).or_insert_with(|| "/tmp".into());
    env.insert("CIBOX_REPORTS".into(), "/reports".into());
    env.insert("CIBOX_BATCH".into(), batch_name.into());
    env.insert("CIBOX_FAST".into(), if id.fast { "1" } else { "0" }.into());
    // One shard of one, for a batch that is not sharded (`on_shard` sets a shard's):
    // a step written for shards runs whole.
    env.insert("CIBOX_SHARD_INDEX".into(), "0".into());
    env.insert("CIBOX_SHARD_COUNT".into(), "1".into());
    if batch.gpus == 0 {
        // CPU batches see no GPU, whatever the runtime's defaults.
        env.insert("NVIDIA_VISIBLE_DEVICES".into(), "void".into());
        env.insert("CUDA_VISIBLE_DEVICES".into(), String::new());
    } else {
        env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
    }
    env
}

/// What a batch's container allows beyond cibox's locked-down default, for the record:
/// host mounts (with the path each resolved to), IPC, ulimits, capabilities, user,
/// network, the host variables passed in (by name), and the digest of the host policy
/// that granted them; empty when nothing.
fn loosenings(
    batch: &Batch,
    mounts: &[ResolvedMount],
    policy_digest: Option<&str>,
) -> serde_json::Value {
    let c = &batch.container;
    let mut out = serde_json::Map::new();
    if !mounts.is_empty() {
        out.insert("mounts".into(), serde_json::json!(mounts));
    }
    if c.ipc == Ipc::Host {
        out.insert("ipc".into(), "host".into());
    }
    if !c.ulimits.is_empty() {
        out.insert("ulimits".into(), serde_json::json!(c.ulimits));
    }
    if !c.cap_add.is_empty() {
        out.insert("cap_add".into(), serde_json::json!(c.cap_add));
    }
    if c.user != ContainerUser::Invoker {
        out.insert("user".into(), c.user.to_string().into());
    }
    if c.network != Network::None {
        out.insert("network".into(), serde_json::json!(c.network));
    }
    if !c.pass_env.is_empty() {
        out.insert("pass_env".into(), serde_json::json!(c.pass_env));
    }
    if !out.is_empty()
        && let Some(digest) = policy_digest
    {
        out.insert("policy".into(), digest.into());
    }
    serde_json::Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_what_the_engine_allows() {
        assert_eq!(sanitize("local-jo hn/x"), "local-jo_hn_x");
    }

    #[test]
    fn the_record_names_each_loosening_and_where_mounts_resolved() {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ncontainer: {network: bridge, ipc: host, user: root, cap_add: [IPC_LOCK], mounts: [\"/data/models:/models\"]}\nbatches:\n  b: {gpus: 0, timeout: 1m, run: [x], container: {ulimits: {memlock: unlimited}}}\n  c: {gpus: 0, timeout: 1m, run: [x], container: {network: none, ipc: private, user: invoker, cap_add: [], mounts: []}}\n";
        let m = Manifest::parse(text, Path::new("cibox.yaml")).unwrap();
        let resolved = ResolvedMount {
            source: "/data/models".into(),
            target: "/models".into(),
            host_path: "/srv/models".into(),
            submounts: Vec::new(),
            mark: m.batches["b"].container.mounts[0].mark,
        };
        assert_eq!(
            loosenings(&m.batches["b"], &[resolved], Some("sha256:p")),
            serde_json::json!({
                "mounts": [{"source": "/data/models", "target": "/models", "resolved": "/srv/models"}],
                "ipc": "host",
                "ulimits": {"memlock": {"soft": -1, "hard": -1}},
                "cap_add": ["IPC_LOCK"],
                "user": "root",
                "network": "bridge",
                "policy": "sha256:p",
            })
        );
        assert_eq!(
            loosenings(&m.batches["c"], &[], Some("sha256:p")),
            serde_json::json!({})
        );
    }

    #[test]
    fn a_gpu_batch_sees_its_leased_uuids_once_whatever_its_environment_held() {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\nbatches:\n  g: {gpus: 1, timeout: 1m, run: [x]}\n";
        let m = Manifest::parse(text, Path::new("cibox.yaml")).unwrap();
        let pass_env = BTreeMap::new();
        let id = Identity {
            project: "p",
            scope: "s",
            run_id: "0123456789abcdef",
            host: "h",
            source: Path::new("/src/p"),
            source_sha: None,
            fast: false,
            pass_env: &pass_env,
            lock_dir: Path::new("/run/lock/cibox"),
            policy_digest: None,
        };
        let image = ImageId::parse(&format!("sha256:{}", "a".repeat(64))).unwrap();
        let mut plan = ContainerPlan::new(
            &m,
            "g",
            &m.batches["g"],
            &id,
            (1000, 1000),
            ("default", &image),
            Vec::new(),
        );
        // However a value got there, the lease's UUIDs are what the batch sees.
        plan.env.push("CUDA_VISIBLE_DEVICES=0,1".into());
        let gpu = crate::gpu::pool::PoolGpu {
            index: 1,
            uuid: "GPU-11111111-2222-3333-4444-000000000001".into(),
            parent: None,
        };
        let handover = crate::gpu::vendor::handover(&[gpu], GpuDriver::Nvidia).unwrap();
        let env = plan.body(&handover, &[], true).env.unwrap();
        let set: Vec<&String> = env
            .iter()
            .filter(|e| e.starts_with("CUDA_VISIBLE_DEVICES="))
            .collect();
        assert_eq!(
            set,
            ["CUDA_VISIBLE_DEVICES=GPU-11111111-2222-3333-4444-000000000001"],
            "{env:?}"
        );
    }
}
