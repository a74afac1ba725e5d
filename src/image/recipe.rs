//! `image build`: from an image's recipe to a verified image in the engine.
//!
//! A Dockerfile's bases (read with the build arguments put in, for the stages its
//! target needs) must be local or named by digest, never pulled by tag; its context (a
//! folder inside the manifest's, by default the Dockerfile's) is packed, and the
//! engine's build (BuildKit, or the classic builder where BuildKit is missing) is
//! labelled with the lockset, normalised and loaded ([`super::build`]), twice without
//! the cache under `--check`. The image is named by its ID, and, once held to its pin
//! and verified, by its lockset. A Nix flake attribute is
//! built by `nix build` and the archive it makes loaded ([`super::load`]). Either way
//! the image is held to the manifest's pin and verified against the source's lockset.
//!
//! Nothing here prints: the command shows what [`build`] reports through [`Progress`]
//! as it goes, and what it returns ([`BuildOutcome`]).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::build::{BuildInputs, Builder};
use super::build_context::{self, BuildContextError};
use super::dockerfile::ImageUse;
use super::lockset::{self, Lockset};
use super::{ImageError, ImageId, PinnedId, Verified};
use crate::engine::{BuildSecret, Engine, EngineError, EngineInfo};
use crate::exit::Failure;

/// How an image is made.
#[derive(Debug, Clone, Copy)]
pub enum Recipe<'a> {
    /// A Dockerfile.
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
    /// A Dockerfile's build context: a folder, and as the manifest names it (`None`:
    /// the Dockerfile's folder).
    pub context: Option<(&'a Path, &'a str)>,
    /// The Dockerfile's stage to build (`None`: its last).
    pub target: Option<&'a str>,
    /// What the Dockerfile's `RUN --mount=type=secret` steps mount.
    pub secrets: &'a [BuildSecret],
}

/// What happens while an image is built, in order, for the command to show.
pub enum Progress<'a> {
    /// The engine answered, and is this one.
    Engine(&'a EngineInfo),
    /// Which builder builds; with the classic builder, why BuildKit does not.
    Builder {
        builder: Builder,
        why_classic: Option<&'a str>,
    },
    /// A base image named by a tag, local as this ID: the lockset does not cover what
    /// the tag names.
    BaseByTag { base: &'a ImageUse, id: &'a str },
    /// A base image named by digest is not local: it is pulled by that digest.
    BasePull(&'a str),
    /// These proxy arguments are taken from the environment (names only: a proxy's
    /// address may carry credentials).
    Proxies(&'a [String]),
    /// A secret was given that no step of the build mounts.
    SecretUnused(&'a str),
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
    /// The Dockerfile or its context, as the manifest names them, cannot be used.
    #[error("image `{image}`: {why}")]
    Recipe { image: String, why: String },
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
            RecipeError::Recipe { .. } => Failure::Usage,
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

/// The most a Dockerfile may hold.
const MAX_DOCKERFILE: u64 = 4 << 20;

/// Where a Dockerfile build's context is, and the Dockerfile in it.
struct Context {
    dir: PathBuf,
    /// The Dockerfile's path in the context, `/`-separated.
    dockerfile: String,
}

/// The build context and the Dockerfile's place in it. Both come from the manifest,
/// which a pull request writes: the context must be a folder inside the manifest's
/// (no link leads out), and the Dockerfile a plain file (not a link) inside it.
fn context(request: &BuildRequest<'_>, dockerfile: &Path) -> Result<Context, RecipeError> {
    let fail = |why: String| RecipeError::Recipe {
        image: request.name.to_string(),
        why,
    };
    let root = request
        .dir
        .canonicalize()
        .map_err(|e| fail(format!("{}: {e}", request.dir.display())))?;
    let (dir, shown) = match request.context {
        Some((dir, shown)) => (dir.to_path_buf(), format!("context `{shown}`")),
        None => (
            dockerfile.parent().unwrap_or(Path::new(".")).to_path_buf(),
            format!("the folder of dockerfile {}", dockerfile.display()),
        ),
    };
    let real = dir
        .canonicalize()
        .map_err(|e| fail(format!("{shown} ({}): {e}", dir.display())))?;
    if !real.starts_with(&root) {
        return Err(fail(format!(
            "{shown} leads out of the manifest's folder (to {}); a build context must lie inside it",
            real.display()
        )));
    }
    if !real.is_dir() {
        return Err(fail(format!("{shown} is not a folder")));
    }
    let parent = dockerfile
        .parent()
        .unwrap_or(Path::new("."))
        .canonicalize()
        .map_err(|e| fail(format!("dockerfile {}: {e}", dockerfile.display())))?;
    let name = dockerfile.file_name().unwrap_or_default();
    let inside = parent.join(name);
    let Ok(rel) = inside.strip_prefix(&real) else {
        return Err(fail(format!(
            "dockerfile {} is not inside the build {shown}; the builder reads it from there",
            dockerfile.display()
        )));
    };
    let rel: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
    Ok(Context {
        dir: real,
        dockerfile: rel.join("/"),
    })
}

/// Reads the Dockerfile: a plain file (not a link), at most [`MAX_DOCKERFILE`].
fn read_dockerfile(path: &Path) -> Result<String, RecipeError> {
    let unreadable = |source| RecipeError::DockerfileUnreadable {
        path: path.to_path_buf(),
        source,
    };
    let (file, md) = crate::util::open_plain(path, false).map_err(|e| {
        unreadable(if e.raw_os_error() == Some(nix::libc::ELOOP) {
            std::io::Error::other("a link; the Dockerfile must be a plain file")
        } else {
            e
        })
    })?;
    if md.len() > MAX_DOCKERFILE {
        return Err(unreadable(std::io::Error::other(format!(
            "over {} MiB",
            MAX_DOCKERFILE >> 20
        ))));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_DOCKERFILE), &mut text)
        .map_err(unreadable)?;
    Ok(text)
}

fn build_dockerfile(
    request: &BuildRequest<'_>,
    dockerfile: &Path,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<BuildOutcome, RecipeError> {
    let text = read_dockerfile(dockerfile)?;
    let ctx = context(request, dockerfile)?;
    let fail = |why: String| RecipeError::Recipe {
        image: request.name.to_string(),
        why,
    };
    let at = |line: usize| format!("{}:{line}", dockerfile.display());
    let file_args = match request.build_args {
        Some((path, rel)) => super::build_args::read(path, rel, request.source, &text)?,
        None => HashMap::new(),
    };
    let needs = super::dockerfile::stages(&text, &file_args)
        .needs(request.target)
        .map_err(|why| fail(format!("target `{}`: {why}", request.target.unwrap_or(""))))?;
    // Proxies from the environment: not in the lockset, and never in the image, which
    // a declared `ARG` would put them in (its history, so its ID).
    let env_proxies = super::build_args::proxies_from_env();
    let declared = super::dockerfile::arg_lines(&text);
    if let Some((name, line)) = declared
        .iter()
        .find(|(n, _)| env_proxies.iter().any(|(p, _)| p == n))
    {
        return Err(fail(format!(
            "{}: the Dockerfile declares `ARG {name}`, and {name} is set in the environment: its value would be in the image's history and so its ID; drop the ARG (the builder takes proxy arguments without one) or unset {name}",
            at(*line)
        )));
    }
    let mut build_args = file_args;
    build_args.extend(env_proxies.iter().cloned());
    let hidden = super::secrets::hidden(request.secrets, &env_proxies);
    // Secrets: every one a step needs is given, and the classic builder takes none.
    for need in needs.secrets.iter().filter(|s| s.required) {
        if !request.secrets.iter().any(|s| s.id == need.id) {
            return Err(fail(format!(
                "{}: a step mounts secret `{}` (required); give it: cibox image build --secret id={},env=VARIABLE (or src=FILE)",
                at(need.line),
                need.id,
                need.id
            )));
        }
    }
    // Packed now so a bad context stops us before the engine is asked anything; again
    // for a second build.
    let packed = build_context::pack(&ctx.dir, &ctx.dockerfile)?;
    let context_bytes = packed.metadata().map_or(0, |m| m.len());
    let first_context = std::cell::RefCell::new(Some(packed));
    let context = || -> Result<std::fs::File, ImageError> {
        match first_context.borrow_mut().take() {
            Some(f) => Ok(f),
            None => build_context::pack(&ctx.dir, &ctx.dockerfile)
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
    let why_classic = engine.buildkit_missing();
    let builder = match why_classic {
        None => Builder::BuildKit,
        Some(_) => Builder::Classic,
    };
    progress(Progress::Builder {
        builder,
        why_classic: why_classic.as_deref(),
    });
    if builder == Builder::Classic && !request.secrets.is_empty() {
        return Err(fail(format!(
            "secrets are mounted by BuildKit only, and the classic builder builds here ({})",
            why_classic.unwrap_or_default()
        )));
    }
    for secret in request.secrets {
        if !needs.secrets.iter().any(|s| s.id == secret.id) {
            progress(Progress::SecretUnused(&secret.id));
        }
    }
    if !env_proxies.is_empty() {
        let names: Vec<String> = env_proxies.iter().map(|(n, _)| n.clone()).collect();
        progress(Progress::Proxies(&names));
    }
    let left = super::scratch::sweep_dead(&engine);
    if left.images + left.folders > 0 {
        progress(Progress::LeftoversRemoved {
            images: left.images,
            folders: left.folders,
        });
    }
    let base_layers = local_bases(&engine, &needs.images, builder, dockerfile, progress)?;
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
    let (repository, lockset_tag) = tag_parts(request.project, &source.digest);
    let inputs = BuildInputs {
        context: &context,
        dockerfile: &ctx.dockerfile,
        labels: &labels,
        build_args: &build_args,
        repository: &repository,
        target: request.target,
        secrets: request.secrets,
        hidden: &hidden,
        builder,
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
    // Only now the lockset's name: a build refused above keeps its own name, and the
    // image that had this one keeps it.
    engine.tag(built.engine_id.as_str(), &repository, &lockset_tag)?;
    Ok(BuildOutcome {
        engine: info,
        images: vec![verified],
    })
}

/// The layers of the images a Dockerfile build takes, each of which must be local or
/// named by digest (then pulled by that digest): never pulled by tag. BuildKit reads
/// an image ID (`FROM sha256:…`) as a Docker Hub name, so with BuildKit a base must
/// be named (by a tag that names a local image, or by digest).
fn local_bases(
    engine: &Engine,
    images: &[ImageUse],
    builder: Builder,
    dockerfile: &Path,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<HashSet<String>, RecipeError> {
    let mut base_layers = HashSet::new();
    for base in images {
        let image = base.image.as_str();
        if image.eq_ignore_ascii_case("scratch") {
            continue;
        }
        let written = if base.written == base.image {
            format!("`{image}`")
        } else {
            format!("`{image}` (written `{}`)", base.written)
        };
        let at = format!("{}:{}", dockerfile.display(), base.line);
        let refused = |message: String, details: Vec<String>| -> RecipeError {
            ImageError::Refused { message, details }.into()
        };
        let by_id = ImageId::parse(image).is_ok();
        if by_id && builder == Builder::BuildKit {
            return Err(refused(
                format!(
                    "{at}: base {written} is an image ID, which BuildKit reads as the Docker Hub image `sha256` and would pull"
                ),
                vec![
                    "name the local image instead: each image cibox builds is named cibox/PROJECT:id-<its ID's hex>, and FROM takes that name (cibox checks it names a local image)".into(),
                    "or pin it by digest: REPOSITORY@sha256:…".into(),
                ],
            ));
        }
        if let Some((named, digest)) = image.split_once('@')
            && engine.inspect(image)?.is_none()
        {
            progress(Progress::BasePull(image));
            // `name:tag@digest` pulls as `name@digest`.
            let repository = match named.rsplit_once(':') {
                Some((r, tag)) if !tag.contains('/') => r,
                _ => named,
            };
            engine.pull(repository, digest)?;
        }
        let Some(found) = engine.inspect(image)? else {
            let by_tag = !image.contains('@') && !by_id;
            return Err(refused(
                format!(
                    "{at}: base {written} is not present locally, and cibox never pulls{}",
                    if by_tag { " by tag" } else { "" }
                ),
                vec![
                    "pin it by digest (REPOSITORY@sha256:…), which cibox pulls by that digest"
                        .into(),
                    "or load it first (cibox image load, docker load), or build FROM scratch"
                        .into(),
                ],
            ));
        };
        if !image.contains('@') && !by_id {
            progress(Progress::BaseByTag {
                base,
                id: &found.id,
            });
        }
        base_layers.extend(found.layers);
    }
    Ok(base_layers)
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
