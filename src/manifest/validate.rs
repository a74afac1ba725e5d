//! The semantic checks that turn a [`RawManifest`] into a [`Manifest`]: the top level
//! (version, project, which image batches default to), batches and layers, calling
//! each section's own checks (images, container, GPU, changed) in the order the
//! first error is reported.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use indexmap::IndexMap;

use crate::util::did_you_mean;

use super::caches::{CacheSpec, batch_caches, validate_caches};
use super::changed::validate_changed;
use super::check::Checker;
use super::collect::{self, CollectSpec, Collected, CollectedEntry};
use super::container::{RawContainer, validate_container};
use super::document::Manifest;
use super::each;
use super::error::ManifestError;
use super::gpu::validate_gpu;
use super::images::{DEFAULT_IMAGE, ImageConfig, known_image, validate_images};
use super::placement;
use super::raw::{RawBatch, RawLayer, RawLayerBatches, RawManifest};
use super::schedule;
use super::tree::{MAX_EXPANDED_BYTES, MAX_EXPANDED_VALUES, shown_bytes};
use super::types::{Batch, Layer};
use super::values::{env_map, is_name, plain_meta};

/// The semantic checks, section by section in this order: the version and project,
/// the images (and a default one for batches that name none), the container, the GPU
/// pool, the batches, the layers, `changed`. The first error found is the one
/// reported, so this order is part of what a manifest's author sees.
pub(super) fn validate(
    raw: RawManifest,
    check: &Checker<'_>,
    path: PathBuf,
    dir: PathBuf,
    collected: Option<&Collected>,
) -> Result<Manifest, ManifestError> {
    validate_version_and_project(check, raw.version, &raw.project)?;
    let images = validate_images(check, raw.image, raw.images)?;

    let top_container = raw.container.clone();
    let container = validate_container(check, &["container"], raw.container)?;

    let gpu = validate_gpu(check, raw.gpu)?;

    let caches = validate_caches(check, raw.caches)?;
    let (batches, families, collectors) = validate_batches(
        check,
        &images,
        &caches,
        &top_container,
        raw.batches,
        collected,
    )?;
    let layers = validate_layers(check, &images, &batches, &families, raw.layers)?;
    require_an_image(check, &images, &batches, &layers)?;

    let changed = match raw.changed {
        None => None,
        Some(ch) => Some(validate_changed(
            check,
            &images,
            &caches,
            &top_container,
            ch,
            raw.workflows.buildkite.is_some(),
        )?),
    };
    super::changed::check_batch_changes(check, &batches, changed.as_ref())?;

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
        families,
        collectors,
        collected: collected.cloned(),
        layers,
        changed,
        workflows: raw.workflows,
        caches,
    })
}

/// `version` (1) and `project` (a name that becomes part of container names).
fn validate_version_and_project(
    check: &Checker<'_>,
    version: u32,
    project: &str,
) -> Result<(), ManifestError> {
    if version != 1 {
        return Err(check.at(
            &["version"],
            format!("version {version} is not supported; this cibox reads version 1"),
        ));
    }
    if !is_name(project, false) {
        return Err(check.at(
            &["project"],
            format!(
                "`{project}` is not a valid project name: use [a-z0-9][a-z0-9_.-]* (it becomes part of container names and labels)"
            ),
        ));
    }
    Ok(())
}

/// Without an image named `default`, every batch must name its own, or be in a layer
/// that names one (it then runs only as part of such a layer).
fn require_an_image(
    check: &Checker<'_>,
    images: &IndexMap<String, ImageConfig>,
    batches: &IndexMap<String, Batch>,
    layers: &IndexMap<String, Layer>,
) -> Result<(), ManifestError> {
    if images.contains_key(DEFAULT_IMAGE) {
        return Ok(());
    }
    let in_imaged_layer = |b: &str| {
        layers
            .values()
            .any(|l| l.image.is_some() && l.batches.iter().any(|x| x == b))
    };
    if let Some((first, _)) = batches
        .iter()
        .find(|(n, b)| !b.image_named && !in_imaged_layer(n))
    {
        return Err(check.at(
            &["batches", first.as_str()],
            format!(
                "names no `image`, and `images` has no `{DEFAULT_IMAGE}`: add `image: NAME` (one of {}) or an image named `{DEFAULT_IMAGE}`",
                images.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    Ok(())
}

/// The batches, the test lists' families (each with the batches of its entries), and
/// the collectors of the lists the project's code prints.
type Batches = (
    IndexMap<String, Batch>,
    IndexMap<String, Vec<String>>,
    IndexMap<String, CollectSpec>,
);

/// Reads `batches:`, in order; a batch with `each:` becomes one batch per entry.
fn validate_batches(
    check: &Checker<'_>,
    images: &IndexMap<String, ImageConfig>,
    caches: &IndexMap<String, CacheSpec>,
    top_container: &RawContainer,
    raw: IndexMap<String, RawBatch>,
    collected: Option<&Collected>,
) -> Result<Batches, ManifestError> {
    if raw.is_empty() {
        return Err(check.at(&["batches"], "define at least one batch"));
    }
    // Every batch's and family's name, so an entry cannot take one defined further down.
    // A family's name stands for its entries (in layers, `batch run`, `batch list`): an
    // entry of that name could never be named alone.
    let mut taken: HashMap<String, String> = raw
        .iter()
        .map(|(n, b)| {
            let what = match (&b.each, &b.collect) {
                (None, None) => format!("batches.{n}"),
                _ => {
                    format!("batches.{n} (a test list, whose name stands for all its entries)")
                }
            };
            (n.clone(), what)
        })
        .collect();
    let mut batches = IndexMap::new();
    let mut families = IndexMap::new();
    let mut collectors = IndexMap::new();
    // Batches with their shards counted: each shard is a container of its own.
    let mut units = 0usize;
    for (name, mut b) in raw {
        let each = b.each.take();
        let collect = b.collect.take();
        let batch = validate_batch(check, images, caches, top_container, &name, b)?;
        let (list, entries) = match (each, collect) {
            (Some(_), Some(_)) => {
                return Err(check.at(
                    &["batches", &name, "collect"],
                    "a test list is written out (`each:`) or printed by the project's code (`collect:`), not both",
                ));
            }
            (None, None) => ("", None),
            (Some(entries), None) => ("each", Some(Some(entries))),
            (None, Some(raw)) => {
                collectors.insert(
                    name.clone(),
                    collect::collect_spec(check, &name, &batch.image, raw)?,
                );
                let entries = collected.map(|c| {
                    c.lists
                        .get(&name)
                        .map(|l| l.iter().map(CollectedEntry::raw).collect())
                        .unwrap_or_default()
                });
                ("collect", Some(entries))
            }
        };
        match entries {
            // A batch of its own.
            None => {
                batches.insert(name.clone(), batch);
            }
            // Not collected yet: a family of no entries, for now.
            Some(None) => {
                families.insert(name.clone(), Vec::new());
            }
            Some(Some(entries)) => {
                let expanded = each::expand(check, list, &name, &batch, entries, &mut taken)?;
                families.insert(name.clone(), expanded.keys().cloned().collect());
                batches.extend(expanded);
            }
        }
        let (added, sharded) = units_of(&batches, &families, &name);
        units += added;
        if units > each::MAX_BATCHES && sharded {
            return Err(check.at(
                &["batches", name.as_str(), "shards"],
                format!(
                    "brings the manifest's batches, each shard counted, past {}: each shard is a container of its own",
                    each::MAX_BATCHES
                ),
            ));
        }
        if batches.len() > each::MAX_BATCHES {
            return Err(check.at(
                &["batches"],
                format!(
                    "holds more than {} batches (test lists' entries included)",
                    each::MAX_BATCHES
                ),
            ));
        }
    }
    Ok((batches, families, collectors))
}

/// The containers the batch `name` (or the test list of that name) stands for, each
/// shard counted, and whether any of them is sharded.
fn units_of(
    batches: &IndexMap<String, Batch>,
    families: &IndexMap<String, Vec<String>>,
    name: &str,
) -> (usize, bool) {
    let one = [name.to_string()];
    let names = families.get(name).map_or(&one[..], Vec::as_slice);
    names
        .iter()
        .filter_map(|n| batches.get(n))
        .fold((0, false), |(units, sharded), b| {
            (units + b.shards as usize, sharded || b.shards > 1)
        })
}

/// The most nodes a batch may span.
const MAX_NODES: i64 = 1024;

/// Reads one batch; `top_container` is the top-level `container:`, the batch's when
/// it has none.
fn validate_batch(
    check: &Checker<'_>,
    images: &IndexMap<String, ImageConfig>,
    caches: &IndexMap<String, CacheSpec>,
    top_container: &RawContainer,
    name: &str,
    b: RawBatch,
) -> Result<Batch, ManifestError> {
    if !is_name(name, true) {
        return Err(check.at_key(
            &["batches", name],
            format!("`{name}` is not a valid batch name: use letters, digits, `_`, `.` and `-`, starting with a letter or digit"),
        ));
    }
    if b.gpus < 0 {
        return Err(check.at(
            &["batches", name, "gpus"],
            format!("must be 0 or more, got {}", b.gpus),
        ));
    }
    if b.gpus > u32::MAX as i64 {
        return Err(check.at(&["batches", name, "gpus"], "is too large"));
    }
    if let Some(glob) = &b.gpu_model {
        crate::manifest::check_model_glob(glob)
            .map_err(|why| check.at(&["batches", name, "gpu_model"], why))?;
    }
    let nodes = match b.nodes {
        None => 1,
        Some(n) if (1..=MAX_NODES).contains(&n) => n as u32,
        Some(n) => {
            return Err(check.at(
                &["batches", name, "nodes"],
                format!("must be 1 to {MAX_NODES}, got {n}"),
            ));
        }
    };
    let shards = placement::shards(check, &["batches", name, "shards"], b.shards, nodes)?;
    let Some(timeout) = b.timeout else {
        return Err(check.at(
            &["batches", name],
            "missing required key `timeout`: add one (`timeout: 30m`), or set it for every batch under `defaults:`",
        ));
    };
    if timeout.0.is_zero() {
        return Err(check.at(&["batches", name, "timeout"], "must be more than 0s"));
    }
    if b.run.is_empty() || b.run.iter().all(|s| s.trim().is_empty()) {
        return Err(check.at(&["batches", name, "run"], "needs at least one command"));
    }
    let batch_container = match b.container {
        Some(c) => validate_container(check, &["batches", name, "container"], c)?,
        None => validate_container(check, &["container"], top_container.clone())?,
    };
    // The ranks meet over the nodes' network (NCCL, the rendezvous): a loosening the
    // manifest must ask for, and the host grant.
    if nodes > 1 && batch_container.network != crate::manifest::Network::Host {
        return Err(check.at(
            &["batches", name, "nodes"],
            format!("a batch on {nodes} nodes needs `container: {{network: host}}`: its ranks meet over the nodes' network (the host policy must grant `network: [host]`)"),
        ));
    }
    let caches = batch_caches(
        check,
        &["batches", name],
        caches,
        b.caches,
        &batch_container,
    )?;
    let env = env_map(check, &["batches", name, "env"], b.env)?;
    Ok(Batch {
        caches,
        description: b.description,
        gpus: b.gpus as u32,
        gpu_model: b.gpu_model,
        nodes,
        shards,
        timeout,
        preflight: b.preflight,
        run: b.run,
        env,
        fast_env: env_map(check, &["batches", name, "fast_env"], b.fast_env)?,
        allow_empty: b.allow_empty,
        est_time: schedule::est_time(check, &["batches", name, "est_time"], b.est_time)?,
        retries: schedule::retries(check, &["batches", name, "retries"], b.retries)?,
        soft_fail: b.soft_fail,
        tests: b.tests,
        container: batch_container,
        meta: plain_meta(check, &["batches", name, "meta"], b.meta, false)?,
        verdict: b.verdict.unwrap_or_default(),
        image_named: b.image.is_some(),
        image: match &b.image {
            Some(img) => {
                known_image(check, images, &["batches", name, "image"], img)?;
                img.clone()
            }
            None => DEFAULT_IMAGE.to_string(),
        },
        install: b.install,
        family: None,
        changed_file: None,
        working_dir: placement::working_dir(
            check,
            &["batches", name, "working_dir"],
            b.working_dir,
        )?,
        queue: placement::queue(check, &["batches", name, "queue"], b.queue)?,
        manual: b.manual,
        changes: b.changes,
    })
}

/// Reads `layers:`, in order. A layer's `image` is the image its batches run in when
/// run as part of it (a batch in two layers runs in each one's); a batch that names
/// its own image cannot be in a layer that names another.
fn validate_layers(
    check: &Checker<'_>,
    images: &IndexMap<String, ImageConfig>,
    batches: &IndexMap<String, Batch>,
    families: &IndexMap<String, Vec<String>>,
    raw: IndexMap<String, RawLayer>,
) -> Result<IndexMap<String, Layer>, ManifestError> {
    let known: Vec<String> = batches.keys().cloned().collect();
    let mut layers = IndexMap::new();
    // Each layer holds the names of the batches it stands for (`all`: every one): many
    // layers of many batches would multiply them, as defaults under batches would.
    let (mut named, mut named_bytes) = (0usize, 0usize);
    for (name, l) in raw {
        if !is_name(&name, true) {
            return Err(check.at_key(
                &["layers", &name],
                format!("`{name}` is not a valid layer name: use letters, digits, `_`, `.` and `-`, starting with a letter or digit (it reaches workflow files)"),
            ));
        }
        let (mut list, all) = layer_batches(check, batches, families, &known, &name, l.batches)?;
        let shape =
            placement::layer_shape(check, &name, batches, &mut list, all, l.warmup, l.budget)?;
        named += list.len();
        named_bytes += list.iter().map(String::len).sum::<usize>();
        if named > MAX_EXPANDED_VALUES || named_bytes > MAX_EXPANDED_BYTES {
            return Err(check.at(
                &["layers", &name, "batches"],
                format!(
                    "the layers up to this one name {named} batches ({} of names; `all` and a test list count each batch they stand for), more than the {} MiB and {MAX_EXPANDED_VALUES} values a manifest may: fewer layers of `all`",
                    shown_bytes(named_bytes),
                    MAX_EXPANDED_BYTES >> 20
                ),
            ));
        }
        if let Some(img) = &l.image {
            known_image(check, images, &["layers", &name, "image"], img)?;
            if let Some(b) = list
                .iter()
                .find(|b| batches[*b].image_named && batches[*b].image != *img)
            {
                return Err(check.at(
                    &["layers", &name, "image"],
                    format!(
                        "runs its batches in image `{img}`, but batch `{b}` names image `{}` (batches.{b}.image): which one it runs in would be ambiguous; drop one of them",
                        batches[b].image
                    ),
                ));
            }
        }
        let meta = plain_meta(check, &["layers", &name, "meta"], l.meta, false)?;
        layers.insert(
            name,
            Layer {
                description: l.description,
                batches: list,
                all,
                fast: l.fast,
                fail_fast: l.fail_fast,
                meta,
                image: l.image,
                shape,
            },
        );
    }
    Ok(layers)
}

/// A layer's `batches:`: `all` (every batch, in manifest order) or a list of defined
/// batches and test lists (a list stands for its entries), each once. Gives the names
/// and whether they were `all`.
fn layer_batches(
    check: &Checker<'_>,
    batches: &IndexMap<String, Batch>,
    families: &IndexMap<String, Vec<String>>,
    known: &[String],
    name: &str,
    raw: RawLayerBatches,
) -> Result<(Vec<String>, bool), ManifestError> {
    let (list, all) = match raw {
        RawLayerBatches::Named(s) if s == "all" => (known.to_vec(), true),
        RawLayerBatches::Named(s) => {
            return Err(check.at(
                &["layers", name, "batches"],
                format!("`{s}` is not a list of batches; write `all` or [name, …]"),
            ));
        }
        RawLayerBatches::List(v) => (v, false),
    };
    if list.is_empty() {
        return Err(check.at(&["layers", name, "batches"], "lists no batch"));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(list.len());
    for (i, b) in list.iter().enumerate() {
        let at = ["layers", name, "batches", &i.to_string()];
        if let Some(entries) = families.get(b) {
            for e in entries {
                if !seen.insert(e.clone()) {
                    return Err(check.at(
                        &at,
                        format!("batch `{e}` (of test list `{b}`) is listed twice"),
                    ));
                }
                out.push(e.clone());
            }
            continue;
        }
        if !batches.contains_key(b) {
            let hint = did_you_mean(b, known)
                .map(|s| format!("; did you mean `{s}`?"))
                .unwrap_or_else(|| format!("; defined batches: {}", known.join(", ")));
            return Err(check.at(&at, format!("batch `{b}` is not defined{hint}")));
        }
        if !seen.insert(b.clone()) {
            return Err(check.at(&at, format!("batch `{b}` is listed twice")));
        }
        out.push(b.clone());
    }
    Ok((out, all))
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::{GOOD, REAL, parse};

    #[test]
    fn negative_gpus() {
        let err = parse(&GOOD.replace("gpus: 1", "gpus: -1")).unwrap_err();
        assert!(
            err.contains("cibox.yaml:13:11: batches.4a.gpus: must be 0 or more"),
            "{err}"
        );
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
    fn a_batch_without_a_timeout_says_so() {
        // Without defaults, a batch without a timeout says so.
        let err = parse(&REAL.replace("defaults:\n  timeout: 2h\n", "defaults:\n")).unwrap_err();
        assert!(
            err.contains("batches.e2e: missing required key `timeout`"),
            "{err}"
        );
    }
}
