//! Images: the immutable ID ([`id`]), the lockset that ties an image to the source's
//! lock files ([`lockset`]), the build context ([`build_context`]), building an image
//! from its recipe ([`recipe`]), what the engine loaded ([`load`]), the check that a
//! local image carries the source's lockset ([`verify`]) and the one that it is the
//! image the manifest pins ([`PinnedId`]). See docs/interface.md §5.

pub mod archive;
mod bases;
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
pub mod normalise;
pub mod pinned;
pub mod progress;
pub mod push;
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

/// Why an image cannot be used, or could not be made: each kind of failure a variant of
/// its own, its exit code in [`crate::error::ErrorKind::failure`] (docs/interface.md §2:
/// a refusal is 3, the host's own failure 5).
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image is not one cibox may run; `details` go under the headline, one a line.
    #[error("image refused: {message}")]
    Refused {
        message: String,
        details: Vec<String>,
    },
    /// Not a full `sha256:` image ID (why, as [`ImageId::parse`] says it).
    #[error("image refused: {0}")]
    NotAnId(String),
    /// An image ID asked for that the local engine does not hold.
    #[error("image refused: {id} is not present in the local engine")]
    NotPresent { id: ImageId },
    /// The engine resolved an image ID to a different image: never accepted.
    #[error("image refused: the engine resolved {id} to a different image ({got})")]
    ResolvedElsewhere { id: ImageId, got: String },
    /// The image's lockset digest label is not the digest of its files label.
    #[error(
        "image refused: {id}: its {digest_label} label ({digest}) is not the digest of its {files_label} label ({actual}); the labels were tampered with or written by hand",
        digest_label = lockset::LABEL_DIGEST,
        files_label = lockset::LABEL_FILES
    )]
    LabelsDisagree {
        id: ImageId,
        digest: String,
        actual: String,
    },
    /// The image's lockset files label cannot be read.
    #[error("image refused: {id}: its {label} label is malformed: {why}", label = lockset::LABEL_FILES)]
    LabelMalformed { id: ImageId, why: String },
    /// The engine loaded an archive and reported nothing.
    #[error(
        "image refused: the engine loaded nothing from the archive; is it a docker-archive (docker save, or a Nix streamLayeredImage)?"
    )]
    LoadedNothing,
    /// The engine said it loaded or pulled `what`, then could not find it.
    #[error("image refused: {what}, but the engine cannot find it")]
    Vanished { what: String },
    /// The engine loaded the normalised image and reported nothing it can find.
    #[error(
        "image refused: the engine loaded the normalised image but reported nothing it can find ({loaded:?})"
    )]
    NormalisedVanished { loaded: Vec<String> },
    /// A node's copy of the image, fetched by its pinned reference, is another image.
    #[error("image refused: {pinned} is image {found}, not {id} that the run was planned with")]
    NodeCopyDiffers {
        pinned: String,
        found: String,
        id: ImageId,
    },
    /// The build's image could not be normalised (masked: it may name a layer's entry).
    #[error("image refused: normalising the build: {0}")]
    Normalise(String),
    /// The host failed while the build was normalised (reading or writing here).
    #[error("normalising the build: {0}")]
    NormaliseHost(String),
    /// A base image that carries ONBUILD triggers.
    #[error(
        "image refused: {at}: base {base} carries {count} ONBUILD trigger(s), steps another Dockerfile wrote that would run in this build; use a base without them"
    )]
    OnBuild {
        at: String,
        base: String,
        count: usize,
    },
    /// A run's image without the lockset its plan computed (cibox's own fault).
    #[error("image refused: no lockset was computed for image `{name}`")]
    NoLockset { name: String },
    /// The build context cannot be packed (as the first pack of a build says it).
    #[error(transparent)]
    Context(#[from] build_context::BuildContextError),
    /// The host failed cibox: a temporary folder or a file of its own.
    #[error("{action}: {source}")]
    Host {
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Which of the manifest's images the error is about.
    #[error("image refused: image `{name}`: {}", reason(source))]
    ForImage {
        name: String,
        source: Box<ImageError>,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// An image error's words after its `image refused: `.
fn reason(e: &ImageError) -> String {
    let text = e.to_string();
    match text.strip_prefix("image refused: ") {
        Some(rest) => rest.to_string(),
        None => text,
    }
}

impl ImageError {
    /// The same error, saying which of the manifest's images it is about.
    pub fn for_image(self, name: &str) -> ImageError {
        use crate::error::ErrorKind;
        if self.failure() != Failure::ImageRefused {
            return self;
        }
        ImageError::ForImage {
            name: name.to_string(),
            source: Box::new(self),
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
}

impl crate::error::ErrorKind for ImageError {
    fn failure(&self) -> Failure {
        match self {
            ImageError::Engine(e) => e.failure(),
            ImageError::Context(e) => e.failure(),
            ImageError::ForImage { source, .. } => source.failure(),
            ImageError::Host { .. } | ImageError::NormaliseHost(_) => Failure::Infra,
            ImageError::Refused { .. }
            | ImageError::NotAnId(_)
            | ImageError::NotPresent { .. }
            | ImageError::ResolvedElsewhere { .. }
            | ImageError::LabelsDisagree { .. }
            | ImageError::LabelMalformed { .. }
            | ImageError::LoadedNothing
            | ImageError::Vanished { .. }
            | ImageError::NormalisedVanished { .. }
            | ImageError::NodeCopyDiffers { .. }
            | ImageError::Normalise(_)
            | ImageError::OnBuild { .. }
            | ImageError::NoLockset { .. } => Failure::ImageRefused,
        }
    }

    /// Lines to print under the headline: what to do about it.
    fn details(&self) -> &[String] {
        match self {
            ImageError::Refused { details, .. } => details,
            ImageError::Engine(e) => e.details(),
            ImageError::Context(e) => e.details(),
            ImageError::ForImage { source, .. } => source.details(),
            _ => &[],
        }
    }
}

/// The outcome of a successful verification.
pub struct Verified {
    pub id: ImageId,
    pub lockset: String,
    pub files: usize,
}

impl Verified {
    /// What `--json` prints of a verification on the engine `info` describes.
    pub fn to_json(&self, info: &crate::engine::EngineInfo) -> serde_json::Value {
        serde_json::json!({
            "status": "verified",
            "image": self.id,
            "lockset": self.lockset,
            "lock_files": self.files,
            "id_semantics": info.id_semantics,
            "storage_driver": info.storage_driver,
        })
    }

    /// What was verified, in one line.
    pub fn said(&self) -> String {
        format!(
            "verified {} (lockset {}, {} lock files)",
            self.id, self.lockset, self.files
        )
    }

    /// What was done (`done`), said of an image loaded or built.
    pub fn said_as(&self, done: &str) -> String {
        format!(
            "{done}: lockset {} ({} lock files)",
            self.lockset, self.files
        )
    }
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
        return Err(ImageError::ResolvedElsewhere {
            id: id.clone(),
            got: img.id,
        });
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
        return Err(ImageError::LabelsDisagree {
            id: id.clone(),
            digest: digest.clone(),
            actual: lockset::digest_of(text),
        });
    }
    let image_lockset = Lockset::parse_text(text).map_err(|why| ImageError::LabelMalformed {
        id: id.clone(),
        why: why.to_string(),
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

#[cfg(test)]
mod error_tests {
    use super::*;
    use crate::error::ErrorKind;

    fn id() -> ImageId {
        ImageId::parse(&format!("sha256:{}", "ab".repeat(32))).unwrap()
    }

    /// Issue 48: the host's own failures while an image is made exit 5, as the first
    /// context pack's do; what is refused exits 3 (docs/interface.md §2).
    #[test]
    fn each_image_failure_has_its_documented_exit_code() {
        let io = || std::io::Error::other("disk full");
        let host = ImageError::Host {
            action: "temporary folder",
            source: io(),
        };
        assert_eq!(host.failure().code(), crate::exit::INFRA);
        assert_eq!(host.to_string(), "temporary folder: disk full");
        assert_eq!(
            ImageError::NormaliseHost("x".into()).failure().code(),
            crate::exit::INFRA
        );
        // A second pack of the build context fails as the first does.
        let pack = build_context::BuildContextError::TempFile {
            what: "a temporary file",
            source: io(),
        };
        assert_eq!(ImageError::from(pack).failure().code(), crate::exit::INFRA);
        let ignore = build_context::BuildContextError::Ignore("bad".into());
        assert_eq!(
            ImageError::from(ignore).failure().code(),
            crate::exit::USAGE
        );
        for refused in [
            ImageError::NotAnId("not an ID".into()),
            ImageError::NotPresent { id: id() },
            ImageError::LoadedNothing,
            ImageError::Normalise("altered".into()),
            ImageError::NoLockset {
                name: "cuda".into(),
            },
        ] {
            assert_eq!(
                refused.failure().code(),
                crate::exit::IMAGE_REFUSED,
                "{refused}"
            );
            assert!(
                refused.to_string().starts_with("image refused: "),
                "{refused}"
            );
        }
    }

    #[test]
    fn an_error_for_one_of_several_images_names_it_and_keeps_its_code() {
        let e = ImageError::NotPresent { id: id() }.for_image("cuda");
        assert_eq!(
            e.to_string(),
            format!(
                "image refused: image `cuda`: {} is not present in the local engine",
                id()
            )
        );
        assert_eq!(e.failure().code(), crate::exit::IMAGE_REFUSED);
        let host = ImageError::Host {
            action: "temporary folder",
            source: std::io::Error::other("gone"),
        }
        .for_image("cuda");
        assert_eq!(host.to_string(), "temporary folder: gone");
        assert_eq!(host.failure().code(), crate::exit::INFRA);
    }
}
