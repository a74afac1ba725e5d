//! `image build` of a Nix recipe: `nix build` of the flake attribute in the manifest's
//! folder, and the archive it makes (or the script that streams one) loaded; each image
//! in it is held to the pin and verified by the caller's [`super::make::build`].

use std::path::{Path, PathBuf};

use super::recipe::{BuildOutcome, BuildRequest, Progress, RecipeError, connect};
use crate::engine::Engine;

pub(super) fn build_nix(
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
    use crate::image::recipe::nix_hint;

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
