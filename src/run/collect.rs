//! Test lists a project's code prints (`collect:`), read at run time: each collector runs
//! in a disposable container of its family's image, never on the host. The container is
//! locked down further than a batch's: the invoking user (65534:65534 for root), every
//! capability dropped, no-new-privileges, no network, a read-only root file system, the
//! source read-only at `/src` (its git credentials masked), a 64 MiB `/tmp`, 1 GiB of
//! memory, 256 processes, 2 CPUs, no GPU, no host mount, no device, no variable of the
//! host. It is bounded in time (`collect.timeout`: killed past it) and in output
//! ([`MAX_COLLECT_BYTES`]: killed at one byte more), removed by its ID whatever
//! happened, and what it printed is checked entry by entry
//! ([`crate::manifest::parse_output`]) before the manifest makes batches of it.
//! Families whose collectors are the same command in the same image share one run.

use std::collections::HashMap;
use std::path::Path;

use indexmap::IndexMap;

use crate::engine::{CaptureBounds, CaptureEnd, Engine};
use crate::error::Result;
use crate::exit::Failure;
use crate::labels::{LABEL_OWNER, LABEL_PROJECT};
use crate::manifest::{
    CollectSpec, Collected, CollectedEntry, MAX_COLLECT_BYTES, MAX_ENTRY_GPUS, Manifest, PoolSpec,
};

/// The label that says which family's list a collector container prints.
pub const LABEL_COLLECT: &str = "org.cibox.collect";

/// Why a test list could not be collected.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// The collector, or what it printed, is refused: the project's to fix.
    #[error("{at}batches.{family}.collect: {why}")]
    Refused {
        at: String,
        family: String,
        why: String,
    },
    /// The family's image has no ID to run the collector in.
    #[error(
        "{at}batches.{family}.collect: image `{image}` has no ID to collect the list in: set {var} (or the image's `id`)"
    )]
    NoImage {
        at: String,
        family: String,
        image: String,
        var: String,
    },
    /// The family's image is not in the engine.
    #[error(
        "{at}batches.{family}.collect: image `{image}` ({id}) is not present in the local engine: build or load it before its test lists are collected"
    )]
    ImageMissing {
        at: String,
        family: String,
        image: String,
        id: String,
    },
    /// The source's git configs could not be masked.
    #[error("cannot mask the source's git credentials for a collector: {0}")]
    Mask(#[source] crate::git_mask::MaskError),
    /// The watchdog that removes the collector should cibox die could not start.
    #[error("cannot start the watchdog of a collector's container: {0}")]
    Watchdog(#[source] std::io::Error),
}

impl crate::error::ErrorKind for CollectError {
    fn failure(&self) -> Failure {
        match self {
            CollectError::Refused { .. } | CollectError::NoImage { .. } => Failure::Usage,
            CollectError::ImageMissing { .. } => Failure::ImageRefused,
            CollectError::Mask(_) | CollectError::Watchdog(_) => Failure::Infra,
        }
    }
}

/// Where and with what a collection runs.
pub struct CollectRequest<'a> {
    /// The source, mounted read-only at `/src`.
    pub source: &'a Path,
    /// The image ID asked for (`--image`, `CIBOX_IMAGE`), when the run uses one image.
    pub image: Option<&'a str>,
}

/// The manifest with its collectors' lists made batches (itself when it has no
/// collector, or they are in already).
pub fn collect(m: Manifest, req: &CollectRequest<'_>) -> Result<Manifest> {
    if m.collectors.is_empty() || m.collected.is_some() {
        return Ok(m);
    }
    let engine = Engine::connect()?;
    let masks = crate::git_mask::mask(req.source).map_err(CollectError::Mask)?;
    let bound = gpu_bound(&m);
    // One run per command and image: SGLang's one collector for every suite.
    let mut printed: HashMap<(String, String), Vec<CollectedEntry>> = HashMap::new();
    let mut lists = IndexMap::new();
    for (family, spec) in &m.collectors {
        let id = image_id(&m, family, spec, req.image)?;
        let key = (spec.run.clone(), id.clone());
        if !printed.contains_key(&key) {
            let entries = run_one(
                &m,
                &engine,
                family,
                spec,
                &id,
                req.source,
                &masks.binds,
                &bound,
            )?;
            printed.insert(key.clone(), entries);
        }
        let entries: Vec<CollectedEntry> = printed[&key]
            .iter()
            .filter(|e| spec.suite.is_none() || e.suite == spec.suite)
            .cloned()
            .collect();
        if entries.is_empty() {
            return Err(refused(
                &m,
                family,
                match &spec.suite {
                    Some(s) => format!(
                        "the collector printed no entry of suite `{}`",
                        crate::util::escape(s)
                    ),
                    None => "the collector printed no entry".into(),
                },
            )
            .into());
        }
        lists.insert(family.clone(), entries);
    }
    Ok(m.with_collected(&Collected { lists })?)
}

/// The most GPUs an entry may ask: the pool the host policy (or the manifest) names,
/// else [`MAX_ENTRY_GPUS`]; and whose bound it is, for the refusal.
fn gpu_bound(m: &Manifest) -> (u32, String) {
    match &m.gpu.pool {
        PoolSpec::Devices(d) => (
            d.len() as u32,
            format!(
                "the GPU pool, {}",
                crate::util::count(d.len() as u64, "GPU")
            ),
        ),
        PoolSpec::All => (MAX_ENTRY_GPUS, "the most an entry may ask".into()),
    }
}

/// The refusal of `family`'s list, at its `collect:` in the manifest.
fn refused(m: &Manifest, family: &str, why: String) -> CollectError {
    CollectError::Refused {
        at: at(m, family),
        family: family.to_string(),
        why,
    }
}

/// `FILE:LINE:COL: ` of `family`'s `collect:`.
fn at(m: &Manifest, family: &str) -> String {
    match m.mark_of(&["batches", family, "collect"]) {
        Some(mark) => format!("{}:{mark}: ", m.path.display()),
        None => format!("{}: ", m.path.display()),
    }
}

/// The ID of the image `family`'s collector runs in: `--image`/`CIBOX_IMAGE` when
/// given, else `CIBOX_IMAGE_<NAME>`, else the image's `id`.
fn image_id(m: &Manifest, family: &str, spec: &CollectSpec, asked: Option<&str>) -> Result<String> {
    let var = crate::manifest::image_variable(&spec.image);
    let raw = asked
        .map(str::to_string)
        .or_else(|| std::env::var(&var).ok().filter(|s| !s.is_empty()))
        .or_else(|| m.images.get(&spec.image).and_then(|i| i.id.clone()));
    let Some(raw) = raw else {
        return Err(CollectError::NoImage {
            at: at(m, family),
            family: family.to_string(),
            image: spec.image.clone(),
            var,
        }
        .into());
    };
    let id = crate::image::ImageId::parse(raw.trim())
        .map_err(|why| refused(m, family, format!("image `{}`: {why}", spec.image)))?;
    Ok(id.to_string())
}

/// Runs `family`'s collector in image `id` and reads what it printed.
#[allow(clippy::too_many_arguments)]
fn run_one(
    m: &Manifest,
    engine: &Engine,
    family: &str,
    spec: &CollectSpec,
    id: &str,
    source: &Path,
    masks: &[String],
    bound: &(u32, String),
) -> Result<Vec<CollectedEntry>> {
    if engine.inspect(id)?.is_none() {
        return Err(CollectError::ImageMissing {
            at: at(m, family),
            family: family.to_string(),
            image: spec.image.clone(),
            id: id.to_string(),
        }
        .into());
    }
    // Random: two collections at once (two runners) never take one name.
    let suffix = crate::util::random_hex(4).map_err(|e| crate::engine::EngineError::Io {
        action: "naming a collector's container".into(),
        reason: e.to_string(),
    })?;
    let name = format!(
        "cibox-{}-collect-{}-{suffix}",
        crate::util::sanitize(&m.project),
        crate::util::sanitize(family)
    );
    let body = body(m, family, spec, id, source, masks);
    let bounds = CaptureBounds {
        wall: spec.timeout.0,
        max_stdout: MAX_COLLECT_BYTES,
    };
    // Should cibox die meanwhile (SIGKILL, a signal `batch list` does not catch), the
    // collector's watchdog removes its container, as a batch's does.
    let watchdog =
        super::cleanup::watchdog::Watchdog::start(&name, &[]).map_err(CollectError::Watchdog)?;
    let captured = engine.capture(&name, body, bounds);
    // `capture` removed the container, whatever happened.
    watchdog.dismiss();
    let captured = captured?;
    let last_words = || {
        let tail = String::from_utf8_lossy(&captured.stderr_tail);
        match tail.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(l) => format!("; its last words: `{}`", crate::util::escape(l.trim())),
            None => String::new(),
        }
    };
    match captured.end {
        CaptureEnd::TimedOut => Err(refused(
            m,
            family,
            format!(
                "the collector ran past its timeout, {}: killed",
                spec.timeout
            ),
        )
        .into()),
        CaptureEnd::TooLarge => Err(refused(
            m,
            family,
            format!(
                "the collector printed more than {} MiB, the most a list may take: killed",
                MAX_COLLECT_BYTES >> 20
            ),
        )
        .into()),
        CaptureEnd::Exited(code) if code != Some(0) => Err(refused(
            m,
            family,
            format!(
                "the collector exited with {}{}",
                code.map_or("no exit code the engine could say".into(), |c| c
                    .to_string()),
                last_words()
            ),
        )
        .into()),
        CaptureEnd::Exited(_) => {
            crate::manifest::parse_output(&captured.stdout, (bound.0, &bound.1))
                .map_err(|why| refused(m, family, format!("the collector's output, {why}")).into())
        }
    }
}

/// The collector's container: see the module's doc.
fn body(
    m: &Manifest,
    family: &str,
    spec: &CollectSpec,
    id: &str,
    source: &Path,
    masks: &[String],
) -> bollard::models::ContainerCreateBody {
    let (uid, gid) = match nix::unistd::getuid().as_raw() {
        0 => (65534, 65534),
        uid => (uid, nix::unistd::getgid().as_raw()),
    };
    let binds: Vec<String> = std::iter::once(format!("{}:/src:ro", source.display()))
        .chain(masks.iter().cloned())
        .collect();
    bollard::models::ContainerCreateBody {
        image: Some(id.to_string()),
        user: Some(format!("{uid}:{gid}")),
        entrypoint: Some(vec!["/bin/sh".into(), "-c".into()]),
        cmd: Some(vec![spec.run.clone()]),
        env: Some(vec!["HOME=/tmp".into(), format!("CIBOX_COLLECT={family}")]),
        working_dir: Some("/src".into()),
        network_disabled: Some(true),
        labels: Some(HashMap::from([
            (LABEL_OWNER.to_string(), "cibox".to_string()),
            (LABEL_PROJECT.to_string(), m.project.clone()),
            (LABEL_COLLECT.to_string(), family.to_string()),
        ])),
        host_config: Some(bollard::models::HostConfig {
            binds: Some(binds),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_string(),
                format!("rw,noexec,nosuid,nodev,size=64m,uid={uid},gid={gid},mode=1777"),
            )])),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            network_mode: Some("none".into()),
            init: Some(true),
            pids_limit: Some(256),
            memory: Some(1 << 30),
            memory_swap: Some(1 << 30),
            nano_cpus: Some(cpus() * 1_000_000_000),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The CPUs a collector gets: 2, or the host's when it has fewer (the engine refuses
/// more than the host has).
fn cpus() -> i64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN)
        .ok()
        .flatten()
        .map_or(1, |n| n.clamp(1, 2))
}
