//! `image build`: from an image's recipe to a verified image in the engine.
//!
//! A Dockerfile's base images must already be local; its folder is packed as the build
//! context, and the engine's build is labelled with the lockset, normalised and loaded
//! ([`super::build`]), twice without the cache under `--check`. A Nix flake attribute is
//! built by `nix build` and the archive it makes loaded ([`super::load`]). Either way
//! the image is held to the manifest's pin and verified against the source's lockset.
//!
//! Nothing here prints: the command shows what [`build`] reports through [`Progress`]
//! as it goes, and what it returns ([`BuildOutcome`]).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::build::BuildInputs;
use super::build_context::{self, BuildContextError};
use super::lockset::{self, Lockset};
use super::{ImageError, ImageId, PinnedId, Verified};
use crate::engine::{Engine, EngineError, EngineInfo};
use crate::exit::Failure;

/// How an image is made.
#[derive(Debug, Clone, Copy)]
pub enum Recipe<'a> {
    /// A Dockerfile; its folder is the build context.
    Dockerfile(&'a Path),
    /// A flake attribute for `nix build`, which makes a docker-archive (or a script
    /// that streams one).
    Nix(&'a str),
}

/// What `image build` is asked to build, all of it from the manifest but `check`.
pub struct BuildRequest<'a> {
    /// The image's name in the manifest.
    pub name: &'a str,
    pub recipe: Recipe<'a>,
    /// The source's lockset: the labels a Dockerfile build gets, and what every image
    /// is verified against.
    pub source: &'a Lockset,
    /// The ID the manifest pins for the image.
    pub pin: PinnedId<'a>,
    /// The project's name, in the tag a Dockerfile build gets.
    pub project: &'a str,
    /// The manifest's folder: `nix build` runs there.
    pub dir: &'a Path,
    /// `--check`: build a Dockerfile twice without the cache, and compare.
    pub check: bool,
    /// A Dockerfile's build arguments file: its path, and as the manifest names it.
    pub build_args: Option<(&'a Path, &'a str)>,
}

/// What happens while an image is built, in order, for the command to show.
pub enum Progress<'a> {
    /// The engine answered, and is this one.
    Engine(&'a EngineInfo),
    /// A base image named through a build argument: whether it is local is not checked.
    BaseNotChecked(&'a str),
    /// A base image named by a tag: the lockset does not cover what it names.
    BaseByTag(&'a str),
    /// The engine is about to build the Dockerfile (twice, under `--check`).
    Building {
        dockerfile: &'a Path,
        twice: bool,
        /// The lockset digest the image is labelled with.
        lockset: &'a str,
        /// Every file time the build adds is set to this, which came from `epoch_from`.
        epoch: u64,
        epoch_from: &'a str,
    },
    /// The build context is packed: this many bytes go to the engine (per build).
    Context { bytes: u64 },
    /// The builder's output, or what the build goes through after it.
    Stage(super::build::Stage<'a>),
    /// The engine names the built image by another ID than its config digest (a
    /// containerd image store names images by their manifest digest).
    EngineId {
        engine_id: &'a ImageId,
        config_digest: &'a ImageId,
    },
    /// What builds killed before they could clean up had left was removed: their
    /// images and scratch folders.
    LeftoversRemoved { images: usize, folders: usize },
    /// `nix build` of this attribute starts.
    NixBuild(&'a str),
    /// The engine loaded this image; it is verified next.
    Loaded(&'a ImageId),
}

/// A built image, or the images a Nix build's archive held, each verified.
pub struct BuildOutcome {
    /// The engine that built or loaded them.
    pub engine: EngineInfo,
    pub images: Vec<Verified>,
}

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    /// `--check` of a Nix recipe, whose builds Nix itself checks.
    #[error(
        "--check builds a Dockerfile twice; image `{image}` is a Nix recipe, whose builds Nix itself checks: nix build --rebuild {attr}"
    )]
    NixCheck { image: String, attr: String },
    #[error("image.dockerfile {}: cannot read: {source}", .path.display())]
    DockerfileUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Epoch(#[from] super::build::BadEpoch),
    #[error(
        "image.nix ({attr}) needs Nix, and `nix` is not on PATH: install Nix with flakes enabled, or build with image.dockerfile"
    )]
    NixMissing { attr: String },
    /// `nix`, or the script a Nix build made, could not be started or waited for.
    #[error("cannot run {}: {source}", .program.display())]
    CannotRun {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "`nix build {attr}` failed ({status}; {version}; {})",
        nix_hint(version)
    )]
    NixFailed {
        attr: String,
        status: std::process::ExitStatus,
        /// What `nix --version` says, or that it could not be asked.
        version: String,
    },
    #[error("`nix build --json {attr}` named no output path ({version})")]
    NixNoOutput { attr: String, version: String },
    /// The archive a Nix build made cannot be opened.
    #[error("cannot open {}: {source}", .path.display())]
    OutputUnopenable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The script a Nix build made could not be waited for.
    #[error("{}: {source}", .path.display())]
    OutputLost {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The script a Nix build made, which streams the archive, failed.
    #[error("{} failed ({status})", .path.display())]
    OutputFailed {
        path: PathBuf,
        status: std::process::ExitStatus,
    },
    #[error(transparent)]
    BuildArgs(#[from] super::build_args::BuildArgsError),
    #[error(transparent)]
    BuildContext(#[from] BuildContextError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl crate::error::ErrorKind for RecipeError {
    fn failure(&self) -> Failure {
        match self {
            RecipeError::NixCheck { .. } | RecipeError::DockerfileUnreadable { .. } => {
                Failure::Usage
            }
            RecipeError::Epoch(_) => Failure::Usage,
            RecipeError::NixMissing { .. }
            | RecipeError::CannotRun { .. }
            | RecipeError::NixFailed { .. }
            | RecipeError::NixNoOutput { .. }
            | RecipeError::OutputUnopenable { .. }
            | RecipeError::OutputLost { .. }
            | RecipeError::OutputFailed { .. } => Failure::Infra,
            RecipeError::BuildArgs(e) => e.failure(),
            RecipeError::BuildContext(e) => e.failure(),
            RecipeError::Image(e) => e.failure(),
            RecipeError::Engine(e) => e.failure(),
        }
    }

    /// Lines to print under the headline: what to do about it.
    fn details(&self) -> &[String] {
        match self {
            RecipeError::Image(e) => e.details(),
            _ => &[],
        }
    }
}

/// Builds the image `request` names, loads it, holds it to its pin and verifies it.
pub fn build(
    request: &BuildRequest<'_>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<BuildOutcome, RecipeError> {
    match request.recipe {
        Recipe::Dockerfile(dockerfile) => build_dockerfile(request, dockerfile, progress),
        Recipe::Nix(attr) if request.check => Err(RecipeError::NixCheck {
            image: request.name.to_string(),
            attr: attr.to_string(),
        }),
        Recipe::Nix(attr) => build_nix(request, attr, progress),
    }
}

/// Connects to the engine and reports which it is.
fn connect(progress: &mut dyn FnMut(Progress<'_>)) -> Result<(Engine, EngineInfo), EngineError> {
    let engine = Engine::connect()?;
    let info = engine.info()?;
    progress(Progress::Engine(&info));
    Ok((engine, info))
}

fn build_dockerfile(
    request: &BuildRequest<'_>,
    dockerfile: &Path,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<BuildOutcome, RecipeError> {
    let text = std::fs::read_to_string(dockerfile).map_err(|source| {
        RecipeError::DockerfileUnreadable {
            path: dockerfile.to_path_buf(),
            source,
        }
    })?;
    let context_dir = dockerfile.parent().unwrap_or(Path::new(".")).to_path_buf();
    let name = dockerfile
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("Dockerfile")
        .to_string();
    let bases = super::dockerfile::bases(&text);
    let build_args = match request.build_args {
        Some((path, rel)) => super::build_args::read(path, rel, request.source, &text)?,
        None => HashMap::new(),
    };
    // Packed now so a bad context stops us before the engine is asked anything; again
    // for a second build.
    let packed = build_context::pack(&context_dir, &name)?;
    let context_bytes = packed.metadata().map_or(0, |m| m.len());
    let first_context = std::cell::RefCell::new(Some(packed));
    let context = || -> Result<std::fs::File, ImageError> {
        match first_context.borrow_mut().take() {
            Some(f) => Ok(f),
            None => build_context::pack(&context_dir, &name)
                .map_err(|e| ImageError::refused(e.to_string())),
        }
    };
    let source = request.source;
    let labels = HashMap::from([
        (lockset::LABEL_DIGEST.to_string(), source.digest.clone()),
        (lockset::LABEL_FILES.to_string(), source.text.clone()),
    ]);
    let (epoch, epoch_from) = super::build::source_date_epoch()?;
    let (engine, info) = connect(progress)?;
    let left = super::scratch::sweep_dead(&engine);
    if left.images + left.folders > 0 {
        progress(Progress::LeftoversRemoved {
            images: left.images,
            folders: left.folders,
        });
    }
    let base_layers = local_base_layers(&engine, &bases, dockerfile, progress)?;
    progress(Progress::Building {
        dockerfile,
        twice: request.check,
        lockset: &source.digest,
        epoch,
        epoch_from: &epoch_from,
    });
    progress(Progress::Context {
        bytes: context_bytes,
    });
    let tag = tag_for(request.project, source);
    let inputs = BuildInputs {
        context: &context,
        dockerfile: &name,
        labels: &labels,
        build_args: &build_args,
        tag: &tag,
        epoch,
        base_layers,
    };
    let mut on_stage = |stage: super::build::Stage<'_>| progress(Progress::Stage(stage));
    let built = if request.check {
        super::build::check(&engine, &inputs, &mut on_stage)?
    } else {
        super::build::build(&engine, &inputs, &mut on_stage)?
    };
    if built.engine_id != built.id {
        progress(Progress::EngineId {
            engine_id: &built.engine_id,
            config_digest: &built.id,
        });
    }
    request.pin.check(&built.id)?;
    let verified = super::verify(&engine, &built.engine_id, source)?;
    Ok(BuildOutcome {
        engine: info,
        images: vec![verified],
    })
}

/// The layers of a Dockerfile's base images, each of which must be local: the classic
/// builder pulls a missing base image; cibox never pulls.
fn local_base_layers(
    engine: &Engine,
    bases: &[String],
    dockerfile: &Path,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<HashSet<String>, RecipeError> {
    let mut base_layers = HashSet::new();
    for base in bases {
        if base.eq_ignore_ascii_case("scratch") {
            continue;
        }
        if base.contains('$') {
            progress(Progress::BaseNotChecked(base));
            continue;
        }
        match engine.inspect(base)? {
            Some(found) => base_layers.extend(found.layers),
            None => {
                return Err(ImageError::refused(format!(
                    "{}: base image `{base}` is not present locally and cibox never pulls; load it first (docker load) or build FROM scratch",
                    dockerfile.display()
                ))
                .into());
            }
        }
        if !base.starts_with("sha256:") {
            progress(Progress::BaseByTag(base));
        }
    }
    Ok(base_layers)
}

/// A tag keeps the image from being "dangling" (and so from `docker image prune`);
/// cibox itself never selects images by it.
fn tag_for(project: &str, source: &Lockset) -> String {
    let (repo, tag) = tag_parts(project, &source.digest);
    format!("{repo}:{tag}")
}

/// The name cibox gives an image of `project` built from the lockset `digest`
/// (`cibox/PROJECT`, `lockset-` and 12 hex digits), so the engine never prunes it as
/// dangling.
pub fn tag_parts(project: &str, digest: &str) -> (String, String) {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    (
        format!("cibox/{project}"),
        format!("lockset-{}", &hex[..12.min(hex.len())]),
    )
}

fn build_nix(
    request: &BuildRequest<'_>,
    attr: &str,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<BuildOutcome, RecipeError> {
    let path = nix_build(attr, request.dir, progress)?;
    let (engine, info) = connect(progress)?;
    let loaded = load_nix_output(&engine, &path)?;
    let ids = super::load::loaded_ids(&engine, loaded)?;
    let images =
        super::load::verify_loaded(&engine, &ids, request.source, &request.pin, &mut |id| {
            progress(Progress::Loaded(id))
        })?;
    Ok(BuildOutcome {
        engine: info,
        images,
    })
}

/// Runs `nix build` of `attr` in `dir` (its output on our stderr) and returns the path
/// it built.
fn nix_build(
    attr: &str,
    dir: &Path,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<PathBuf, RecipeError> {
    let nix = crate::util::which("nix").ok_or_else(|| RecipeError::NixMissing {
        attr: attr.to_string(),
    })?;
    progress(Progress::NixBuild(attr));
    // `--json` (Nix 2.4 and later) rather than `--print-out-paths` (2.9): Debian 12's Nix
    // is 2.8. The features are switched on here, so no nix.conf has to.
    let out = std::process::Command::new(&nix)
        .args([
            "--extra-experimental-features",
            "nix-command flakes",
            "build",
            "--no-link",
            "--json",
            attr,
        ])
        .current_dir(dir)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|source| RecipeError::CannotRun {
            program: nix.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(RecipeError::NixFailed {
            attr: attr.to_string(),
            status: out.status,
            version: nix_version(&nix),
        });
    }
    built_path(&out.stdout).ok_or_else(|| RecipeError::NixNoOutput {
        attr: attr.to_string(),
        version: nix_version(&nix),
    })
}

/// The output path `nix build --json` names: `[{"outputs": {"out": PATH}, …}]`.
fn built_path(json: &[u8]) -> Option<PathBuf> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    let outputs = v.as_array()?.last()?.get("outputs")?.as_object()?;
    let path = outputs
        .get("out")
        .or_else(|| outputs.values().next())?
        .as_str()?;
    Some(PathBuf::from(path))
}

/// `nix (Nix) 2.8.0`, or that it could not be asked.
/// What to say after a failed `nix build`: Nix's own message (above) says why, unless
/// this Nix is too old for flakes (or would not say its version).
fn nix_hint(version: &str) -> &'static str {
    // `nix (Nix) 2.8.0`
    let number = version.rsplit(' ').next().unwrap_or_default();
    let mut parts = number.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) if (major, minor) >= (2, 4) => "Nix said why above",
        _ => "cibox needs Nix 2.4 or later, with flakes",
    }
}

fn nix_version(nix: &Path) -> String {
    std::process::Command::new(nix)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "its version unknown".into())
}

/// Loads what a Nix build made: an archive, or a script that streams one.
fn load_nix_output(engine: &Engine, path: &Path) -> Result<Vec<String>, RecipeError> {
    if !crate::util::is_executable_file(path) {
        let f = std::fs::File::open(path).map_err(|source| RecipeError::OutputUnopenable {
            path: path.to_path_buf(),
            source,
        })?;
        return Ok(engine.load(Box::new(f))?);
    }
    // streamLayeredImage: a script that writes the archive to stdout.
    let mut child = std::process::Command::new(path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|source| RecipeError::CannotRun {
            program: path.to_path_buf(),
            source,
        })?;
    let stdout = child.stdout.take().expect("piped");
    let loaded = engine.load(Box::new(stdout));
    if loaded.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().map_err(|source| RecipeError::OutputLost {
        path: path.to_path_buf(),
        source,
    })?;
    let loaded = loaded?;
    if !status.success() {
        return Err(RecipeError::OutputFailed {
            path: path.to_path_buf(),
            status,
        });
    }
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_nix_build_blames_the_version_only_when_it_is_too_old() {
        assert_eq!(nix_hint("nix (Nix) 2.8.0"), "Nix said why above");
        assert_eq!(nix_hint("nix (Nix) 2.24.10"), "Nix said why above");
        assert_eq!(
            nix_hint("nix (Nix) 2.3.16"),
            "cibox needs Nix 2.4 or later, with flakes"
        );
        assert_eq!(
            nix_hint("its version unknown"),
            "cibox needs Nix 2.4 or later, with flakes"
        );
    }
}
