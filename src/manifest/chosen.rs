//! Which image a command means: the manifest's image by name, the ID it pins, and the
//! ID to use (the flag, else the variable, else the manifest's).

use std::path::PathBuf;

use super::document::Manifest;
use super::images::{DEFAULT_IMAGE, ImageConfig, image_variable};
use crate::error::{ErrorKind, Result};
use crate::exit::Failure;
use crate::image::{ImageId, PinnedId};

/// What the choice of an image refuses: usage errors.
#[derive(Debug, thiserror::Error)]
pub enum ChoiceError {
    #[error(
        "{}: no image named `{name}`; images: {}",
        .manifest.display(),
        .images.join(", ")
    )]
    NoSuchImage {
        manifest: PathBuf,
        name: String,
        images: Vec<String>,
    },
    #[error("no image ID: pass one, set CIBOX_IMAGE, or set image.id in cibox.yaml")]
    NoImageId,
}

impl ErrorKind for ChoiceError {
    fn failure(&self) -> Failure {
        Failure::Usage
    }
}

impl Manifest {
    /// The manifest's image named `name` (`default` when none is given).
    pub fn image_named(&self, name: Option<&str>) -> Result<(&str, &ImageConfig)> {
        let name = name.unwrap_or(DEFAULT_IMAGE);
        self.images
            .get_key_value(name)
            .map(|(k, v)| (k.as_str(), v))
            .ok_or_else(|| {
                ChoiceError::NoSuchImage {
                    manifest: self.path.clone(),
                    name: name.to_string(),
                    images: self.images.keys().cloned().collect(),
                }
                .into()
            })
    }

    /// The ID the manifest pins for its image `name`.
    pub fn pin<'m>(&'m self, name: &'m str) -> PinnedId<'m> {
        PinnedId {
            image: name,
            id: self.images.get(name).and_then(|i| i.id.as_deref()),
            manifest: &self.path,
        }
    }
}

/// The image to use: the flag, else `CIBOX_IMAGE` (the default image) or
/// `CIBOX_IMAGE_<NAME>`, else the image's `id`.
pub fn chosen_id(
    flag: Option<String>,
    manifest: Option<(&str, &ImageConfig)>,
) -> Result<(ImageId, String)> {
    let name = manifest.map_or(DEFAULT_IMAGE, |(n, _)| n);
    let var = if name == DEFAULT_IMAGE {
        "CIBOX_IMAGE".to_string()
    } else {
        image_variable(name)
    };
    let (raw, from) = if let Some(id) = flag {
        (id, "the command line".to_string())
    } else if let Some(id) = std::env::var(&var).ok().filter(|s| !s.is_empty()) {
        (id, var.clone())
    } else if let Some(id) = manifest.and_then(|(_, i)| i.id.clone()) {
        (id, "the image's id in the manifest".to_string())
    } else {
        return Err(ChoiceError::NoImageId.into());
    };
    let id = ImageId::parse(raw.trim())
        .map_err(|why| crate::image::ImageError::NotAnId(format!("{why} (from {from})")))?;
    Ok((id, from))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        let text = "version: 1\nproject: demo\nimages:\n  default: {id: 'sha256:1111111111111111111111111111111111111111111111111111111111111111', locks: []}\n  cuda: {locks: []}\nbatches:\n  unit: {gpus: 0, timeout: 5m, run: ['true']}\n";
        Manifest::parse(text, std::path::Path::new("/p/cibox.yaml")).unwrap()
    }

    #[test]
    fn an_image_is_named_or_refused_naming_the_others() {
        let m = manifest();
        assert_eq!(m.image_named(None).unwrap().0, "default");
        assert_eq!(m.image_named(Some("cuda")).unwrap().0, "cuda");
        let e = m.image_named(Some("rocm")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/p/cibox.yaml: no image named `rocm`; images: default, cuda"
        );
        assert_eq!(e.exit_code(), crate::exit::USAGE);
        assert_eq!(m.pin("cuda").id, None);
        assert!(m.pin("default").id.unwrap().ends_with("1111"));
    }

    #[test]
    fn the_flag_comes_before_the_manifest_and_a_bad_one_names_where_it_came_from() {
        let m = manifest();
        let default = m.image_named(None).unwrap();
        let flag = format!("sha256:{}", "2".repeat(64));
        let (id, from) = chosen_id(Some(flag.clone()), Some(default)).unwrap();
        assert_eq!(
            (id.as_str(), from.as_str()),
            (flag.as_str(), "the command line")
        );
        let e = chosen_id(Some("latest".into()), Some(default)).unwrap_err();
        assert!(e.to_string().contains("(from the command line)"), "{e}");
    }
}
