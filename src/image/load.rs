//! Images the engine loaded from a docker-archive (`image load`, a Nix recipe's
//! output): their IDs as the engine names them, and each verified against the source's
//! lockset and the manifest's pin.

use super::{ImageError, ImageId, Lockset, PinnedId, Verified};
use crate::engine::{Engine, EngineError};

/// Turns what the engine says it loaded into image IDs.
pub fn loaded_ids(engine: &Engine, loaded: Vec<String>) -> Result<Vec<ImageId>, ImageError> {
    if loaded.is_empty() {
        return Err(ImageError::LoadedNothing);
    }
    let mut ids: Vec<ImageId> = Vec::new();
    for r in loaded {
        let id = if r.starts_with("sha256:") {
            r
        } else {
            // A tagged archive (Nix images always are): resolve the tag right away.
            engine
                .inspect(&r)?
                .map(|i| i.id)
                .ok_or_else(|| ImageError::Vanished {
                    what: format!("loaded `{r}`"),
                })?
        };
        let id = ImageId::parse(&id).map_err(ImageError::NotAnId)?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// Verifies each loaded image against `source`, then holds it to `pin`; `on_loaded`
/// hears of each image before it is verified.
pub fn verify_loaded(
    engine: &Engine,
    ids: &[ImageId],
    source: &Lockset,
    pin: &PinnedId<'_>,
    on_loaded: &mut dyn FnMut(&ImageId),
) -> Result<Vec<Verified>, ImageError> {
    let mut verified = Vec::new();
    for id in ids {
        on_loaded(id);
        verified.push(super::verify(engine, id, source)?);
        pin.check(id)?;
    }
    Ok(verified)
}

/// Names a verified image as `image build` names what it builds: by its ID
/// (`cibox/PROJECT:id-<hex>`, a name no other image takes) and by its lockset
/// (`cibox/PROJECT:lockset-<12 hex>`, the newest image of those locks).
pub fn name_verified(
    engine: &Engine,
    project: &str,
    lockset: &str,
    id: &ImageId,
) -> std::result::Result<(), EngineError> {
    let (repository, lockset_tag) = super::recipe::tag_parts(project, lockset);
    name_own(engine, &repository, id)?;
    engine.tag(id.as_str(), &repository, &lockset_tag)
}

/// Names `id` by its own name in `repository` (`id-<hex>`, a name no other image
/// takes) and returns that tag.
pub fn name_own(
    engine: &Engine,
    repository: &str,
    id: &ImageId,
) -> std::result::Result<String, EngineError> {
    let own = super::normalise::id_tag(repository, id.as_str());
    let own_tag = own.rsplit_once(':').map_or("", |(_, t)| t).to_string();
    engine.tag(id.as_str(), repository, &own_tag)?;
    Ok(own_tag)
}
