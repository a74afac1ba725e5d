//! `cibox image build` for a Dockerfile: the engine builds (with its BuildKit, or the
//! classic builder where BuildKit is missing), cibox normalises what it built
//! ([`super::normalise`]) and loads that, so the ID follows from the inputs; and
//! `--check` builds twice without the cache to prove it.

use std::collections::HashMap;
use std::path::Path;

use super::normalise::{self, Normalised};
use super::scratch::{BuildScratch, RAW_TAG, StepImages};
use super::{ImageError, ImageId};
use crate::engine::{BuildEvent, BuildSecret, Engine};
use crate::mask::{Hidden, MaskStream, Masker};

/// Which of the engine's builders builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builder {
    /// The engine's BuildKit (`RUN --mount`, stages built only as the target needs).
    BuildKit,
    /// The classic builder, where BuildKit is missing.
    Classic,
}

/// What a Dockerfile build needs, the same for each build of a check.
pub struct BuildInputs<'a> {
    /// Packs the build context afresh (a tar file) for each build.
    pub context: &'a dyn Fn() -> Result<std::fs::File, ImageError>,
    /// The Dockerfile's path in the context.
    pub dockerfile: &'a str,
    pub labels: &'a HashMap<String, String>,
    /// `ARG` values, from the image's build arguments file, and proxy arguments.
    pub build_args: &'a HashMap<String, String>,
    /// Where the image's name goes: it is named `REPOSITORY:id-<hex of its ID>`.
    pub repository: &'a str,
    /// The stage to build; the last one when `None`.
    pub target: Option<&'a str>,
    /// What `RUN --mount=type=secret` steps may mount (BuildKit only).
    pub secrets: &'a [BuildSecret],
    /// What the host gives the build that is never shown or kept: the secrets' values
    /// and the proxies' credentials. Masked in what the build prints, and an image
    /// that holds one is refused.
    pub hidden: &'a [Hidden],
    pub builder: Builder,
    /// Every file time of the layers the build adds is set to this (seconds since 1970).
    pub epoch: u64,
    /// The layers of the base images (`sha256:` diff IDs), kept as they are.
    pub base_layers: std::collections::HashSet<String>,
    /// The network the steps get (the build request's `networkmode`); `None`: the
    /// engine's default.
    pub network: Option<&'static str>,
    /// Built without the engine's cache (an untrusted build whose steps mount a secret:
    /// the cache does not key a step on a secret's value, so it would hand this build
    /// what another build's secret wrote).
    pub fresh: bool,
}

/// What a build goes through after the engine's builder, for the command to show.
pub enum Stage<'a> {
    /// A step of the build started (BuildKit's name for it), or was taken from the
    /// cache.
    Step { name: &'a str, cached: bool },
    /// Output of the engine's builder, as it comes (what is hidden masked; the classic
    /// builder's in whole lines).
    Output(&'a str),
    /// The engine's build is one this user normalised before, into this image (which
    /// is in the engine): nothing is saved, written or loaded.
    Known { id: &'a ImageId },
    /// The engine's build is being saved, to be written again.
    Saving,
    /// The saved build (this many bytes) is being normalised.
    Normalising { bytes: u64 },
    /// Normalising dropped this many entries that restated the layers below them
    /// (see `normalise::restated`).
    Restated { entries: usize },
    /// The normalised image (this many bytes) is being loaded into the engine.
    Loading { bytes: u64 },
    /// The engine's build cache named a layer the engine no longer has (its known bug,
    /// moby/moby#41595, this error): the build runs once more, without the cache.
    Uncached { error: &'a str },
}

/// A normalised build, loaded into the engine.
pub struct Built {
    pub id: ImageId,
    /// The engine's own ID for it where that is not the config digest (a containerd
    /// image store names images by their manifest digest).
    pub engine_id: ImageId,
}

/// The engine's build (from the cache unless `no_cache`), tagged `cibox-raw-build:…`
/// (the tag written in `scratch`'s journal first, so a killed build's is removed by the
/// next): its ID and that tag. A BuildKit build that fails on a layer the engine's
/// cache named but lost runs once more, without the cache.
fn engine_build(
    engine: &Engine,
    inputs: &BuildInputs<'_>,
    no_cache: bool,
    scratch: &mut BuildScratch<'_>,
    mask: &Masker,
    on: &mut dyn FnMut(Stage<'_>),
) -> Result<(String, String), ImageError> {
    match engine_build_once(engine, inputs, no_cache, scratch, mask, on) {
        Err(e) if !no_cache && matches!(inputs.builder, Builder::BuildKit) && lost_layer(&e) => {
            on(Stage::Uncached {
                error: &e.to_string(),
            });
            engine_build_once(engine, inputs, true, scratch, mask, on)
        }
        other => other,
    }
}

/// Whether the engine's build failed on a layer its own cache named but it no longer
/// has (`failed to get layer sha256:…: layer does not exist`, moby/moby#41595): the
/// engine's bug, seen where builds and image removals share one engine. A build that
/// does not use the cache does not meet it.
fn lost_layer(e: &ImageError) -> bool {
    let text = e.to_string();
    text.contains("failed to get layer") && text.contains("layer does not exist")
}

/// [`engine_build`], once.
fn engine_build_once(
    engine: &Engine,
    inputs: &BuildInputs<'_>,
    no_cache: bool,
    scratch: &mut BuildScratch<'_>,
    mask: &Masker,
    on: &mut dyn FnMut(Stage<'_>),
) -> Result<(String, String), ImageError> {
    let context = (inputs.context)()?;
    // The raw build gets a tag of its own, never the lockset tag: removing it must not
    // take that tag from the image an earlier build left. Nothing else of this build is
    // on it: the engine's cache then gives the same raw build the same ID.
    let random = crate::util::random_hex(8).map_err(|e| crate::engine::EngineError::Io {
        action: "naming the raw build".into(),
        reason: e.to_string(),
    })?;
    let raw_tag = format!("{RAW_TAG}:{random}");
    scratch.made(&raw_tag);
    let spec = crate::engine::BuildSpec {
        dockerfile: inputs.dockerfile,
        labels: inputs.labels,
        build_args: inputs.build_args,
        tag: &raw_tag,
        no_cache,
        target: inputs.target,
        network: inputs.network,
    };
    let raw =
        match inputs.builder {
            Builder::BuildKit => engine.build_kit(
                context,
                &spec,
                (inputs.secrets, mask),
                |event| match event {
                    BuildEvent::Step { name, cached } => on(Stage::Step { name, cached }),
                    BuildEvent::Output(text) => on(Stage::Output(text)),
                },
            ),
            Builder::Classic => {
                let mut steps = StepImages::default();
                let mut lines = Lines {
                    stream: mask.stream(),
                    pending: Vec::new(),
                };
                let built = engine.build(context, &spec, |out| {
                    steps.feed(out, &mut |id| scratch.made(id));
                    if let Some(text) = lines.push(out.as_bytes()) {
                        on(Stage::Output(&text));
                    }
                });
                if let Some(text) = lines.finish() {
                    on(Stage::Output(&text));
                }
                built
            }
        }
        .map_err(|e| mask_error(e, mask))?;
    scratch.made(&raw);
    let layers = engine.inspect(&raw)?.map(|f| f.layers).unwrap_or_default();
    if let Some(layer) = super::known::refused_layer(&layers) {
        return Err(ImageError::Refused {
            message: format!(
                "the engine's build cache gave this build a layer ({layer}) of a build refused for holding a secret's value or a proxy's credentials; it was not kept"
            ),
            details: vec![
                "the engine's cache does not key a step on a secret's value: clear it (docker builder prune) and build again".into(),
            ],
        });
    }
    Ok((raw, raw_tag))
}

/// Saves the raw build and normalises it (written in `into`, a folder of `scratch`).
/// The raw build stays (tagged) until its normalised image is loaded, which names the
/// base layers it holds without carrying them; every image the build made is
/// `scratch`'s to remove.
fn normalise_raw(
    engine: &Engine,
    inputs: &BuildInputs<'_>,
    raw: &str,
    into: &Path,
    mask: &Masker,
    on: &mut dyn FnMut(Stage<'_>),
) -> Result<Normalised, ImageError> {
    let saved = into.join("built.tar");
    on(Stage::Saving);
    let result = super::saved::save(engine, raw, &inputs.base_layers, &saved)
        .map_err(ImageError::from)
        .and_then(|s| {
            on(Stage::Normalising { bytes: s.bytes });
            normalise::normalise(
                &saved,
                inputs.epoch,
                inputs.repository,
                (&inputs.base_layers, &s.passed_over),
                (inputs.hidden, mask),
                into,
            )
            .map_err(|e| {
                // It may name an entry of a layer, or a record of one.
                let why = mask.mask_str(&e.to_string()).into_owned();
                match e {
                    // Writing the normalised archive here: the host's failure.
                    super::archive::ArchiveError::Io(..) => ImageError::NormaliseHost(why),
                    _ => ImageError::Normalise(why),
                }
            })
        })
        .and_then(|n| {
            if n.restated > 0 {
                on(Stage::Restated {
                    entries: n.restated,
                });
            }
            if n.secrets_found.is_empty() {
                return Ok(n);
            }
            // Only the layers that hold it: the others are innocent, and shared.
            super::known::refuse_layers(&n.secret_layers);
            Err(kept_secrets(&n.secrets_found))
        });
    let _ = std::fs::remove_file(&saved);
    result
}

/// Builds once (from the cache unless `no_cache`) and normalises.
fn build_once(
    engine: &Engine,
    inputs: &BuildInputs<'_>,
    no_cache: bool,
    scratch: &mut BuildScratch<'_>,
    into: &Path,
    on: &mut dyn FnMut(Stage<'_>),
) -> Result<Normalised, ImageError> {
    let mask = Masker::of(inputs.hidden);
    let (raw, _) = engine_build(engine, inputs, no_cache, scratch, &mask, on)?;
    normalise_raw(engine, inputs, &raw, into, &mask, on)
}

/// Loads a normalised archive and returns its ID as the engine names it.
fn load(
    engine: &Engine,
    n: &Normalised,
    on: &mut dyn FnMut(Stage<'_>),
) -> Result<Built, ImageError> {
    let file = n.archive.reopen().map_err(|source| ImageError::Host {
        action: "reading the normalised archive",
        source,
    })?;
    on(Stage::Loading {
        bytes: file.metadata().map_or(0, |m| m.len()),
    });
    let loaded = engine.load(Box::new(file))?;
    // A tagged archive reports the tag; its ID is what the engine resolves it to.
    let mut engine_id = None;
    for item in &loaded {
        if let Some(found) = engine.inspect(item)? {
            engine_id = Some(found.id);
        }
    }
    let engine_id = engine_id.ok_or_else(|| ImageError::NormalisedVanished {
        loaded: loaded.clone(),
    })?;
    let engine_id = ImageId::parse(&engine_id).map_err(ImageError::NotAnId)?;
    Ok(Built {
        id: n.id.clone(),
        engine_id,
    })
}

/// The build's scratch: a folder for the saved and normalised archives, and the images
/// it makes, removed with it.
fn scratch(engine: &Engine) -> Result<BuildScratch<'_>, ImageError> {
    BuildScratch::new(engine).map_err(|source| ImageError::Host {
        action: "temporary folder",
        source,
    })
}

/// `image build`: one build, normalised and loaded.
pub fn build(
    engine: &Engine,
    inputs: &BuildInputs<'_>,
    on: &mut dyn FnMut(Stage<'_>),
) -> Result<Built, ImageError> {
    let mut scratch = scratch(engine)?;
    let into = scratch.path().to_path_buf();
    let mask = Masker::of(inputs.hidden);
    let (raw, raw_tag) = engine_build(engine, inputs, inputs.fresh, &mut scratch, &mask, on)?;
    let builder = format!("{:?}", inputs.builder);
    let key = super::known::key(
        &raw,
        &super::known::Normalising {
            epoch: inputs.epoch,
            repository: inputs.repository,
            builder: &builder,
            bases: &inputs.base_layers,
            hidden: inputs.hidden,
        },
    );
    if let Some((id, engine_id)) = super::known::lookup(engine, &key, inputs.labels) {
        let _ = engine.remove_image(&raw_tag);
        // The name a load gives it (`REPOSITORY:id-<hex>`), should it have lost it.
        let hex = id.as_str().trim_start_matches("sha256:");
        engine.tag(engine_id.as_str(), inputs.repository, &format!("id-{hex}"))?;
        on(Stage::Known { id: &id });
        return Ok(Built { id, engine_id });
    }
    let loaded =
        normalise_raw(engine, inputs, &raw, &into, &mask, on).and_then(|n| load(engine, &n, on));
    // The raw build goes whatever happened: only the normalised image is kept. By its
    // tag: an image that was already there under other names (a cached build) only
    // loses this one. (The engine refuses while a container uses it.)
    let _ = engine.remove_image(&raw_tag);
    let built = loaded?;
    super::known::record(&key, &built.id, &built.engine_id);
    Ok(built)
}

/// `image build --check`: two builds without the cache; the first is loaded when they
/// agree, and when they do not, what differs is named.
pub fn check(
    engine: &Engine,
    inputs: &BuildInputs<'_>,
    on: &mut dyn FnMut(Stage<'_>),
) -> Result<Built, ImageError> {
    let mut scratch = scratch(engine)?;
    let first_dir = scratch.path().join("1");
    let second_dir = scratch.path().join("2");
    for d in [&first_dir, &second_dir] {
        std::fs::create_dir(d).map_err(|source| ImageError::Host {
            action: "temporary folder",
            source,
        })?;
    }
    let first = build_once(engine, inputs, true, &mut scratch, &first_dir, on)?;
    let second = build_once(engine, inputs, true, &mut scratch, &second_dir, on)?;
    if first.id != second.id {
        let mut details = normalise::differences(&first, &second, 20, &Masker::of(inputs.hidden));
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
    load(engine, &first, on)
}

/// The refusal of an image that holds what the host gave the build: where each is
/// (the first [`MAX_PLACES`]), and what a secret and a proxy are for.
fn kept_secrets(found: &[String]) -> ImageError {
    let mut details: Vec<String> = found.iter().take(MAX_PLACES).cloned().collect();
    if found.len() > MAX_PLACES {
        details.push(format!("… and {} more", found.len() - MAX_PLACES));
    }
    let secret = found.iter().any(|f| f.starts_with("secret "));
    let proxy = found
        .iter()
        .any(|f| f.starts_with("the credentials of proxy"));
    if secret {
        details.push("a secret is for a step to read where it is mounted (RUN --mount=type=secret), never to write into the image".into());
    }
    if proxy {
        details.push("a proxy's credentials are for the build's steps to reach the network, never to write into the image (an ARG that declares a proxy variable puts its value in the image's history)".into());
    }
    let what = match (secret, proxy) {
        (true, true) => "a secret's value and a proxy's credentials are",
        (false, true) => "a proxy's credentials are",
        _ => "a secret's value is",
    };
    ImageError::Refused {
        message: format!("{what} in the built image; it was not kept"),
        details,
    }
}

/// The most places a refusal names where a secret was found.
const MAX_PLACES: usize = 20;

/// The classic builder's output, masked, let out in whole lines (its `Step N/M` lines
/// are read from it).
struct Lines<'m> {
    stream: MaskStream<'m>,
    pending: Vec<u8>,
}

impl Lines<'_> {
    /// Takes the next piece; returns the lines it ends, if any.
    fn push(&mut self, piece: &[u8]) -> Option<String> {
        let shown = self.stream.push(piece);
        self.pending.extend_from_slice(&shown);
        let end = memchr::memrchr(b'\n', &self.pending)?;
        let lines: Vec<u8> = self.pending.drain(..=end).collect();
        Some(String::from_utf8_lossy(&lines).into_owned())
    }

    /// What is left, at the end of the build.
    fn finish(&mut self) -> Option<String> {
        let rest = self.stream.finish();
        self.pending.extend_from_slice(&rest);
        let rest = std::mem::take(&mut self.pending);
        (!rest.is_empty()).then(|| String::from_utf8_lossy(&rest).into_owned())
    }
}

/// An engine's error with what is hidden masked (it may quote a step's output).
fn mask_error(e: crate::engine::EngineError, mask: &Masker) -> ImageError {
    use crate::engine::EngineError as E;
    let m = |reason: String| mask.mask_str(&reason).into_owned();
    let e = match e {
        E::Rejected { action, reason } => E::Rejected {
            action,
            reason: m(reason),
        },
        E::Api { action, reason } => E::Api {
            action,
            reason: m(reason),
        },
        E::Io { action, reason } => E::Io {
            action,
            reason: m(reason),
        },
        E::Unreachable { host, reason } => E::Unreachable {
            host,
            reason: m(reason),
        },
        E::InLines {
            headline,
            details,
            failure,
        } => E::InLines {
            headline: m(headline),
            details: details.into_iter().map(m).collect(),
            failure,
        },
        other => other,
    };
    ImageError::Engine(e)
}

/// The latest epoch an image's `created` can carry (9999-12-31T23:59:59Z).
const MAX_EPOCH: u64 = 253_402_300_799;

/// The default epoch: 1970-01-01T00:00:01Z, the `created` of the flake's images.
pub const DEFAULT_EPOCH: u64 = 1;

/// The time every file a Dockerfile build adds is set to: `SOURCE_DATE_EPOCH` when set,
/// else fixed ([`DEFAULT_EPOCH`]). Not a commit time: a shallow clone (actions/checkout
/// fetches one commit) or a squash or rebase merge gives unchanged lock files another
/// one, and so the image another ID. Returns it and where it came from, or why the
/// variable is wrong.
pub fn source_date_epoch() -> Result<(u64, String), BadEpoch> {
    let Ok(text) = std::env::var("SOURCE_DATE_EPOCH") else {
        return Ok((DEFAULT_EPOCH, "fixed".into()));
    };
    match text.parse::<u64>() {
        Ok(epoch) if epoch <= MAX_EPOCH && !text.starts_with('+') => {
            Ok((epoch, "SOURCE_DATE_EPOCH".into()))
        }
        _ => Err(BadEpoch { text }),
    }
}

/// `SOURCE_DATE_EPOCH` is set, and not a time a build may set files to.
#[derive(Debug, thiserror::Error)]
#[error(
    "SOURCE_DATE_EPOCH=`{text}` is not a whole number of seconds from 0 to {MAX_EPOCH} (the year 9999)"
)]
pub struct BadEpoch {
    /// The variable's value.
    pub text: String,
}
