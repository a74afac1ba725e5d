//! What a run will do, decided before anything runs: [`plan`] turns a manifest and a
//! [`RunRequest`] into a [`RunPlan`] with every batch's image, environment, GPUs,
//! limits, timeout, fast mode and names resolved. Pure: it reads no file, no variable
//! and no engine (the host's facts come in as [`HostFacts`]), so it is unit-tested.

use std::collections::BTreeMap;

use indexmap::IndexMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::host::HostPolicy;
use crate::host::caches::CachePolicy;
use crate::image::ImageId;
use crate::manifest::{BatchVerdict, ContainerUser, Manifest, Retries, image_variable};
use crate::plan::container::ContainerPlan;
use crate::plan::container::devices::HostDevices;
use crate::plan::container::mounts::HostMounts;
use crate::plan::error::PlanError;
use crate::timing::partition::{self, PartitionSpec};
use crate::timing::{Expected, Recorded};
use crate::units::Span;
use crate::util::did_you_mean;

/// The source folder, as git says of it (the record's `source`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct SourceInfo {
    /// The commit, when the source is a git checkout.
    pub sha: Option<String>,
    pub dirty: Option<bool>,
    pub path: String,
}

/// What to run, as a user (or `qualify`, or `reproduce`) asks for it.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// Batches by name; with `layer` too, they must belong to it.
    pub names: Vec<String>,
    /// A layer: its batches when no names are given, and its fast mode.
    pub layer: Option<String>,
    /// Fast mode forced on or off; `None`: the layer's.
    pub fast: Option<bool>,
    /// The image ID asked for (flag or `CIBOX_IMAGE`) when the run uses one image;
    /// `None`: the manifest's `id` of that image.
    pub image: Option<String>,
    /// Where `image` came from (`--image`, `CIBOX_IMAGE`), named when it is no ID.
    pub image_from: Option<String>,
    /// IDs asked for by image name (`CIBOX_IMAGE_<NAME>`), for runs of several images.
    pub image_ids: BTreeMap<String, String>,
    /// The source folder (canonical), and what git says of it.
    pub source: PathBuf,
    pub source_info: SourceInfo,
    /// The reports folder (canonical, writable).
    pub reports: PathBuf,
    pub scope: String,
    /// How long a batch may wait for its GPUs; `None`: the manifest's `gpu.wait`.
    pub wait: Option<Duration>,
    /// Run all batches at once; the lease queue decides which fit together.
    pub parallel: bool,
    /// On a node of a Slurm cluster: this process runs one batch as a task of the
    /// job the submitter made for it.
    pub node: Option<NodeRole>,
    /// Why this run's cache writes stay private whatever the host trusts: the
    /// workflow event that may run code nobody merged, or [`REPLAY`].
    pub private_caches: Option<String>,
    /// The pull request whose scope this run's caches read over the base's and keep its
    /// writes in (the host keeps pull requests' writes, and the run's event names
    /// one); `None`: the base's, or private.
    pub pull_request: Option<u64>,
    /// Run only this part of the batches, split by expected time (`--partition K/N`).
    pub partition: Option<PartitionSpec>,
    /// Times earlier runs recorded (`--timings`), winning over `est_time`.
    pub recorded: Recorded,
    /// Every batch's retries, whatever the manifest says (`--retries N`).
    pub retries: Option<u32>,
    /// After the first failed batch, start no more (`--fail-fast`; a layer's
    /// `fail_fast` says so too).
    pub fail_fast: bool,
}

/// [`RunRequest::private_caches`] of a replay (`cibox reproduce`): the record it
/// replays may be anyone's (a pull request's downloaded `result.json`), so what it
/// writes never becomes a cache's, whatever the host trusts.
pub const REPLAY: &str = "reproduce";

/// A batch's task on a node of a Slurm job: which rank, and the GPUs Slurm allocated.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeRole {
    /// The submitter's run ID: this batch's run.
    pub run_id: String,
    pub job_id: String,
    /// This node's name, as Slurm knows it.
    pub node: String,
    pub rank: u32,
    /// How many nodes the job spans.
    pub nodes: u32,
    /// The GPUs Slurm allocated here, by index: exactly these are leased.
    pub gpus: Vec<u32>,
    /// The same by identity, where Slurm names them so (MIG slices' UUIDs in
    /// `CUDA_VISIBLE_DEVICES`): then these are leased.
    pub gpu_ids: Vec<String>,
    /// The rendezvous variables of a job on several nodes (none for one).
    pub rendezvous: BTreeMap<String, String>,
    /// Which attempt at the batch this job is (1-based; the submitter counts them).
    #[serde(default)]
    pub attempt: u32,
}

impl NodeRole {
    /// The ID this task runs under on its node (its containers' `org.cibox.run` label
    /// and its lock in the lock dir's `runs/`): the run's own for one task, but each
    /// task of a run needs its own, since two may share a host (two batches of a run on
    /// one node, or emulated nodes) and a run's lock is held by one process alone. The
    /// record keeps the run's ID.
    pub fn task_run_id(&self, batch: &str) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(format!("{}:{batch}:{}", self.run_id, self.rank));
        crate::util::hex(&digest[..8])
    }

    /// The folder of this rank's reports: the batch's own on one node; on several,
    /// `node-<rank>` in it (the submitter writes the batch's record beside them).
    pub fn batch_dir(&self, reports: &std::path::Path, batch: &str) -> PathBuf {
        if self.nodes > 1 {
            reports.join(batch).join(format!("node-{}", self.rank))
        } else {
            reports.join(batch)
        }
    }
}

/// The user batches run as when cibox runs as root: `nobody:nogroup` on Debian, by
/// number (the image needs no entry for it). A batch must never be host root: it can
/// write the host's reports folder.
pub const UNPRIVILEGED: (u32, u32) = (65534, 65534);

/// What the plan needs to know of this host and process.
#[derive(Debug, Clone)]
pub struct HostFacts {
    pub host: String,
    /// The invoking user; batches run as them, or as [`UNPRIVILEGED`] when that is root.
    pub uid: u32,
    pub gid: u32,
    /// This run's ID (16 hex digits).
    pub run_id: String,
    /// The host's values of the manifest's `pass_env` variables that are set.
    pub pass_env: BTreeMap<String, String>,
    /// Each batch's host mounts, as checked on this host
    /// (`container::mounts::check_host`).
    pub mounts: HostMounts,
    /// The digest of the host policy that granted what the batches loosen, if one did.
    pub policy_digest: Option<String>,
    /// Where the host keeps caches, when it grants them.
    pub caches: Option<CachePolicy>,
    /// Each batch's devices and seccomp profile, as checked on this host.
    pub devices: HostDevices,
}

impl HostFacts {
    /// The facts of this process, for a manifest's `pass_env`, with the batches' host
    /// mounts as checked. Fails when no random run ID can be made.
    pub fn current(
        m: &Manifest,
        mounts: HostMounts,
        policy: &HostPolicy,
    ) -> std::io::Result<HostFacts> {
        Ok(HostFacts {
            host: crate::util::host_name(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            run_id: new_run_id()?,
            // Every batch's own `pass_env` (each a merge of the top-level one).
            pass_env: m
                .batches
                .values()
                .flat_map(|b| b.container.pass_env.iter())
                .chain(&m.container.pass_env)
                .filter_map(|v| std::env::var(v).ok().map(|value| (v.clone(), value)))
                .collect(),
            mounts,
            policy_digest: policy.source.as_ref().map(|s| s.digest.clone()),
            caches: policy.caches.clone(),
            devices: HostDevices::default(),
        })
    }
}

/// One batch, ready to run.
#[derive(Debug, Clone)]
pub struct BatchPlan {
    pub name: String,
    pub gpus: u32,
    /// The model its GPUs must be (a glob over the probe's model names), if any.
    pub gpu_model: Option<String>,
    /// The nodes it spans under Slurm.
    pub nodes: u32,
    pub timeout: Span,
    pub allow_empty: bool,
    /// `<reports>/<batch>/`, mounted at `/reports`.
    pub dir: PathBuf,
    /// The uid:gid the batch's processes run as.
    pub user: (u32, u32),
    pub container: ContainerPlan,
    /// The image it runs in, by name and ID.
    pub image_name: String,
    pub image: ImageId,
    /// JUnit, or the steps' exit status (each `run` step a case).
    pub verdict: BatchVerdict,
    /// The `run` steps, for `verdict: exit-code`.
    pub run: Vec<String>,
    /// The test file, for a batch `cibox changed run` made.
    pub changed_file: Option<String>,
    /// Its caches: name and where the batch sees each.
    pub caches: Vec<(String, String)>,
    /// How often it runs again when it did not pass.
    pub retries: Retries,
    /// Its failure does not fail the run.
    pub soft_fail: bool,
    /// How long it is expected to run (recorded, estimated, or the default).
    pub expected: Duration,
    /// The shard of a sharded batch this is (`shards: N`): its own container, GPUs and
    /// folder (`<reports>/<batch>/shard-<K>`); its `name` is the unit's (`B[K/N]`).
    pub shard: Option<Shard>,
}

/// One shard of a batch: which batch, its index (from 0, as `CIBOX_SHARD_INDEX`,
/// pytest-shard's `--shard-id` and Buildkite's `BUILDKITE_PARALLEL_JOB` count) and how
/// many the batch has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub batch: String,
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// The batch and shard a unit name of `m` stands for; `None` for a batch's own name.
    pub fn of_unit(m: &Manifest, unit: &str) -> Option<Shard> {
        if m.batches.contains_key(unit) {
            return None;
        }
        let (batch, rest) = unit.split_once('[')?;
        let (k, n) = rest.strip_suffix(']')?.split_once('/')?;
        let (k, n) = (k.parse::<u32>().ok()?, n.parse::<u32>().ok()?);
        let b = m.batches.get(batch)?;
        (b.shards == n && (1..=n).contains(&k)).then(|| Shard {
            batch: batch.to_string(),
            index: k - 1,
            count: n,
        })
    }
}

/// The run's units: each batch, a sharded one as its shards, each expected to take its
/// share of the batch's time (a sharded batch's `est_time`, or recorded time, is the
/// whole batch's work on one container).
pub(super) fn units(m: &Manifest, expected: Expected) -> Expected {
    let mut out = Vec::with_capacity(expected.batches.len());
    for e in expected.batches {
        let count = m.batches.get(&e.name).map_or(1, |b| b.shards);
        if count <= 1 {
            out.push(e);
            continue;
        }
        for index in 0..count {
            out.push(crate::timing::Expectation {
                name: crate::manifest::shard_unit(&e.name, index, count),
                time: e.time / count,
                ..e.clone()
            });
        }
    }
    Expected { batches: out }
}

/// The batches `units` stand for, each once, in order.
pub(super) fn batches_of(m: &Manifest, units: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for u in units {
        let b = Shard::of_unit(m, u).map_or_else(|| u.clone(), |s| s.batch);
        if !out.contains(&b) {
            out.push(b);
        }
    }
    out
}

/// A whole run, ready to execute.
#[derive(Debug, Clone)]
pub struct RunPlan {
    pub manifest: Manifest,
    /// The images the run's batches use, by name, in order of first use.
    pub images: IndexMap<String, ImageId>,
    pub fast: bool,
    pub batches: Vec<BatchPlan>,
    pub source: PathBuf,
    pub source_info: SourceInfo,
    pub reports: PathBuf,
    pub scope: String,
    pub run_id: String,
    pub host: String,
    pub wait: Duration,
    pub parallel: bool,
    /// Where the host keeps caches, when it grants them.
    pub caches: Option<CachePolicy>,
    /// Whether the source is bound at `/src` (cibox runs on the engine's host).
    pub bind_source: bool,
    /// On a node of a Slurm job: its rank and GPUs.
    pub node: Option<NodeRole>,
    /// The layer the batches run as part of, if any.
    pub layer: Option<String>,
    /// See [`RunRequest::private_caches`].
    pub private_caches: Option<String>,
    /// See [`RunRequest::pull_request`].
    pub pull_request: Option<u64>,
    /// After the first failed batch, start no more.
    pub fail_fast: bool,
    /// The part of the request's batches this run is, and how many the request had.
    pub partition: Option<(PartitionSpec, usize)>,
    /// The layer's warm-up, first of `batches`: it runs alone before the rest, and
    /// none of them starts when it fails.
    pub warmup: Option<String>,
}

impl RunPlan {
    pub fn needs_gpus(&self) -> bool {
        self.batches.iter().any(|b| b.gpus > 0)
    }
}

/// 16 hex digits from the kernel's random source.
pub fn new_run_id() -> std::io::Result<String> {
    crate::util::random_hex(8)
}

/// Which batches to run: the names given, or else the layer's. With both, the names
/// run as part of the layer (its fast mode applies) and must belong to it: a workflow
/// matrix runs `batch run "$BATCH" --layer L`, one batch per job.
fn select(
    m: &Manifest,
    names: &[String],
    layer: Option<&str>,
) -> Result<(Vec<String>, bool), PlanError> {
    let layer = match layer {
        Some(l) => Some((
            l,
            m.layers.get(l).ok_or_else(|| {
                let layers: Vec<String> = m.layers.keys().cloned().collect();
                PlanError::UnknownLayer {
                    layer: l.to_string(),
                    hint: did_you_mean(l, &layers)
                        .map(|s| format!("did you mean `{s}`?"))
                        .unwrap_or_else(|| format!("layers: {}", layers.join(", "))),
                }
            })?,
        )),
        None => None,
    };
    let mut chosen: Vec<String> = Vec::new();
    for n in &expand_families(m, names) {
        if !m.batches.contains_key(n) {
            return Err(unknown_batch(m, n));
        }
        if let Some((l, layer)) = layer
            && !layer.batches.contains(n)
        {
            return Err(PlanError::NotInLayer {
                batch: n.clone(),
                layer: l.to_string(),
                batches: layer.batches.join(", "),
            });
        }
        if !chosen.contains(n) {
            chosen.push(n.clone());
        }
    }
    if chosen.is_empty()
        && let Some((_, layer)) = layer
    {
        chosen = layer.batches.clone();
    }
    if chosen.is_empty() {
        return Err(PlanError::NothingToRun);
    }
    Ok((chosen, layer.is_some_and(|(_, l)| l.fast)))
}

/// The names with each test list's name replaced by its entries' (a family's name stands
/// for all its entries).
fn expand_families(m: &Manifest, names: &[String]) -> Vec<String> {
    names
        .iter()
        .flat_map(|n| match m.families.get(n) {
            Some(entries) => entries.clone(),
            None => vec![n.clone()],
        })
        .collect()
}

/// `name` names no batch (nor test list): with the closest name, else every one.
fn unknown_batch(m: &Manifest, name: &str) -> PlanError {
    let known: Vec<String> = m.batches.keys().chain(m.families.keys()).cloned().collect();
    PlanError::UnknownBatch {
        batch: name.to_string(),
        hint: did_you_mean(name, &known)
            .map(|s| format!("did you mean `{s}`?"))
            .unwrap_or_else(|| format!("batches: {}", known.join(", "))),
    }
}

/// The batches `names` name (a test list's name: all its entries), each once, in
/// manifest order: what `batch list NAME…` shows.
pub fn named_batches(m: &Manifest, names: &[String]) -> Result<Vec<String>, PlanError> {
    let wanted: std::collections::HashSet<String> = expand_families(m, names).into_iter().collect();
    if let Some(n) = names
        .iter()
        .find(|n| !m.batches.contains_key(*n) && !m.families.contains_key(*n))
    {
        return Err(unknown_batch(m, n));
    }
    Ok(m.batches
        .keys()
        .filter(|b| wanted.contains(*b))
        .cloned()
        .collect())
}

/// The checks of [`plan`] that need nothing but the manifest (which batches, which
/// image ID), for a front end to make before it creates the reports folder: bad input
/// must leave nothing behind.
/// Returns the batches the run will have.
/// The batches a request selects, before any split: its names (a test list's name
/// standing for its entries), else its layer's.
pub fn selected(manifest: &Manifest, request: &RunRequest) -> Result<Vec<String>, PlanError> {
    Ok(select(manifest, &request.names, request.layer.as_deref())?.0)
}

/// With `--partition`, only this part's batches (which may be none).
pub fn check_request(manifest: &Manifest, request: &RunRequest) -> Result<Vec<String>, PlanError> {
    let (names, _) = select(manifest, &request.names, request.layer.as_deref())?;
    let (units, _, _) = part_of(manifest, request, names);
    let names = batches_of(manifest, &units);
    image_ids(manifest, request, &names)?;
    Ok(names)
}

/// The batches of this run's part, in the request's order (all of them without
/// `--partition`), and their expected times; the split is over all the request's
/// batches, so every part sees the same one. A layer's warm-up (`warmup`) is outside
/// the split and first in every part that has batches: its name comes third. A
/// parallel run's batches come longest first, the warm-up still first.
fn part_of(
    manifest: &Manifest,
    request: &RunRequest,
    names: Vec<String>,
) -> (Vec<String>, Expected, Option<String>) {
    let names = &names;
    let expected = units(manifest, Expected::of(manifest, names, &request.recorded));
    let mut part = match request.partition {
        None => expected.batches.iter().map(|e| e.name.clone()).collect(),
        Some(spec) => {
            partition::split(&expected, spec.count)
                .into_iter()
                .nth(spec.index as usize - 1)
                .unwrap_or_default()
                .batches
        }
    };
    let warmup = request
        .layer
        .as_deref()
        .and_then(|l| manifest.layers.get(l))
        .and_then(|l| l.shape.warmup.clone())
        .filter(|w| !part.is_empty() && !part.contains(w));
    if request.parallel {
        part = expected.start_order(&part);
    }
    let Some(w) = warmup else {
        return (part, expected, None);
    };
    let mut with = vec![w.clone()];
    with.extend(names.iter().cloned());
    let expected = units(manifest, Expected::of(manifest, &with, &request.recorded));
    part.insert(0, w.clone());
    (part, expected, Some(w))
}

/// The image batch `name` runs in: the layer's, when it runs as part of a layer that
/// names one; else its own (or `default`). Never another layer's.
pub fn batch_image<'m>(
    manifest: &'m Manifest,
    name: &str,
    layer: Option<&str>,
) -> Result<&'m str, PlanError> {
    if let Some(img) = layer
        .and_then(|l| manifest.layers.get(l))
        .and_then(|l| l.image.as_deref())
    {
        return Ok(img);
    }
    let batch = &manifest.batches[name];
    if batch.image_named || manifest.images.contains_key(crate::manifest::DEFAULT_IMAGE) {
        return Ok(&batch.image);
    }
    let layers: Vec<&str> = manifest
        .layers
        .iter()
        .filter(|(_, l)| l.image.is_some() && l.batches.iter().any(|b| b == name))
        .map(|(n, _)| n.as_str())
        .collect();
    Err(PlanError::NoImageOutsideLayer {
        batch: name.to_string(),
        layers: layers.join(", "),
    })
}

/// The ID of each image the batches use: `--image`/`CIBOX_IMAGE` when they use one
/// image, else `CIBOX_IMAGE_<NAME>`, else the manifest's.
fn image_ids(
    manifest: &Manifest,
    request: &RunRequest,
    names: &[String],
) -> Result<IndexMap<String, ImageId>, PlanError> {
    let mut used: Vec<&str> = Vec::new();
    for n in names {
        let img = batch_image(manifest, n, request.layer.as_deref())?;
        if !used.contains(&img) {
            used.push(img);
        }
    }
    if request.image.is_some() && used.len() > 1 {
        return Err(PlanError::AmbiguousImage {
            names: used.join(", "),
        });
    }
    let mut out = IndexMap::new();
    for name in used {
        let raw = request
            .image
            .clone()
            .or_else(|| request.image_ids.get(name).cloned())
            .or_else(|| manifest.images.get(name).and_then(|i| i.id.clone()));
        let Some(raw) = raw else {
            return Err(if name == crate::manifest::DEFAULT_IMAGE {
                PlanError::NoImage
            } else {
                PlanError::NoNamedImage {
                    name: name.to_string(),
                    var: image_variable(name),
                }
            });
        };
        let id = ImageId::parse(raw.trim()).map_err(|why| {
            // Where the ID came from, when the manifest has several images.
            if request.image.is_none() && manifest.images.len() > 1 {
                let from = if request.image_ids.contains_key(name) {
                    image_variable(name)
                } else {
                    "its `id`".to_string()
                };
                PlanError::BadImageId(format!("image `{name}` ({from}): {why}"))
            } else if let (Some(_), Some(from)) = (&request.image, &request.image_from) {
                PlanError::BadImageId(format!("{why} (from {from})"))
            } else if request.image_ids.contains_key(name) {
                PlanError::BadImageId(format!("{why} (from {})", image_variable(name)))
            } else {
                PlanError::BadImageId(why)
            }
        })?;
        out.insert(name.to_string(), id);
    }
    Ok(out)
}

/// Whether the run stops at its first failure: asked for, or its layer's choice.
fn fail_fast_of(manifest: &Manifest, request: &RunRequest) -> bool {
    request.fail_fast
        || request
            .layer
            .as_deref()
            .and_then(|l| manifest.layers.get(l))
            .is_some_and(|l| l.fail_fast)
}

/// A batch's reports folder: `<reports>/<batch>/`, a shard's `shard-<K>/` in it, a
/// Slurm rank's its own.
fn batch_dir(request: &RunRequest, name: &str, shard: Option<&Shard>) -> PathBuf {
    match (&request.node, shard) {
        (Some(role), _) => role.batch_dir(&request.reports, name),
        (None, Some(s)) => request
            .reports
            .join(name)
            .join(format!("shard-{}", s.index + 1)),
        (None, None) => request.reports.join(name),
    }
}

/// Resolves everything the run's batches need.
pub fn plan(
    manifest: Manifest,
    request: RunRequest,
    host: &HostFacts,
) -> Result<RunPlan, PlanError> {
    let (all, layer_fast) = select(&manifest, &request.names, request.layer.as_deref())?;
    let requested = all.len();
    let (names, expected, warmup) = part_of(&manifest, &request, all);
    let expected = expected.times();
    let fail_fast = fail_fast_of(&manifest, &request);
    let fast = request.fast.unwrap_or(layer_fast);
    let images = image_ids(&manifest, &request, &batches_of(&manifest, &names))?;
    let wait = request.wait.unwrap_or(manifest.gpu.wait.0);
    // The invoker, unless root: then an unprivileged user.
    let user = if host.uid == 0 {
        UNPRIVILEGED
    } else {
        (host.uid, host.gid)
    };
    let identity = crate::plan::container::Identity {
        project: &manifest.project,
        scope: &request.scope,
        run_id: &host.run_id,
        host: &host.host,
        source: &request.source,
        source_sha: request.source_info.sha.as_deref(),
        fast,
        pass_env: &host.pass_env,
        lock_dir: &manifest.gpu.lock_dir,
        policy_digest: host.policy_digest.as_deref(),
    };
    let batches = names
        .iter()
        .map(|unit| {
            let shard = Shard::of_unit(&manifest, unit);
            let name = shard.as_ref().map_or(unit, |s| &s.batch);
            let batch = &manifest.batches[name];
            let image_name = batch_image(&manifest, name, request.layer.as_deref())?;
            let dir = batch_dir(&request, name, shard.as_ref());
            let batch_user = match batch.container.user {
                ContainerUser::Invoker => user,
                ContainerUser::Root => (0, 0),
                ContainerUser::Ids(u, g) => (u, g),
            };
            let mut container = ContainerPlan::new(
                &manifest,
                name,
                batch,
                &identity,
                batch_user,
                (image_name, &images[image_name]),
                host.mounts.get(name).cloned().unwrap_or_default(),
            );
            if let Some(granted) = host.devices.get(name) {
                container.grant_devices(granted.clone());
            }
            if let Some(role) = &request.node {
                container.on_node(role.rank, role.nodes, &role.rendezvous);
            }
            if let Some(s) = &shard {
                container.on_shard(s.index, s.count);
            }
            Ok(BatchPlan {
                name: unit.clone(),
                gpus: batch.gpus,
                gpu_model: batch.gpu_model.clone().filter(|_| batch.gpus > 0),
                nodes: batch.nodes,
                timeout: batch.timeout,
                allow_empty: batch.allow_empty,
                container,
                image_name: image_name.to_string(),
                image: images[image_name].clone(),
                dir,
                user: batch_user,
                verdict: batch.verdict,
                run: batch.run.clone(),
                changed_file: batch.changed_file.clone(),
                caches: batch
                    .caches
                    .iter()
                    .map(|c| (c.clone(), manifest.caches[c].path.clone()))
                    .collect(),
                retries: match request.retries {
                    Some(count) => Retries {
                        count,
                        ..batch.retries.clone()
                    },
                    None => batch.retries.clone(),
                },
                soft_fail: batch.soft_fail,
                expected: expected[unit],
                shard,
            })
        })
        .collect::<Result<Vec<_>, PlanError>>()?;
    Ok(RunPlan {
        images,
        fast,
        batches,
        source: request.source,
        source_info: request.source_info,
        reports: request.reports,
        scope: request.scope,
        run_id: host.run_id.clone(),
        host: host.host.clone(),
        wait,
        parallel: request.parallel,
        caches: host.caches.clone(),
        bind_source: true,
        node: request.node,
        layer: request.layer,
        private_caches: request.private_caches,
        pull_request: request.pull_request,
        fail_fast,
        partition: request.partition.map(|p| (p, requested)),
        warmup,
        manifest,
    })
}

#[cfg(test)]
pub(crate) mod tests;
