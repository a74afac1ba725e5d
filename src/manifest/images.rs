//! `image:` / `images:`, what batches run in: [`ImageConfig`], the [`DEFAULT_IMAGE`]
//! name, the variable that names an image's ID for a run, and the checks of each image
//! and of a name that should be one.

use std::collections::BTreeMap;
use std::path::Path;

use indexmap::IndexMap;
use serde::Deserialize;

use crate::util::did_you_mean;

use super::check::Checker;
use super::error::ManifestError;
use super::values::is_name;

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    /// The qualified image (checked where it is used: a malformed ID is an image refusal).
    pub id: Option<String>,
    /// Where `image fetch` gets it: `REPOSITORY@sha256:…`, pinned by digest.
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    #[serde(default)]
    pub locks: Vec<String>,
    pub nix: Option<String>,
    pub dockerfile: Option<String>,
    /// How the source is installed in this image (instead of `source.install`); a
    /// batch's own `install` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<Vec<String>>,
    /// A file of `NAME=VALUE` build arguments for a Dockerfile recipe, relative to the
    /// manifest; one of the image's lock files, so the ID still follows from the locks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_args: Option<String>,
    /// A Dockerfile recipe's build context: a folder relative to the manifest (inside
    /// it), by default the Dockerfile's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// The Dockerfile's stage to build (`docker build --target`); by default its last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// The variable that names the ID of image `name` for a run (`CIBOX_IMAGE_<NAME>`, the
/// name upper-cased, every other character `_`).
pub fn image_variable(name: &str) -> String {
    let upper: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("CIBOX_IMAGE_{upper}")
}

/// The image of batches that name none.
pub const DEFAULT_IMAGE: &str = "default";

/// Reads `image:` (the one image, `default`) or `images:` (named ones), not both:
/// every image by name, each checked.
pub(super) fn validate_images(
    check: &Checker<'_>,
    image: Option<ImageConfig>,
    images: IndexMap<String, ImageConfig>,
) -> Result<IndexMap<String, ImageConfig>, ManifestError> {
    let images: IndexMap<String, ImageConfig> = match (image, images.is_empty()) {
        (Some(_), false) => {
            return Err(check.at(
                &["images"],
                "write either `image:` (one image) or `images:` (named ones, with `default`), not both",
            ));
        }
        (Some(one), true) => IndexMap::from([(DEFAULT_IMAGE.to_string(), one)]),
        (None, true) => IndexMap::from([(DEFAULT_IMAGE.to_string(), ImageConfig::default())]),
        (None, false) => images,
    };
    let written_as = |name: &str| -> Vec<String> {
        if images.len() == 1 && check.root.get("images").is_none() {
            vec!["image".to_string()]
        } else {
            vec!["images".to_string(), name.to_string()]
        }
    };
    let mut variables: BTreeMap<String, &String> = BTreeMap::new();
    for (name, img) in &images {
        check_image(check, &written_as(name), name, img, &mut variables)?;
    }
    Ok(images)
}

/// One image, written at `at`: its name (and the variable it gives, which no other
/// image may share), its recipe, pins and lock files.
fn check_image<'a>(
    check: &Checker<'_>,
    at: &[String],
    name: &'a String,
    img: &ImageConfig,
    variables: &mut BTreeMap<String, &'a String>,
) -> Result<(), ManifestError> {
    let at_key = |k: &str| -> Vec<String> { at.iter().cloned().chain([k.to_string()]).collect() };
    if !is_name(name, true) {
        return Err(check.at_key(
            at,
            format!("`{name}` is not a valid image name: use letters, digits, `_`, `.` and `-`"),
        ));
    }
    if let Some(other) = variables.insert(image_variable(name), name) {
        return Err(check.at_key(
            at,
            format!(
                "`{name}` and `{other}` would share the variable {} that picks an image's ID; rename one",
                image_variable(name)
            ),
        ));
    }
    if img.nix.is_some() && img.dockerfile.is_some() {
        return Err(check.at(
            at,
            "set either `nix` or `dockerfile` as the image recipe, not both",
        ));
    }
    if let Some(r) = &img.reference
        && let Err(why) = crate::image::PinnedRef::parse(r)
    {
        return Err(check.at(&at_key("ref"), why));
    }
    if let Some(id) = &img.id
        && let Err(why) = crate::image::ImageId::parse(id.trim())
    {
        return Err(check.at(&at_key("id"), why));
    }
    let inside =
        |p: &str| !p.is_empty() && !Path::new(p).is_absolute() && !p.split('/').any(|c| c == "..");
    if let Some(df) = &img.dockerfile
        && let Some(why) = remote(df, "a Dockerfile recipe is a file")
    {
        return Err(check.at(&at_key("dockerfile"), why));
    }
    if let Some(df) = &img.dockerfile
        && !inside(df)
    {
        return Err(check.at(
            &at_key("dockerfile"),
            format!("`{df}` must be a relative path inside the manifest's folder"),
        ));
    }
    if let Some(context) = &img.context {
        if img.dockerfile.is_none() {
            return Err(check.at(
                &at_key("context"),
                "a build context is for a `dockerfile` recipe (a Nix recipe takes its inputs from the flake)",
            ));
        }
        if let Some(why) = remote(context, "a build context is a folder") {
            return Err(check.at(&at_key("context"), why));
        }
        if !inside(context) {
            return Err(check.at(
                &at_key("context"),
                format!("`{context}` must be a folder inside the manifest's folder (a relative path without `..`)"),
            ));
        }
    }
    if let Some(target) = &img.target {
        if img.dockerfile.is_none() {
            return Err(check.at(
                &at_key("target"),
                "a target is a stage of a `dockerfile` recipe",
            ));
        }
        if target.is_empty()
            || !target
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(check.at(
                &at_key("target"),
                format!("`{target}` is not a stage name (letters, digits, `_`, `-` and `.`)"),
            ));
        }
    }
    if let Some(args) = &img.build_args {
        if img.dockerfile.is_none() {
            return Err(check.at(
                &at_key("build_args"),
                "build arguments are for a `dockerfile` recipe (a Nix recipe takes its inputs from the flake)",
            ));
        }
        if args.is_empty() || Path::new(args).is_absolute() || args.split('/').any(|c| c == "..") {
            return Err(check.at(
                &at_key("build_args"),
                format!("`{args}` must be a relative path inside the manifest's folder"),
            ));
        }
    }
    for (i, pat) in img.locks.iter().enumerate() {
        if pat.is_empty() || Path::new(pat).is_absolute() || pat.split('/').any(|c| c == "..") {
            let mut here = at_key("locks");
            here.push(i.to_string());
            return Err(check.at(
                &here,
                format!("`{pat}` must be a relative path inside the manifest's folder"),
            ));
        }
    }
    Ok(())
}

/// Why `path` is not a path of the repository but a place the builder would fetch
/// (`docker build`'s remote contexts: a URL, `git@…`, `github.com/…`), `None` when it
/// is a path: cibox builds from the checkout, and never fetches one.
fn remote(path: &str, what: &str) -> Option<String> {
    let url = path.contains("://") || path.starts_with("git@") || path.starts_with("github.com/");
    url.then(|| {
        format!(
            "`{path}` is a URL; {what} of the repository, relative to the manifest's folder (cibox builds from the checkout and fetches no other)"
        )
    })
}

/// Checks that `name` is one of the manifest's images.
pub(super) fn known_image(
    check: &Checker<'_>,
    images: &IndexMap<String, ImageConfig>,
    at: &[&str],
    name: &str,
) -> Result<(), ManifestError> {
    if images.contains_key(name) {
        return Ok(());
    }
    let known: Vec<String> = images.keys().cloned().collect();
    let hint = did_you_mean(name, &known)
        .map(|s| format!("did you mean `{s}`?"))
        .unwrap_or_else(|| format!("images: {}", known.join(", ")));
    Err(check.at(
        at,
        format!("`{name}` is not an image of this manifest; {hint}"),
    ))
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::{GOOD, parse};

    #[test]
    fn named_images_per_batch_and_layer() {
        let text = "version: 1\nproject: p\nimages:\n  default: {locks: [a.lock]}\n  megatron: {locks: [m.lock], dockerfile: m/Dockerfile}\nbatches:\n  cpu: {gpus: 0, timeout: 1m, run: [x]}\n  e2e: {gpus: 8, timeout: 1h, run: [x]}\n  own: {gpus: 1, timeout: 1h, run: [x], image: megatron}\nlayers:\n  mega: {batches: [e2e, own], image: megatron}\n  plain: {batches: [e2e]}\n";
        let m = parse(text).unwrap();
        assert_eq!(m.batches["cpu"].image, "default");
        // Its own (the default); the layer's only when run as part of that layer (a
        // batch in two layers runs in each one's image).
        assert_eq!(m.batches["e2e"].image, "default");
        assert_eq!(m.layers["mega"].image.as_deref(), Some("megatron"));
        assert_eq!(m.batches["own"].image, "megatron");
        // A batch that names its own image in a layer that names another: ambiguous.
        let err = parse(&text.replace("image: megatron}\nlayers", "image: default}\nlayers"))
            .unwrap_err();
        assert!(
            err.contains("layers.mega.image: runs its batches in image `megatron`, but batch `own` names image `default`"),
            "{err}"
        );
        assert_eq!(m.images["megatron"].locks, ["m.lock"]);
        assert_eq!(m.image.locks, ["a.lock"], "image is the default one");
        // The single `image:` form is the default image.
        let one = parse(GOOD).unwrap();
        assert_eq!(one.images.keys().collect::<Vec<_>>(), ["default"]);
        let cases: &[(&str, &str, &str)] = &[
            (
                "image: megatron}\nlayers",
                "image: megatorn}\nlayers",
                "cibox.yaml:9:48: batches.own.image: `megatorn` is not an image of this manifest; did you mean `megatron`?",
            ),
            (
                "image: megatron}\n  plain",
                "image: nope}\n  plain",
                "layers.mega.image: `nope` is not an image of this manifest",
            ),
            (
                "  default: {locks: [a.lock]}\n",
                "",
                "batches.cpu: names no `image`, and `images` has no `default`",
            ),
            (
                "images:\n",
                "image: {locks: [x]}\nimages:\n",
                "images: write either `image:` (one image) or `images:`",
            ),
            (
                "  megatron: {",
                "  \"m t\": {",
                "`m t` is not a valid image name",
            ),
            (
                "  megatron: {",
                "  a_b: {locks: [x]}\n  a-b: {",
                "`a-b` and `a_b` would share the variable CIBOX_IMAGE_A_B",
            ),
        ];
        for (from, to, want) in cases {
            assert!(text.contains(from), "{from}");
            let err = parse(&text.replacen(from, to, 1)).unwrap_err();
            assert!(err.contains(want), "{to}: {err}");
        }
        // A recipe's context and Dockerfile are the repository's, refused where written.
        let df = "images:\n  default:\n    locks: [a.lock]\n    dockerfile: docker/Dockerfile\n    context: CTX\nbatches:\n  cpu: {gpus: 0, timeout: 1m, run: [x]}\n";
        let df = format!("version: 1\nproject: p\n{df}");
        assert!(parse(&df.replace("CTX", ".")).is_ok());
        for (ctx, want) in [
            (
                "https://github.com/vllm-project/vllm.git",
                "cibox.yaml:7:14: images.default.context: `https://github.com/vllm-project/vllm.git` is a URL; a build context is a folder of the repository",
            ),
            ("http://example.com/ctx.tar.gz", "is a URL"),
            ("git@github.com:sgl-project/sglang.git", "is a URL"),
            ("github.com/volcengine/verl#main", "is a URL"),
            ("git://host/repo", "is a URL"),
            (
                "/abs/path",
                "cibox.yaml:7:14: images.default.context: `/abs/path` must be a folder inside the manifest's folder",
            ),
            (
                "docker/../..",
                "must be a folder inside the manifest's folder",
            ),
        ] {
            let err = parse(&df.replace("CTX", ctx)).unwrap_err();
            assert!(err.contains(want), "{ctx}: {err}");
        }
        let err = parse(
            &df.replace("docker/Dockerfile", "https://x/Dockerfile")
                .replace("CTX", "."),
        )
        .unwrap_err();
        assert!(
            err.contains("cibox.yaml:6:17: images.default.dockerfile: `https://x/Dockerfile` is a URL; a Dockerfile recipe is a file of the repository"),
            "{err}"
        );
        // A batch in two layers that name different images runs in each one's.
        let two_layers = text.replace(
            "layers:\n",
            "layers:\n  other: {batches: [e2e], image: default}\n",
        );
        let m = parse(&two_layers).unwrap();
        assert_eq!(m.layers["other"].image.as_deref(), Some("default"));
    }
}
