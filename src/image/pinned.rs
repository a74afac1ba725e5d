//! An image reference pinned by digest, `REPOSITORY@sha256:<64 hex>`: what a registry
//! serves for it can never change, unlike a tag.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedRef {
    /// `[registry[:port]/]path`, without a tag.
    pub repository: String,
    /// `sha256:<64 hex>`: the digest of the image's manifest in the registry.
    pub digest: String,
}

impl fmt::Display for PinnedRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.repository, self.digest)
    }
}

impl PinnedRef {
    pub fn parse(text: &str) -> Result<PinnedRef, String> {
        let text = text.trim();
        let Some((repository, digest)) = text.split_once('@') else {
            return Err(format!(
                "`{text}` is not pinned by digest: write REPOSITORY@sha256:<64 hex> (a tag can be moved; a digest cannot)"
            ));
        };
        let hex = digest.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "`{digest}` is not a sha256 digest (sha256: and 64 lower-case hex digits)"
            ));
        }
        if repository.is_empty() || repository.len() > 255 {
            return Err("the repository before `@` is empty or too long".into());
        }
        let components: Vec<&str> = repository.split('/').collect();
        let last = components.last().copied().unwrap_or("");
        if last.contains(':') {
            return Err(format!(
                "`{repository}` carries a tag: a pinned reference has only the digest (drop `:{}`)",
                last.split_once(':').map(|(_, t)| t).unwrap_or("")
            ));
        }
        for (i, c) in components.iter().enumerate() {
            // The first component may be a registry host with a port.
            let allowed = |b: u8| {
                b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || matches!(b, b'.' | b'_' | b'-')
                    || (i == 0 && components.len() > 1 && (b == b':' || b.is_ascii_uppercase()))
            };
            if c.is_empty() || !c.bytes().all(allowed) {
                return Err(format!(
                    "`{repository}` is not a repository name (lower-case letters, digits, `.`, `_`, `-`, separated by `/`)"
                ));
            }
        }
        Ok(PinnedRef {
            repository: repository.to_string(),
            digest: digest.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_digests_pin() {
        let d = format!("sha256:{}", "a".repeat(64));
        let r = PinnedRef::parse(&format!("127.0.0.1:5000/ci/gpu@{d}")).unwrap();
        assert_eq!(r.repository, "127.0.0.1:5000/ci/gpu");
        assert_eq!(r.to_string(), format!("127.0.0.1:5000/ci/gpu@{d}"));
        assert!(
            PinnedRef::parse("ghcr.io/org/img:latest")
                .unwrap_err()
                .contains("not pinned by digest")
        );
        assert!(
            PinnedRef::parse(&format!("ghcr.io/org/img:v1@{d}"))
                .unwrap_err()
                .contains("carries a tag")
        );
        assert!(
            PinnedRef::parse("img@sha256:abc")
                .unwrap_err()
                .contains("not a sha256 digest")
        );
        assert!(
            PinnedRef::parse(&format!("Img/$(x)@{d}"))
                .unwrap_err()
                .contains("not a repository name")
        );
    }
}
