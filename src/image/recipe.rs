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
use super::dockerfile::{Dialect, ImageUse, Needs, Reach};
use super::lockset::{self, Lockset};
use super::trust::{BuildGrants, BuildNetwork, BuildScope, BuildTrust, CACHE_NS_ARG};
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
    /// Where the build's cache mounts live, and its trust (the host decides it).
    pub scope: &'a BuildScope,
    /// What its steps get, by its trust (the host's policy).
    pub grants: &'a BuildGrants,
    /// Why a secret the grants do not list is not granted (for the refusal).
    pub not_granted: &'a str,
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
    /// An untrusted build whose steps mount a secret (the first on this line) builds
    /// without the engine's cache, which does not key a step on a secret's value.
    Fresh { line: usize },
    /// A secret was given that no step of the build mounts.
    SecretUnused(&'a str),
    /// The build's cache mounts live in this scope, and its steps get these grants.
    Scope {
        scope: &'a BuildScope,
        grants: &'a BuildGrants,
        project: &'a str,
    },
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
    /// `--secret` gives a secret the host does not grant this build.
    #[error("--secret id={id}: not granted to this build: {why}")]
    SecretNotGranted { id: String, why: String },
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
            RecipeError::SecretNotGranted { .. } => Failure::Usage,
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
            RecipeError::Engine(e) => e.details(),
            _ => &[],
        }
    }
}

/// What to say after a failed `nix build`: Nix's own message (above) says why, unless
/// this Nix is too old for flakes (or would not say its version).
pub(super) fn nix_hint(version: &str) -> &'static str {
    // `nix (Nix) 2.8.0`
    let number = version.rsplit(' ').next().unwrap_or_default();
    let mut parts = number.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) if (major, minor) >= (2, 4) => "Nix said why above",
        _ => "cibox needs Nix 2.4 or later, with flakes",
    }
}

/// Connects to the engine and reports which it is.
pub(super) fn connect(
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<(Engine, EngineInfo), EngineError> {
    let engine = Engine::connect()?;
    let info = engine.info()?;
    progress(Progress::Engine(&info));
    Ok((engine, info))
}

/// The most a Dockerfile may hold.
const MAX_DOCKERFILE: u64 = 4 << 20;

/// Where a Dockerfile build's context is, and the Dockerfile in it.
struct Context {
    /// The manifest's folder, and the context's folder in it (both canonical).
    root: PathBuf,
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
        root,
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

/// What a Dockerfile build settles before the engine is asked anything.
struct Prepared {
    needs: Needs,
    /// The build arguments file's.
    file_args: HashMap<String, String>,
    /// Those, and the proxies of the environment.
    build_args: HashMap<String, String>,
    env_proxies: Vec<(String, String)>,
    /// Where its cache mounts live, and its trust.
    scope: BuildScope,
    /// What its steps get.
    grants: BuildGrants,
}

/// Reads what the build takes (its arguments, stages, proxies) and settles its scope
/// and grants, refusing what the Dockerfile, the arguments or the command line ask that
/// cannot be had.
fn prepare(
    request: &BuildRequest<'_>,
    dockerfile: &Path,
    text: &str,
) -> Result<Prepared, RecipeError> {
    let fail = |why: String| RecipeError::Recipe {
        image: request.name.to_string(),
        why,
    };
    let at = |line: usize| format!("{}:{line}", dockerfile.display());
    let declared = super::dockerfile::declared_args(text, Dialect::CURRENT)
        .map_err(|e| fail(format!("{}: {}", at(e.line), e.why)))?;
    let file_args = match request.build_args {
        Some((path, rel)) => super::build_args::read(path, rel, request.source, &declared)?,
        None => HashMap::new(),
    };
    let env_proxies = super::build_args::proxies_from_env();
    let scope = request.scope.clone();
    let grants = request.grants.clone();
    // Read now as today's BuildKit reads it, so a bad Dockerfile stops us before the
    // engine is asked anything; again once the engine is known, as its own reads it.
    let needs = read_needs(
        request,
        dockerfile,
        text,
        &file_args,
        &env_proxies,
        &grants,
        Dialect::CURRENT,
    )?;
    let mut build_args = file_args.clone();
    build_args.extend(env_proxies.iter().cloned());
    if let Some(secret) = request
        .secrets
        .iter()
        .find(|s| !grants.secrets.allows(&s.id))
    {
        return Err(RecipeError::SecretNotGranted {
            id: secret.id.clone(),
            why: request.not_granted.to_string(),
        });
    }
    Ok(Prepared {
        needs,
        file_args,
        build_args,
        env_proxies,
        scope,
        grants,
    })
}

pub(super) fn build_dockerfile(
    request: &BuildRequest<'_>,
    dockerfile: &Path,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<BuildOutcome, RecipeError> {
    let text = read_dockerfile(dockerfile)?;
    let ctx = context(request, dockerfile)?;
    let Prepared {
        needs,
        file_args,
        mut build_args,
        env_proxies,
        scope,
        grants,
    } = prepare(request, dockerfile, &text)?;
    let hidden = super::secrets::hidden(request.secrets, &env_proxies);
    // Packed now so a bad context stops us before the engine is asked anything; again
    // for a second build.
    let packed = build_context::pack(&ctx.root, &ctx.dir, &ctx.dockerfile)?;
    let context_bytes = packed.metadata().map_or(0, |m| m.len());
    let first_context = std::cell::RefCell::new(Some(packed));
    let context = || -> Result<std::fs::File, ImageError> {
        match first_context.borrow_mut().take() {
            Some(f) => Ok(f),
            None => {
                build_context::pack(&ctx.root, &ctx.dir, &ctx.dockerfile).map_err(ImageError::from)
            }
        }
    };
    let source = request.source;
    let labels = HashMap::from([
        (lockset::LABEL_DIGEST.to_string(), source.digest.clone()),
        (lockset::LABEL_FILES.to_string(), source.text.clone()),
    ]);
    let (epoch, epoch_from) = super::build::source_date_epoch()?;
    let (engine, info) = connect(progress)?;
    let dialect = Dialect::of_api(&info.api_version);
    let needs = if dialect == Dialect::CURRENT {
        needs
    } else {
        read_needs(
            request,
            dockerfile,
            &text,
            &file_args,
            &env_proxies,
            &grants,
            dialect,
        )?
    };
    let builder = choose_builder(request, &engine, progress)?;
    if builder == Builder::BuildKit {
        build_args.insert(CACHE_NS_ARG.to_string(), scope.namespace.clone());
    }
    progress(Progress::Scope {
        scope: &scope,
        grants: &grants,
        project: request.project,
    });
    announce(request, &needs, &env_proxies, &engine, progress);
    let fresh = scope.trust == BuildTrust::Untrusted
        && builder == Builder::BuildKit
        && !needs.secrets.is_empty()
        && !request.check;
    if fresh {
        progress(Progress::Fresh {
            line: needs.secrets[0].line,
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
        network: grants.network_mode(),
        fresh,
    };
    let mut on_stage = |stage: super::build::Stage<'_>| progress(Progress::Stage(stage));
    let built = if request.check {
        super::build::check(&engine, &inputs, &mut on_stage)
    } else {
        super::build::build(&engine, &inputs, &mut on_stage)
    }
    .map_err(ImageError::in_lines)?;
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

/// Which of the engine's builders builds (said), refusing secrets where it is the
/// classic one.
fn choose_builder(
    request: &BuildRequest<'_>,
    engine: &Engine,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Builder, RecipeError> {
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
        return Err(RecipeError::Recipe {
            image: request.name.to_string(),
            why: format!(
                "secrets are mounted by BuildKit only, and the classic builder builds here ({})",
                why_classic.unwrap_or_default()
            ),
        });
    }
    Ok(builder)
}

/// What building the request's target of the Dockerfile `text` takes, as a BuildKit of
/// `dialect` reads it: refused where it cannot be read so, where a step would reach
/// what the host does not grant, or where it declares a proxy argument set in the
/// environment (its value would be in the image's history, so its ID).
fn read_needs(
    request: &BuildRequest<'_>,
    dockerfile: &Path,
    text: &str,
    args: &HashMap<String, String>,
    env_proxies: &[(String, String)],
    grants: &BuildGrants,
    dialect: Dialect,
) -> Result<Needs, RecipeError> {
    let fail = |why: String| RecipeError::Recipe {
        image: request.name.to_string(),
        why,
    };
    let at = |line: usize| format!("{}:{line}", dockerfile.display());
    let stages = super::dockerfile::stages(text, args, dialect)
        .map_err(|e| fail(format!("{}: {}", at(e.line), e.why)))?;
    let needs = stages
        .needs(request.target)
        .map_err(|why| fail(format!("target `{}`: {why}", request.target.unwrap_or(""))))?;
    if let Some((name, line)) = stages
        .arg_lines()
        .iter()
        .find(|(n, _)| env_proxies.iter().any(|(p, _)| p == n))
    {
        return Err(fail(format!(
            "{}: the Dockerfile declares `ARG {name}`, and {name} is set in the environment: its value would be in the image's history and so its ID; drop the ARG (the builder takes proxy arguments without one) or unset {name}",
            at(*line)
        )));
    }
    // Secrets: every one a step needs is given.
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
    for (reach, line) in &needs.reach {
        let refused = match reach {
            Reach::Network(mode) if mode == "host" => {
                (!grants.allows_network(BuildNetwork::Host)).then(|| {
                    "RUN --network=host would give the step this host's network, which the host policy does not grant this build".to_string()
                })
            }
            Reach::Remote(url) => (grants.network_mode() == Some("none")).then(|| {
                format!("ADD {url}: the builder would fetch it, and the host policy gives this build no network")
            }),
            Reach::Network(_) => None,
        };
        if let Some(why) = refused {
            return Err(fail(format!("{}: {why}", at(*line))));
        }
    }
    Ok(needs)
}

/// What the build says before it starts: secrets given that no step mounts, proxies
/// from the environment, and what killed builds had left (removed now).
fn announce(
    request: &BuildRequest<'_>,
    needs: &super::dockerfile::Needs,
    env_proxies: &[(String, String)],
    engine: &Engine,
    progress: &mut dyn FnMut(Progress<'_>),
) {
    for secret in request.secrets {
        if !needs.secrets.iter().any(|s| s.id == secret.id) {
            progress(Progress::SecretUnused(&secret.id));
        }
    }
    if !env_proxies.is_empty() {
        let names: Vec<String> = env_proxies.iter().map(|(n, _)| n.clone()).collect();
        progress(Progress::Proxies(&names));
    }
    let left = super::scratch::sweep_dead(engine);
    if left.images + left.folders > 0 {
        progress(Progress::LeftoversRemoved {
            images: left.images,
            folders: left.folders,
        });
    }
}

/// The base `cibox init`'s recipe names until the project writes its own in: no image
/// anywhere, refused before the engine is asked (a pull of it failed as a network error).
pub const PLACEHOLDER_BASE: &str = "replace-me-with-a-base";

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
        if image.split(['@', ':']).next() == Some(PLACEHOLDER_BASE) {
            return Err(refused(
                format!("{at}: the FROM line still names `{PLACEHOLDER_BASE}`, the placeholder `cibox init` wrote"),
                vec![
                    "edit it to name your base: REPOSITORY@sha256:… (pulled by that digest), or an image on this host (`docker images`)".into(),
                ],
            ));
        }
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
        check_base(&found, base, &at, &written)?;
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

/// A local base is taken for the platform it was built for, and runs no step of its
/// own: the builder resolves a tag for another platform at its registry (unless pinned
/// by digest), and runs a base's `ONBUILD` triggers in this build.
fn check_base(
    found: &crate::engine::ImageDetails,
    base: &ImageUse,
    at: &str,
    written: &str,
) -> Result<(), RecipeError> {
    use super::dockerfile::normalise_platform;
    let (os, arch, variant) = &found.platform;
    let have = normalise_platform(&format!("{os}/{arch}/{variant}"));
    let want = normalise_platform(base.platform.as_deref().unwrap_or(""));
    let same = have.0 == want.0
        && have.1 == want.1
        && (have.2.is_empty() || want.2.is_empty() || have.2 == want.2);
    if !same && !base.image.contains('@') {
        let platform = base.platform.as_deref().map_or_else(
            || format!("this host's platform ({}/{})", want.0, want.1),
            |p| format!("--platform={p}"),
        );
        return Err(ImageError::Refused {
            message: format!(
                "{at}: base {written} is taken for {platform}, but the local image is {}/{}{}: the builder would resolve the tag at its registry",
                have.0,
                have.1,
                if have.2.is_empty() { String::new() } else { format!("/{}", have.2) }
            ),
            details: vec!["pin the base by digest (REPOSITORY@sha256:…) for another platform, or build for the local image's".into()],
        }
        .into());
    }
    if found.onbuild > 0 {
        return Err(ImageError::OnBuild {
            at: at.to_string(),
            base: written.to_string(),
            count: found.onbuild,
        }
        .into());
    }
    Ok(())
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
