//! `cibox image build` for a Dockerfile: the engine builds, cibox normalises what it
//! built ([`super::normalize`]) and loads that, so the ID follows from the inputs; and
//! `--check` builds twice without the cache to prove it.

use std::collections::HashMap;
use std::path::Path;

use super::normalize::{self, Normalised};
use super::{ImageError, ImageId};
use crate::engine::Engine;

/// What a Dockerfile build needs, the same for each build of a check.
pub struct BuildInputs<'a> {
    /// Packs the build context afresh (a tar file) for each build.
    pub context: &'a dyn Fn() -> Result<std::fs::File, ImageError>,
    pub dockerfile: &'a str,
    pub labels: &'a HashMap<String, String>,
    pub tag: &'a str,
    /// Every file time of the layers the build adds is set to this (seconds since 1970).
    pub epoch: u64,
    /// The layers of the base images (`sha256:` diff IDs), kept as they are.
    pub base_layers: std::collections::HashSet<String>,
}

/// A normalised build, loaded into the engine.
pub struct Built {
    pub id: ImageId,
    /// The engine's own ID for it where that is not the config digest (a containerd
    /// image store names images by their manifest digest).
    pub engine_id: ImageId,
}

/// Builds once (from the cache unless `no_cache`), normalises, and returns the
/// normalised archive; the engine's raw build is removed.
fn build_once(
    engine: &Engine,
    inputs: &BuildInputs<'_>,
    no_cache: bool,
    scratch: &Path,
    on_output: &mut dyn FnMut(&str),
) -> Result<Normalised, ImageError> {
    let context = (inputs.context)()?;
    let raw = engine.build(
        context,
        inputs.dockerfile,
        inputs.labels,
        inputs.tag,
        no_cache,
        |out| on_output(out),
    )?;
    let saved = scratch.join("built.tar");
    let result = engine
        .save(&raw, &saved)
        .map_err(ImageError::from)
        .and_then(|_| {
            normalize::normalise(
                &saved,
                inputs.epoch,
                inputs.tag,
                &inputs.base_layers,
                scratch,
            )
            .map_err(|e| ImageError::refused(format!("normalising the build: {e}")))
        });
    let _ = std::fs::remove_file(&saved);
    // The raw build goes whatever happened: only the normalised image is kept. (The
    // engine refuses while a container uses it; then it stays, untagged.)
    let _ = engine.remove_image(&raw);
    result
}

/// Loads a normalised archive and returns its ID as the engine names it.
fn load(engine: &Engine, n: &Normalised) -> Result<Built, ImageError> {
    let file = n
        .archive
        .reopen()
        .map_err(|e| ImageError::refused(format!("reading the normalised archive: {e}")))?;
    let loaded = engine.load(Box::new(file))?;
    // A tagged archive reports the tag; its ID is what the engine resolves it to.
    let mut engine_id = None;
    for item in &loaded {
        if let Some(found) = engine.inspect(item)? {
            engine_id = Some(found.id);
        }
    }
    let engine_id = engine_id.ok_or_else(|| {
        ImageError::refused(format!(
            "the engine loaded the normalised image but reported nothing it can find ({loaded:?})"
        ))
    })?;
    let engine_id = ImageId::parse(&engine_id).map_err(ImageError::refused)?;
    Ok(Built {
        id: n.id.clone(),
        engine_id,
    })
}

/// `image build`: one build, normalised and loaded.
pub fn build(
    engine: &Engine,
    inputs: &BuildInputs<'_>,
    on_output: &mut dyn FnMut(&str),
) -> Result<Built, ImageError> {
    let scratch =
        normalize::scratch().map_err(|e| ImageError::refused(format!("temporary folder: {e}")))?;
    let n = build_once(engine, inputs, false, scratch.path(), on_output)?;
    load(engine, &n)
}

/// `image build --check`: two builds without the cache; the first is loaded when they
/// agree, and when they do not, what differs is named.
pub fn check(
    engine: &Engine,
    inputs: &BuildInputs<'_>,
    on_output: &mut dyn FnMut(&str),
) -> Result<Built, ImageError> {
    let scratch =
        normalize::scratch().map_err(|e| ImageError::refused(format!("temporary folder: {e}")))?;
    let first_dir = scratch.path().join("1");
    let second_dir = scratch.path().join("2");
    for d in [&first_dir, &second_dir] {
        std::fs::create_dir(d)
            .map_err(|e| ImageError::refused(format!("temporary folder: {e}")))?;
    }
    let first = build_once(engine, inputs, true, &first_dir, on_output)?;
    let second = build_once(engine, inputs, true, &second_dir, on_output)?;
    if first.id != second.id {
        let mut details = normalize::differences(&first, &second, 20);
        if details.is_empty() {
            details.push("no file or config key differs; the archives' layer order does".into());
        }
        return Err(ImageError::Refused {
            message: format!(
                "not reproducible: two builds from the same inputs gave {} and {}",
                first.id, second.id
            ),
            details,
        });
    }
    load(engine, &first)
}

/// The time every file of a Dockerfile build is clamped to: `SOURCE_DATE_EPOCH` when
/// set, else the commit time of the last commit that touched the lock files (the same
/// in every clone), else 0. Returns it and where it came from.
pub fn source_date_epoch(dir: &Path, locks: &[String]) -> Result<(u64, String), ImageError> {
    if let Ok(text) = std::env::var("SOURCE_DATE_EPOCH") {
        let epoch = text.trim().parse::<u64>().map_err(|_| {
            ImageError::refused(format!(
                "SOURCE_DATE_EPOCH=`{text}` is not a whole number of seconds since 1970"
            ))
        })?;
        return Ok((epoch, "SOURCE_DATE_EPOCH".into()));
    }
    let mut args = vec!["log", "-1", "--format=%ct", "--"];
    let specs: Vec<String> = locks.iter().map(|l| format!(":(glob){l}")).collect();
    args.extend(specs.iter().map(String::as_str));
    match crate::git::text(dir, &args) {
        Ok(out) if !out.trim().is_empty() => {
            let epoch = out.trim().parse::<u64>().map_err(|_| {
                ImageError::refused(format!("git log gave `{out}` as a commit time"))
            })?;
            Ok((epoch, "the last commit of the lock files".into()))
        }
        _ => Ok((0, "fixed (the lock files have no commit)".into())),
    }
}
