//! `image push`: a verified image pushed to a repository under its own tag
//! (`id-<hex>`), so that the digest it is pushed as names it.

use super::ImageId;
use crate::console;
use bollard::auth::DockerCredentials;

use crate::engine::{Engine, EngineError};

/// Pushes `id` to `to` as `to:id-<hex>` and returns the digest the registry gave: the
/// image named first by its own name (`cibox/PROJECT:id-<hex>`, of the lockset
/// `lockset`), so that taking the push's name away never leaves it nameless; the push's
/// name taken away again after (unless it is the image's own).
pub fn push(
    engine: &Engine,
    id: &ImageId,
    to: &str,
    project: &str,
    lockset: &str,
    credentials: Option<DockerCredentials>,
) -> Result<String, EngineError> {
    let (repository, _) = super::recipe::tag_parts(project, lockset);
    let own_tag = super::load::name_own(engine, &repository, id)?;
    let push_tag = own_tag.as_str();
    engine.tag(id.as_str(), to, push_tag)?;
    console::info(format!("pushing {id} to {to}:{push_tag}"));
    let pushed = engine.push(to, push_tag, credentials);
    let untagged = if to == repository {
        Ok(())
    } else {
        engine.untag(&format!("{to}:{push_tag}"))
    };
    let digest = pushed?;
    untagged?;
    Ok(digest)
}
