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

/// Why a text is not a reference pinned by digest: a usage or configuration error.
#[derive(Debug, thiserror::Error)]
pub enum PinnedRefError {
    #[error(
        "`{text}` is not pinned by digest: write REPOSITORY@sha256:<64 hex> (a tag can be moved; a digest cannot)"
    )]
    NotPinned { text: String },
    #[error("`{digest}` is not a sha256 digest (sha256: and 64 lower-case hex digits)")]
    NotSha256 { digest: String },
    #[error("the repository before `@` is empty or too long")]
    RepositoryLength,
    #[error("`{repository}` carries a tag: a pinned reference has only the digest (drop `:{tag}`)")]
    Tagged { repository: String, tag: String },
    #[error(
        "`{repository}` is not a repository name (components of lower-case letters and digits, joined by `.`, `_`, `__` or `-`, separated by `/`; no `..`)"
    )]
    NotARepository { repository: String },
}

impl crate::error::ErrorKind for PinnedRefError {
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }
}

impl PinnedRef {
    pub fn parse(text: &str) -> Result<PinnedRef, PinnedRefError> {
        let text = text.trim();
        let Some((repository, digest)) = text.split_once('@') else {
            return Err(PinnedRefError::NotPinned { text: text.into() });
        };
        let hex = digest.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(PinnedRefError::NotSha256 {
                digest: digest.into(),
            });
        }
        check_repository(repository)?;
        Ok(PinnedRef {
            repository: repository.to_string(),
            digest: digest.to_string(),
        })
    }
}

/// Checks that `repository` is a repository name (`[registry[:port]/]path`, without a
/// tag or digest), as docker's reference grammar has it.
pub fn check_repository(repository: &str) -> Result<(), PinnedRefError> {
    if repository.is_empty() || repository.len() > 255 {
        return Err(PinnedRefError::RepositoryLength);
    }
    let components: Vec<&str> = repository.split('/').collect();
    let last = components.last().copied().unwrap_or("");
    if last.contains(':') {
        return Err(PinnedRefError::Tagged {
            repository: repository.into(),
            tag: last.split_once(':').map(|(_, t)| t).unwrap_or("").into(),
        });
    }
    let registry = components.len() > 1 && looks_like_registry(components[0]);
    let named = components.iter().enumerate().all(|(i, c)| {
        if i == 0 && registry {
            is_registry(c)
        } else {
            is_path_component(c)
        }
    });
    if !named {
        return Err(PinnedRefError::NotARepository {
            repository: repository.into(),
        });
    }
    Ok(())
}

/// Docker's rule: the first of several components names a registry when it has a `.`
/// or a `:`, is `localhost`, or has an upper-case letter.
fn looks_like_registry(c: &str) -> bool {
    c.contains(['.', ':']) || c == "localhost" || c.bytes().any(|b| b.is_ascii_uppercase())
}

/// `host[:port]`: dot-separated labels of letters, digits and inner `-`.
fn is_registry(c: &str) -> bool {
    let (host, port) = match c.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (c, None),
    };
    let label = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    host.split('.').all(label)
        && port
            .is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// A path component: runs of `[a-z0-9]` joined by one separator each (`.`, `_`, `__`,
/// or any number of `-`), so never empty, never `.` or `..`, never starting or ending
/// with a separator.
fn is_path_component(c: &str) -> bool {
    let bytes = c.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    loop {
        let start = i;
        while i < bytes.len() && alnum(bytes[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == bytes.len() {
            return true;
        }
        let sep = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let ok = match &c[sep..i] {
            "." | "_" | "__" => true,
            s => s.bytes().all(|b| b == b'-'),
        };
        if !ok {
            return false;
        }
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
                .to_string()
                .contains("not pinned by digest")
        );
        assert!(
            PinnedRef::parse(&format!("ghcr.io/org/img:v1@{d}"))
                .unwrap_err()
                .to_string()
                .contains("carries a tag")
        );
        assert!(
            PinnedRef::parse("img@sha256:abc")
                .unwrap_err()
                .to_string()
                .contains("not a sha256 digest")
        );
        assert!(
            PinnedRef::parse(&format!("Img/$(x)@{d}"))
                .unwrap_err()
                .to_string()
                .contains("not a repository name")
        );
    }

    #[test]
    fn names_follow_the_reference_grammar() {
        let d = format!("sha256:{}", "a".repeat(64));
        for good in [
            "gpu",
            "ci/gpu",
            "localhost/ci",
            "localhost:5000/ci/gpu",
            "127.0.0.1:5000/ci/gpu",
            "Registry.Example.com/org/img",
            "org/img.v1__x---y_z",
        ] {
            assert!(PinnedRef::parse(&format!("{good}@{d}")).is_ok(), "{good}");
        }
        for bad in [
            "ci/../gpu",
            "127.0.0.1:5000/../gpu",
            "..",
            "ci/./gpu",
            "ci/gpu/.",
            "ci/-gpu",
            "ci/gpu-",
            "ci/a..b",
            "ci/a___b",
            "ci/a._b",
            "-reg.io/x",
            "reg.io:/x",
            "reg.io:50a/x",
            "ci//gpu",
            "/ci",
        ] {
            assert!(
                PinnedRef::parse(&format!("{bad}@{d}"))
                    .unwrap_err()
                    .to_string()
                    .contains("not a repository name"),
                "{bad}"
            );
        }
    }
}
