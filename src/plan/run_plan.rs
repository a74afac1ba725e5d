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
    let (names, _, _) = part_of(manifest, request, names);
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
    let expected = Expected::of(manifest, &names, &request.recorded);
    let mut part = match request.partition {
        None => names,
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
    with.extend(expected.batches.iter().map(|e| e.name.clone()));
    let expected = Expected::of(manifest, &with, &request.recorded);
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
            } else {
                PlanError::BadImageId(why)
            }
        })?;
        out.insert(name.to_string(), id);
    }
    Ok(out)
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
    let fail_fast = request.fail_fast
        || request
            .layer
            .as_deref()
            .and_then(|l| manifest.layers.get(l))
            .is_some_and(|l| l.fail_fast);
    let fast = request.fast.unwrap_or(layer_fast);
    let images = image_ids(&manifest, &request, &names)?;
    let wait = request.wait.unwrap_or(manifest.gpu.wait.0);
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
        .map(|name| {
            let batch = &manifest.batches[name];
            let image_name = batch_image(&manifest, name, request.layer.as_deref())?;
            let dir = match &request.node {
                Some(role) => role.batch_dir(&request.reports, name),
                None => request.reports.join(name),
            };
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
            Ok(BatchPlan {
                name: name.clone(),
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
                expected: expected[name],
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
pub(crate) mod tests {
    use super::*;

    /// The plan of the test manifest's batch `b` (1 GPU).
    pub(crate) fn run_plan() -> RunPlan {
        plan(manifest(), request(&["b"], None), &host()).unwrap()
    }

    /// A planned batch named `name` (batch `b` of the test manifest, 1 GPU).
    pub(crate) fn batch_plan(name: &str) -> BatchPlan {
        let mut b = plan(manifest(), request(&["b"], None), &host())
            .unwrap()
            .batches
            .remove(0);
        b.name = name.into();
        b
    }

    const IMAGE: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn manifest() -> Manifest {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ncontainer: {env: {A: base, B: base}, pass_env: [TOKEN]}\nbatches:\n  a: {gpus: 0, timeout: 1m, run: [\"true\"]}\n  b: {gpus: 1, timeout: 2m, run: [\"true\"], env: {B: batch}, fast_env: {F: \"1\"}}\n  c: {gpus: 2, timeout: 1m, run: [\"true\"]}\nlayers:\n  \"2\": {batches: [a, b], fast: true}\n";
        Manifest::parse(text, std::path::Path::new("cibox.yaml")).unwrap()
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn host() -> HostFacts {
        HostFacts {
            host: "h".into(),
            uid: 1000,
            gid: 1000,
            run_id: "0123456789abcdef".into(),
            pass_env: BTreeMap::from([("TOKEN".to_string(), "secret".to_string())]),
            mounts: HostMounts::default(),
            policy_digest: None,
            caches: None,
            devices: Default::default(),
        }
    }

    fn request(names_: &[&str], layer: Option<&str>) -> RunRequest {
        RunRequest {
            names: names(names_),
            layer: layer.map(str::to_string),
            image: Some(IMAGE.into()),
            source: "/src/p".into(),
            reports: "/tmp/r".into(),
            scope: "local-me".into(),
            ..RunRequest::default()
        }
    }

    #[test]
    fn a_run_whose_cache_writes_stay_private_tells_its_slurm_nodes() {
        let mut r = request(&["a"], None);
        r.private_caches = Some("pull_request_target".into());
        let p = plan(manifest(), r, &host()).unwrap();
        let job = crate::run::slurm::node::NodeJob::of(&p, 0, 1);
        let sent: crate::run::slurm::node::NodeJob =
            serde_json::from_str(&serde_json::to_string(&job).unwrap()).unwrap();
        assert_eq!(sent.private_caches.as_deref(), Some("pull_request_target"));
        assert_eq!(sent.pull_request, None);
        // A pull request's run: the node keeps its writes in that scope, or private.
        let mut r = request(&["a"], None);
        r.pull_request = Some(7);
        let p = plan(manifest(), r, &host()).unwrap();
        let job = crate::run::slurm::node::NodeJob::of(&p, 0, 1);
        let sent: crate::run::slurm::node::NodeJob =
            serde_json::from_str(&serde_json::to_string(&job).unwrap()).unwrap();
        assert_eq!(sent.pull_request, Some(7));
        assert_eq!(sent.private_caches, None);
    }

    #[test]
    fn each_task_of_a_slurm_job_runs_under_an_id_of_its_own() {
        let role = |rank| NodeRole {
            run_id: "0123456789abcdef".into(),
            rank,
            nodes: 2,
            ..NodeRole::default()
        };
        let (a, b) = (role(0).task_run_id("b"), role(1).task_run_id("b"));
        assert!(crate::lockdir::runs::is_run_id(&a) && crate::lockdir::runs::is_run_id(&b));
        assert_ne!(a, b);
        assert_ne!(a, role(0).task_run_id("c"));
        assert_eq!(a, role(0).task_run_id("b"), "the same task, the same ID");
    }

    #[test]
    fn names_with_a_layer_run_only_those_names_in_its_mode() {
        let m = manifest();
        assert_eq!(
            select(&m, &names(&["b"]), Some("2")).unwrap(),
            (names(&["b"]), true)
        );
        assert_eq!(
            select(&m, &[], Some("2")).unwrap(),
            (names(&["a", "b"]), true)
        );
        assert_eq!(
            select(&m, &names(&["c", "a", "c"]), None).unwrap(),
            (names(&["c", "a"]), false)
        );
        let err = select(&m, &names(&["c"]), Some("2"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("batch `c` is not in layer `2` (its batches: a, b)"),
            "{err}"
        );
        assert!(select(&m, &[], None).is_err());
        let err = select(&m, &names(&["bb"]), None).unwrap_err().to_string();
        assert_eq!(err, "unknown batch `bb`; did you mean `b`?");
    }

    #[test]
    fn a_plan_resolves_each_batch() {
        let p = plan(manifest(), request(&[], Some("2")), &host()).unwrap();
        assert!(p.fast, "the layer's fast mode");
        assert_eq!(p.wait, manifest().gpu.wait.0);
        let b = &p.batches[1];
        assert_eq!((b.name.as_str(), b.gpus), ("b", 1));
        assert_eq!(b.timeout.to_string(), "2m");
        assert_eq!(b.dir, PathBuf::from("/tmp/r/b"));
        assert_eq!(b.container.name, "cibox-p-local-me-b-01234567");
        // The record gets the manifest's variables, batch over base, fast ones on top,
        // and never a host value.
        assert_eq!(
            b.container.manifest_env,
            BTreeMap::from([
                ("A".to_string(), "base".to_string()),
                ("B".to_string(), "batch".to_string()),
                ("F".to_string(), "1".to_string()),
            ])
        );
        let body = b
            .container
            .body(&crate::gpu::vendor::Handover::default(), &[], true);
        let env = body.env.unwrap();
        assert!(env.contains(&"TOKEN=secret".to_string()), "{env:?}");
        assert!(env.contains(&"CIBOX_FAST=1".to_string()), "{env:?}");
        assert_eq!(b.container.user(), "1000:1000");
        assert_eq!(
            body.user.as_deref(),
            Some("0:0"),
            "the keeper, not the batch"
        );
        let forced = RunRequest {
            fast: Some(false),
            wait: Some(Duration::from_secs(7)),
            ..request(&["b"], Some("2"))
        };
        let p = plan(manifest(), forced, &host()).unwrap();
        assert!(!p.fast);
        let root = HostFacts {
            uid: 0,
            gid: 0,
            ..host()
        };
        let as_root = plan(manifest(), request(&["a"], None), &root).unwrap();
        // A batch never runs as host root.
        assert_eq!(as_root.batches[0].container.user(), "65534:65534");
        assert_eq!(p.wait, Duration::from_secs(7));
        assert!(!p.batches[0].container.manifest_env.contains_key("F"));
    }

    #[test]
    fn a_parallel_run_starts_the_widest_then_the_longest_and_a_part_holds_its_share() {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1h, run: [x], gpus: 0}\nbatches:\n  short: {est_time: 1m}\n  long: {est_time: 30m}\n  mid: {est_time: 10m, gpus: 2}\n  unknown: {}\nlayers:\n  l: {batches: all, fail_fast: true}\n";
        let m = Manifest::parse(text, std::path::Path::new("cibox.yaml")).unwrap();
        let order = |parallel: bool, partition: Option<&str>| {
            let r = RunRequest {
                parallel,
                partition: partition.map(|p| p.parse().unwrap()),
                ..request(&[], Some("l"))
            };
            let p = plan(m.clone(), r, &host()).unwrap();
            assert!(p.fail_fast, "the layer's fail_fast");
            p.batches.iter().map(|b| b.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(order(false, None), ["short", "long", "mid", "unknown"]);
        // `unknown` is expected to take the mean of the others: 13m 40s. The widest
        // first (`mid` holds two GPUs), then the longest.
        assert_eq!(order(true, None), ["mid", "long", "unknown", "short"]);
        // Work: long 1800, mid 1200 (two GPUs), unknown 820, short 60 GPU-seconds.
        assert_eq!(order(false, Some("1/2")), ["short", "long"]);
        assert_eq!(order(false, Some("2/2")), ["mid", "unknown"]);
        assert_eq!(order(true, Some("1/2")), ["long", "short"]);
        let p = plan(
            m.clone(),
            RunRequest {
                partition: Some("2/2".parse().unwrap()),
                retries: Some(3),
                ..request(&[], Some("l"))
            },
            &host(),
        )
        .unwrap();
        assert_eq!(
            p.partition.map(|(s, n)| (s.to_string(), n)),
            Some(("2/2".into(), 4))
        );
        assert!(p.batches.iter().all(|b| b.retries.count == 3));
    }

    #[test]
    fn a_batch_run_as_part_of_a_layer_takes_that_layers_image_and_no_other() {
        let text = "version: 1\nproject: p\nimages:\n  default: {locks: [x], id: \"sha256:0000000000000000000000000000000000000000000000000000000000000000\", install: [\"pip install -e .\"]}\n  slime-test: {locks: [y], id: \"sha256:1111111111111111111111111111111111111111111111111111111111111111\", install: [\"pip install --no-deps -e .\"]}\nbatches:\n  a: {gpus: 0, timeout: 1m, run: [\"true\"]}\n  b: {gpus: 0, timeout: 1m, run: [\"true\"], install: [\"make\"]}\nlayers:\n  megatron: {batches: [a, b]}\n  image: {batches: [a, b], image: slime-test}\n";
        let m = Manifest::parse(text, std::path::Path::new("cibox.yaml")).unwrap();
        let run = |layer: Option<&str>| {
            let mut r = request(&["a", "b"], layer);
            r.image = None;
            plan(m.clone(), r, &host()).unwrap()
        };
        let megatron = run(Some("megatron"));
        assert_eq!(megatron.images.keys().collect::<Vec<_>>(), ["default"]);
        assert_eq!(megatron.batches[0].image_name, "default");
        let image = run(Some("image"));
        assert_eq!(image.images.keys().collect::<Vec<_>>(), ["slime-test"]);
        // Each image installs the source its own way; a batch's own install wins.
        let script = |p: &RunPlan, i: usize| p.batches[i].container.steps()[2].clone();
        assert!(script(&megatron, 0).contains("cibox install: pip install -e ."));
        assert!(script(&image, 0).contains("cibox install: pip install --no-deps -e ."));
        assert!(script(&image, 1).contains("cibox install: make"));
        assert!(!script(&image, 1).contains("pip install"));
    }

    #[test]
    fn the_image_comes_from_the_request_else_the_manifest_and_must_be_an_id() {
        let no_image = RunRequest {
            image: None,
            ..request(&["a"], None)
        };
        assert!(matches!(
            plan(manifest(), no_image, &host()),
            Err(PlanError::NoImage)
        ));
        let tag = RunRequest {
            image: Some("ubuntu:latest".into()),
            ..request(&["a"], None)
        };
        assert!(matches!(
            plan(manifest(), tag, &host()),
            Err(PlanError::BadImageId(_))
        ));
    }
}
