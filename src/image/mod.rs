//! Images: the immutable ID ([`id`]), the lockset that ties an image to the source's
//! lock files ([`lockset`]), the build context ([`build_context`]), building an image
//! from its recipe ([`recipe`]), what the engine loaded ([`load`]), the check that a
//! local image carries the source's lockset ([`verify`]) and the one that it is the
//! image the manifest pins ([`PinnedId`]). See docs/interface.md §5.

pub mod archive;
pub mod build;
pub mod build_args;
pub mod build_context;
pub mod dockerfile;
pub mod id;
pub mod known;
pub mod load;
pub mod lockset;
pub mod make;
mod nix_build;
pub mod normalize;
pub mod pinned;
pub mod recipe;
pub mod saved;
pub mod scratch;
pub mod secrets;
pub mod trust;

pub use id::ImageId;
pub use lockset::Lockset;
pub use pinned::PinnedRef;

use std::path::Path;

use crate::engine::{ContainerEngine, EngineError};
use crate::exit::Failure;

/// Why an image cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image is not one cibox may run; `details` go under the headline, one a line.
    #[error("image refused: {message}")]
    Refused {
        message: String,
        details: Vec<String>,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl ImageError {
    /// The same error, saying which of the manifest's images it is about.
    pub fn for_image(self, name: &str) -> ImageError {
        match self {
            ImageError::Refused { message, details } => ImageError::Refused {
                message: format!("image `{name}`: {message}"),
                details,
            },
            other => other,
        }
    }

    /// The same error, an engine's text of many lines (a failed build's, with its
    /// failed step's last lines) said as a headline and the lines under it
    /// ([`EngineError::in_lines`]); for after what is hidden was masked in it.
    pub fn in_lines(self) -> ImageError {
        match self {
            ImageError::Engine(e) => ImageError::Engine(e.in_lines()),
            other => other,
        }
    }

    pub fn refused(message: impl Into<String>) -> ImageError {
        ImageError::Refused {
            message: message.into(),
            details: Vec::new(),
        }
    }
}

impl crate::error::ErrorKind for ImageError {
    fn failure(&self) -> Failure {
        match self {
            ImageError::Refused { .. } => Failure::ImageRefused,
            ImageError::Engine(e) => e.failure(),
        }
    }

    /// Lines to print under the headline: what to do about it.
    fn details(&self) -> &[String] {
        match self {
            ImageError::Refused { details, .. } => details,
            ImageError::Engine(e) => e.details(),
        }
    }
}

/// The outcome of a successful verification.
pub struct Verified {
    pub id: ImageId,
    pub lockset: String,
    pub files: usize,
}

/// Checks that `id` is present locally (never pulled) and carries the source's lockset.
pub fn verify(
    engine: &(impl ContainerEngine + ?Sized),
    id: &ImageId,
    source: &Lockset,
) -> Result<Verified, ImageError> {
    let Some(img) = engine.inspect(id.as_str())? else {
        return Err(ImageError::Refused {
            message: format!("{id} is not present in the local engine, and cibox never pulls"),
            details: vec![
                "restore it from a backup: cibox image load --from BACKUP.tar".into(),
                "or rebuild it from the recipe: cibox image build (a rebuild may get a new ID)"
                    .into(),
            ],
        });
    };
    if img.id != id.as_str() {
        // Only possible if the engine resolved the ID as something else; never accept it.
        return Err(ImageError::refused(format!(
            "the engine resolved {id} to a different image ({})",
            img.id
        )));
    }
    let (Some(digest), Some(text)) = (
        img.labels.get(lockset::LABEL_DIGEST),
        img.labels.get(lockset::LABEL_FILES),
    ) else {
        return Err(ImageError::Refused {
            message: format!(
                "{id} has no lockset labels ({} and {}): it was not built by cibox",
                lockset::LABEL_DIGEST,
                lockset::LABEL_FILES
            ),
            details: vec![
                "build it with `cibox image build` (or the flake's app: nix run .#image-NAME)"
                    .into(),
            ],
        });
    };
    if &lockset::digest_of(text) != digest {
        return Err(ImageError::refused(format!(
            "{id}: its {} label ({digest}) is not the digest of its {} label ({}); the labels were tampered with or written by hand",
            lockset::LABEL_DIGEST,
            lockset::LABEL_FILES,
            lockset::digest_of(text)
        )));
    }
    let image_lockset = Lockset::parse_text(text).map_err(|why| {
        ImageError::refused(format!(
            "{id}: its {} label is malformed: {why}",
            lockset::LABEL_FILES
        ))
    })?;
    if digest != &source.digest {
        let diff = image_lockset.diff(source);
        let mut details: Vec<String> = Vec::new();
        details.extend(diff.changed.iter().map(|p| format!("changed: {p}")));
        details.extend(diff.added.iter().map(|p| format!("added:   {p}")));
        details.extend(diff.removed.iter().map(|p| format!("removed: {p}")));
        details.push(format!(
            "image lockset {digest}, source lockset {}",
            source.digest
        ));
        details
            .push("build a new image from this source (cibox image build) and qualify it".into());
        return Err(ImageError::Refused {
            message: format!(
                "{id} was built from different lock files ({} changed, {} added, {} removed)",
                diff.changed.len(),
                diff.added.len(),
                diff.removed.len()
            ),
            details,
        });
    }
    Ok(Verified {
        id: id.clone(),
        lockset: digest.clone(),
        files: source.files.len(),
    })
}

/// The ID the manifest pins for one of its images (its `id`): an image built, loaded or
/// fetched for it must be that one.
#[derive(Debug, Clone, Copy)]
pub struct PinnedId<'a> {
    /// The image's name in the manifest.
    pub image: &'a str,
    /// The pinned ID as the manifest writes it; `None` when it pins none.
    pub id: Option<&'a str>,
    /// The manifest, named when an image is refused.
    pub manifest: &'a Path,
}

impl PinnedId<'_> {
    /// Refuses an image whose ID is not the one the manifest pins for it.
    pub fn check(&self, id: &ImageId) -> Result<(), ImageError> {
        self.check_as(id, &format!("image `{}` is {id}", self.image))
    }

    /// [`check`](Self::check), with `subject` saying what gave `id` (`REF is image ID`).
    pub fn check_as(&self, id: &ImageId, subject: &str) -> Result<(), ImageError> {
        let Some(pin) = self.id else {
            return Ok(());
        };
        if ImageId::parse(pin.trim()).ok().as_ref() == Some(id) {
            return Ok(());
        }
        Err(ImageError::Refused {
            message: format!(
                "{subject}, but the id of image `{}` in {} pins {}",
                self.image,
                self.manifest.display(),
                pin.trim()
            ),
            details: vec![
                "the same lock files gave another image: find what differs with `cibox image build --check`".into(),
                format!("or, if the change is meant, pin the new ID: id: \"{id}\""),
            ],
        })
    }
}
