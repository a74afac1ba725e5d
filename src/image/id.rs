//! Image IDs: the only way cibox names an image. Tags move and digests of short IDs
//! collide; a full `sha256:<64 lowercase hex>` ID is immutable.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct ImageId(String);

impl ImageId {
    /// Accepts exactly `sha256:` and 64 lowercase hex digits; says what is wrong otherwise.
    pub fn parse(s: &str) -> Result<ImageId, String> {
        let lower = s.to_ascii_lowercase();
        let why = if lower != s
            && lower
                .strip_prefix("sha256:")
                .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            format!("`{s}` is an image ID in upper case; image IDs are lower case: `{lower}`")
        } else if let Some(hex) = s.strip_prefix("sha256:") {
            if hex.len() != 64 {
                format!(
                    "`{s}` is a short or truncated ID ({} hex digits); use the full `sha256:` + 64 hex ID",
                    hex.len()
                )
            } else if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                format!("`{s}` is not hex")
            } else if hex.bytes().any(|b| b.is_ascii_uppercase()) {
                format!("`{s}` has uppercase hex; image IDs are lowercase")
            } else {
                return Ok(ImageId(s.to_string()));
            }
        } else if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            format!("`{s}` lacks the `sha256:` prefix")
        } else if s.len() < 64 && !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            format!("`{s}` is a short ID; use the full `sha256:` + 64 hex ID")
        } else if s.contains('@') {
            format!(
                "`{s}` is a repository digest reference; cibox takes the local image ID (`docker image inspect --format '{{{{.Id}}}}'`)"
            )
        } else if s.is_empty() {
            "the image ID is empty".to_string()
        } else {
            format!("`{s}` is a tag or name, not an image ID: tags move; use the full `sha256:` ID")
        };
        Err(why)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ImageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_lowercase_ids() {
        let good = format!("sha256:{}", "ab".repeat(32));
        assert!(ImageId::parse(&good).is_ok());
        for bad in [
            "ubuntu:22.04".to_string(),
            "latest".to_string(),
            "sha256:abc123".to_string(),
            "abc123".to_string(),
            "ab".repeat(32),
            format!("sha256:{}", "AB".repeat(32)),
            format!("sha256:{}", "zz".repeat(32)),
            format!("repo@sha256:{}", "ab".repeat(32)),
            String::new(),
        ] {
            assert!(ImageId::parse(&bad).is_err(), "{bad}");
        }
        // An ID in upper case is called that, not a tag.
        let upper = format!("SHA256:{}", "AB".repeat(32));
        let why = ImageId::parse(&upper).unwrap_err();
        assert!(
            why.contains("in upper case") && why.contains(&good),
            "{why}"
        );
    }
}
