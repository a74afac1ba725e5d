//! Why a request cannot be planned.

use crate::error::ErrorKind;
use crate::exit::Failure;

/// Why a request cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("unknown layer `{layer}`; {hint}")]
    UnknownLayer { layer: String, hint: String },
    #[error("unknown batch `{batch}`; {hint}")]
    UnknownBatch { batch: String, hint: String },
    #[error("batch `{batch}` is not in layer `{layer}` (its batches: {batches})")]
    NotInLayer {
        batch: String,
        layer: String,
        batches: String,
    },
    #[error("no batch to run: name batches or a --layer")]
    NothingToRun,
    #[error("no image ID: pass --image, set CIBOX_IMAGE, or set image.id in cibox.yaml")]
    NoImage,
    #[error("no ID for image `{name}`: set images.{name}.id in cibox.yaml or {var}")]
    NoNamedImage { name: String, var: String },
    #[error(
        "batch `{batch}` names no image and the manifest has no default one: it runs only as part of a layer that names one ({layers}); run it with --layer"
    )]
    NoImageOutsideLayer { batch: String, layers: String },
    #[error(
        "this run uses the images {names}: --image (or CIBOX_IMAGE) would be ambiguous; set each image's id in cibox.yaml, or CIBOX_IMAGE_<NAME>"
    )]
    AmbiguousImage { names: String },
    /// The ID is not a full `sha256:` image ID (an image refusal, exit 3).
    #[error("image refused: {0}")]
    BadImageId(String),
}

impl ErrorKind for PlanError {
    fn failure(&self) -> Failure {
        match self {
            PlanError::BadImageId(_) => Failure::ImageRefused,
            _ => Failure::Usage,
        }
    }
}
