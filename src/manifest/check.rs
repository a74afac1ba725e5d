//! Where a check failed: [`Checker`] turns a key path into a [`ManifestError`] at the
//! position of that key in the YAML tree, and [`serde_error`] rewords serde's errors
//! (unknown keys with a suggestion, unknown variants, missing keys, wrong types).

use std::fmt;

use crate::yaml::Node;

use super::error::ManifestError;

/// Where a check failed: the key path and the tree to find its position in.
pub(super) struct Checker<'a> {
    pub(super) file: String,
    pub(super) root: &'a Node,
}

impl Checker<'_> {
    pub(super) fn at<S: AsRef<str>>(
        &self,
        path: &[S],
        message: impl fmt::Display,
    ) -> ManifestError {
        let node = self.root.locate(path);
        let key_path = path
            .iter()
            .map(|s| s.as_ref())
            .collect::<Vec<_>>()
            .join(".");
        ManifestError::At {
            path: self.file.clone(),
            mark: node.mark,
            message: if key_path.is_empty() {
                message.to_string()
            } else {
                format!("{key_path}: {message}")
            },
        }
    }

    /// Like [`Checker::at`] but points at the key of the last segment.
    pub(super) fn at_key<S: AsRef<str>>(
        &self,
        path: &[S],
        message: impl fmt::Display,
    ) -> ManifestError {
        let mut err = self.at(path, message);
        if let (Some((last, parent)), ManifestError::At { mark, .. }) =
            (path.split_last(), &mut err)
            && let Some(k) = self.root.locate(parent).key(last.as_ref())
        {
            *mark = k.mark;
        }
        err
    }
}

/// A serde error as a [`ManifestError`] at the position of the key it names.
pub(super) fn serde_error(
    check: &Checker<'_>,
    err: serde_path_to_error::Error<serde_json::Error>,
) -> ManifestError {
    let path: Vec<String> = err
        .path()
        .iter()
        .filter_map(|seg| match seg {
            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
            serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
            serde_path_to_error::Segment::Enum { variant } => Some(variant.clone()),
            serde_path_to_error::Segment::Unknown => None,
        })
        .collect();
    let (unknown, message) = crate::yaml::serde_words(&err.inner().to_string());
    if let Some(bad) = unknown {
        // serde_path_to_error includes the unknown key in the path; point at the key.
        let mut p = path.clone();
        if p.last() != Some(&bad) {
            p.push(bad);
        }
        return check.at_key(&p, message);
    }
    check.at(&path, message)
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::{GOOD, parse};

    #[test]
    fn unknown_key_names_position_and_suggestion() {
        let err = parse(&GOOD.replace("    gpus: 1", "    gpu: 1\n    gpus: 1")).unwrap_err();
        assert!(
            err.starts_with(
                "cibox.yaml:13:5: batches.4a.gpu: unknown key `gpu`; did you mean `gpus`?"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_wrong_type_is_said_in_the_manifests_words_not_rusts() {
        let err = parse(&GOOD.replace("\"1\": {batches: [cpu]}", "\"1\":")).unwrap_err();
        assert!(
            err.contains("layers.1: wrong type: got null, expected a mapping (`key: value` lines)"),
            "{err}"
        );
        let err = parse(&GOOD.replace("gpus: 1", "gpus: -1")).unwrap_err();
        assert!(!err.contains("u32") && !err.contains("u64"), "{err}");
    }

    #[test]
    fn wrong_type() {
        let err = parse(&GOOD.replace("gpus: 1", "gpus: many")).unwrap_err();
        assert!(err.contains("batches.4a.gpus: wrong type"), "{err}");
    }
}
