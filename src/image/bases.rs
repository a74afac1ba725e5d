//! A Dockerfile build's bases: each local or named by digest (then pulled by that
//! digest), never pulled by tag; taken for the platform the local image was built for;
//! carrying no `ONBUILD` triggers of its own; never the placeholder `cibox init` wrote.

use std::collections::HashSet;
use std::path::Path;

use super::build::Builder;
use super::dockerfile::ImageUse;
use super::{ImageError, ImageId};
use crate::engine::Engine;

/// What taking the bases does that a build says as it goes.
pub(super) enum BaseEvent<'a> {
    /// A base named by digest, not local, pulled by that digest.
    Pull(&'a str),
    /// A base named by a tag, resolved to a local image.
    ByTag { base: &'a ImageUse, id: &'a str },
}

/// The base `cibox init`'s recipe names until the project writes its own in: no image
/// anywhere, refused before the engine is asked (a pull of it failed as a network error).
pub const PLACEHOLDER_BASE: &str = "replace-me-with-a-base";

/// The layers of the images a Dockerfile build takes, each of which must be local or
/// named by digest (then pulled by that digest): never pulled by tag. BuildKit reads
/// an image ID (`FROM sha256:…`) as a Docker Hub name, so with BuildKit a base must
/// be named (by a tag that names a local image, or by digest).
pub(super) fn local_bases(
    engine: &Engine,
    images: &[ImageUse],
    builder: Builder,
    dockerfile: &Path,
    on: &mut dyn FnMut(BaseEvent<'_>),
) -> Result<HashSet<String>, ImageError> {
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
        let refused =
            |message: String, details: Vec<String>| ImageError::Refused { message, details };
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
            on(BaseEvent::Pull(image));
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
            on(BaseEvent::ByTag {
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
) -> Result<(), ImageError> {
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
        });
    }
    if found.onbuild > 0 {
        return Err(ImageError::OnBuild {
            at: at.to_string(),
            base: written.to_string(),
            count: found.onbuild,
        });
    }
    Ok(())
}
