//! What `image build` says as it goes, on stderr: each [`Progress`] of the build and
//! each [`Stage`] after the engine's builder, one line each, and what the ticker says
//! goes on while a stage is quiet.

use super::build::{Builder, Stage};
use super::recipe::Progress;
use crate::console;
use crate::engine::EngineInfo;

/// The engine and what its image IDs mean, at debug level.
pub fn describe_engine(info: &EngineInfo) {
    console::debug(format!(
        "engine {} at {} (API {}), storage driver {}: {}",
        info.server_version,
        info.host,
        info.api_version,
        info.storage_driver,
        info.id_semantics.describe()
    ));
}

/// What `image build` reports as it goes, on stderr: each stage, the builder's steps
/// (its whole output when `verbose`), and through `ticker` that a quiet stage goes on.
pub fn show(progress: Progress<'_>, verbose: bool, ticker: &console::Ticker) {
    let say = |line: String, doing: Option<String>| say(ticker, line, doing);
    match progress {
        Progress::Engine(info) => describe_engine(info),
        Progress::Builder {
            builder: Builder::BuildKit,
            ..
        } => console::debug("the engine's BuildKit builds"),
        Progress::Builder {
            builder: Builder::Classic,
            why_classic,
        } => console::warn(format!(
            "the classic builder builds: {}; RUN --mount, secrets and building only what a target needs take BuildKit",
            why_classic.unwrap_or("BuildKit is missing")
        )),
        Progress::BaseByTag { base, id } => console::warn(format!(
            "FROM {} (line {}): a tag, which names {id} here; the image ID pins what was used, but the lockset does not cover it",
            base.image, base.line
        )),
        Progress::BasePull(image) => say(
            format!("pulling base {image} by its digest"),
            Some(format!("pulling {image}")),
        ),
        Progress::Proxies(names) => console::info(format!(
            "proxy arguments from the environment: {} (in neither the lockset nor the image)",
            names.join(", ")
        )),
        Progress::SecretUnused(id) => console::warn(format!(
            "secret `{id}` is given, but no step the build runs mounts it"
        )),
        Progress::Fresh { line } => say(
            format!(
                "an untrusted build whose steps mount a secret (line {line}) builds without the engine's cache: the cache does not key a step on a secret's value, and would hand this build what another build's secret wrote"
            ),
            None,
        ),
        Progress::Scope {
            scope,
            grants,
            project,
        } => say(
            format!(
                "build cache mounts: {}; RUN steps' network: {}",
                scope.describe(project),
                grants.network_mode().unwrap_or("the engine's default")
            ),
            None,
        ),
        Progress::Building {
            dockerfile,
            twice,
            lockset,
            epoch,
            epoch_from,
        } => say(
            format!(
                "building {}{} (lockset {lockset}; file times set to {epoch}, {epoch_from})",
                dockerfile.display(),
                if twice {
                    " twice, without the cache"
                } else {
                    ""
                },
            ),
            None,
        ),
        Progress::Context { bytes } => say(
            format!("sending the build context to the engine: {}", mib(bytes)),
            Some(format!("sending the build context ({})", mib(bytes))),
        ),
        Progress::Stage(stage) => show_stage(stage, verbose, ticker),
        Progress::EngineId {
            engine_id,
            config_digest,
        } => say(
            format!(
                "this engine names the image {engine_id} (a containerd image store: the manifest digest); its config digest is {config_digest}"
            ),
            None,
        ),
        Progress::LeftoversRemoved { images, folders } => say(
            format!(
                "removed what killed builds had left: {images} image(s), {folders} scratch folder(s)"
            ),
            None,
        ),
        Progress::NixBuild(attr) => say(
            format!("nix build {attr}"),
            Some(format!("nix build {attr}")),
        ),
        Progress::Loaded(id) => say(format!("loaded {id}"), None),
    }
}

/// A stage of the build after the engine's builder: its steps (its whole output when
/// `verbose`), saving, normalising and loading.
fn show_stage(stage: Stage<'_>, verbose: bool, ticker: &console::Ticker) {
    let say = |line: String, doing: Option<String>| say(ticker, line, doing);
    match stage {
        Stage::Step { name, cached } => {
            let line = format!("building: {name}{}", if cached { " (cached)" } else { "" });
            if verbose {
                eprintln!("{line}");
                ticker.doing(line);
            } else {
                say(line.clone(), Some(line));
            }
        }
        Stage::Output(out) => {
            if verbose {
                eprint!("{out}");
                ticker.said();
            }
            // The classic builder's steps are in its output.
            for step in out
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with("Step "))
            {
                if verbose {
                    ticker.doing(format!("building: {step}"));
                } else {
                    say(
                        format!("building: {step}"),
                        Some(format!("building: {step}")),
                    );
                }
            }
        }
        Stage::Known { id } => say(
            format!(
                "the engine's build is one normalised before, into {id} (in the engine): nothing to save, write or load"
            ),
            None,
        ),
        Stage::Saving => say(
            "saving the engine's build, to write it again reproducibly".into(),
            Some("saving the engine's build".into()),
        ),
        Stage::Normalising { bytes } => say(
            format!(
                "normalising the build ({}): file times, entry order, builder fields",
                mib(bytes)
            ),
            Some(format!("normalising the build ({})", mib(bytes))),
        ),
        Stage::Restated { entries } => say(
            format!(
                "the builder wrote {entries} file(s) again as the layers below hold them; dropped, as they change nothing"
            ),
            None,
        ),
        Stage::Uncached { error } => say(
            format!(
                "the engine's build cache names a layer the engine no longer has (its bug, moby/moby#41595: {}); building again without the cache",
                error.lines().next().unwrap_or(error)
            ),
            None,
        ),
        Stage::Loading { bytes } => say(
            format!("loading the normalised image: {}", mib(bytes)),
            Some(format!("loading the normalised image ({})", mib(bytes))),
        ),
    }
}

/// One line of progress, and what the ticker says goes on (`None`: nothing now).
fn say(ticker: &console::Ticker, line: String, doing: Option<String>) {
    console::info(line);
    match doing {
        Some(what) => ticker.doing(what),
        None => ticker.said(),
    }
}

/// A size in MiB, one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}
