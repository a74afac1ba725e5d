//! `image build`: a recipe, Dockerfile ([`super::recipe`]) or Nix flake attribute
//! ([`super::nix_build`]), to a verified image in the engine.

use super::recipe::{BuildOutcome, BuildRequest, Progress, Recipe, RecipeError};

/// Builds the image `request` names, loads it, holds it to its pin and verifies it.
pub fn build(
    request: &BuildRequest<'_>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<BuildOutcome, RecipeError> {
    match request.recipe {
        Recipe::Dockerfile(dockerfile) => {
            super::recipe::build_dockerfile(request, dockerfile, progress)
        }
        Recipe::Nix(attr) if request.check => Err(RecipeError::NixCheck {
            image: request.name.to_string(),
            attr: attr.to_string(),
        }),
        Recipe::Nix(attr) => super::nix_build::build_nix(request, attr, progress),
    }
}
