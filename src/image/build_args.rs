//! Build arguments for a Dockerfile recipe (`images.NAME.build_args`): a file of
//! `NAME=VALUE` lines that is one of the image's lock files, so that the arguments are
//! in the lockset and the image's ID still follows from the locks (slime's CUDA 13
//! variant is the same Dockerfile with other arguments). Each name must be one the
//! Dockerfile declares with `ARG`: the builder ignores others with a warning, and a
//! mistyped name would build an image that only looks configured. Docker's proxy
//! arguments (`HTTP_PROXY`, … [`dockerfile::PROXY_ARGS`]) need no `ARG`: the builder
//! takes them as they are and keeps them out of the image; set in cibox's environment
//! ([`proxies_from_env`]) they reach the build without being in the lockset.

use std::collections::HashMap;
use std::path::Path;

use super::dockerfile;
use super::lockset::Lockset;
use crate::mask::Hidden;

/// Why a build arguments file cannot be used (the manifest's to fix).
#[derive(Debug, thiserror::Error)]
#[error("build_args {file}: {why}")]
pub struct BuildArgsError {
    /// The file, as the manifest names it.
    pub file: String,
    pub why: String,
}

impl crate::error::ErrorKind for BuildArgsError {
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }
}

/// The most a build arguments file holds.
const MAX_BYTES: u64 = 64 * 1024;

/// Reads the arguments in `path` (`rel` as the manifest names it), which must be one
/// of `source`'s lock files and name only arguments the Dockerfile declares (`declared`).
pub fn read(
    path: &Path,
    rel: &str,
    source: &Lockset,
    declared: &[String],
) -> Result<HashMap<String, String>, BuildArgsError> {
    let fail = |why: String| BuildArgsError {
        file: rel.to_string(),
        why,
    };
    let normal: std::path::PathBuf = Path::new(rel).components().collect();
    if !source.files.iter().any(|f| {
        Path::new(&f.path)
            .components()
            .collect::<std::path::PathBuf>()
            == normal
    }) {
        return Err(fail(
            "is not one of the image's lock files; add it to `locks` so the image's ID follows from it".into(),
        ));
    }
    let (file, md) = crate::util::open_plain(path, false).map_err(|e| fail(e.to_string()))?;
    if md.len() > MAX_BYTES {
        return Err(fail(format!("is over {} KiB", MAX_BYTES >> 10)));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_BYTES), &mut text)
        .map_err(|e| fail(format!("cannot read it as UTF-8: {e}")))?;
    let mut args = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |why: String| fail(format!("line {}: {why}", i + 1));
        let Some((name, value)) = line.split_once('=') else {
            return Err(at("is not `NAME=VALUE`".into()));
        };
        let name = name.trim();
        if !crate::util::is_env_name(name) {
            return Err(at(format!("`{name}` is not an argument name")));
        }
        if super::dockerfile::PLATFORM_ARGS.contains(&name) {
            return Err(at(format!(
                "`{name}` is one of BuildKit's platform arguments, which it sets itself: a file that sets it would have the builder take another image than cibox checks"
            )));
        }
        if name.starts_with("BUILDKIT_") {
            return Err(at(format!(
                "`{name}`: BUILDKIT_* arguments are options of the builder's frontend (which frontend runs, where caches live), for cibox alone to set"
            )));
        }
        if !declared.iter().any(|d| d == name) && !dockerfile::is_proxy_arg(name) {
            return Err(at(format!(
                "`{name}` is not declared by an `ARG` of the Dockerfile (it declares {})",
                if declared.is_empty() {
                    "none".into()
                } else {
                    declared.join(", ")
                }
            )));
        }
        if args.insert(name.to_string(), value.to_string()).is_some() {
            return Err(at(format!("`{name}` is given twice")));
        }
    }
    Ok(args)
}

/// The proxy arguments set (and not empty) in cibox's environment, by name.
pub fn proxies_from_env() -> Vec<(String, String)> {
    dockerfile::PROXY_ARGS
        .iter()
        .filter_map(|name| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| (name.to_string(), v))
        })
        .collect()
}

/// What of a proxy variable's value is a credential, never to be shown or kept in the
/// image (searched for and masked as a secret's value is): the user information of its
/// URL (`user:pass`, as written and percent-decoded), the password alone, and the user
/// information with the host after it (so that a short one is found where the URL is
/// written whole). Nothing for a value without user information, and never anything
/// for `NO_PROXY` (a list of hosts: `localhost` is in every `/etc/hosts`).
pub fn proxy_credentials(name: &str, value: &str) -> Vec<Hidden> {
    if name.eq_ignore_ascii_case("NO_PROXY") {
        return Vec::new();
    }
    let value = value.trim();
    let rest = value.split_once("://").map_or(value, |(_, rest)| rest);
    // The last `@`: a password may hold `/` or `@` unencoded, and proxies have no path.
    let Some((userinfo, after)) = rest.rsplit_once('@') else {
        return Vec::new();
    };
    if userinfo.is_empty() {
        return Vec::new();
    }
    let host = after.split(['/', '?', '#']).next().unwrap_or_default();
    let password = userinfo.split_once(':').map(|(_, p)| p).unwrap_or_default();
    let mut values: Vec<Vec<u8>> = vec![
        format!("{userinfo}@{host}").into_bytes(),
        userinfo.as_bytes().to_vec(),
        percent_decoded(userinfo),
        password.as_bytes().to_vec(),
        percent_decoded(password),
    ];
    values.retain(|v| !v.is_empty());
    values.sort();
    values.dedup();
    values
        .into_iter()
        .map(|v| Hidden {
            what: format!("the credentials of proxy variable {name}"),
            value: v,
        })
        .collect()
}

/// `text` with each `%XX` made the byte it stands for, as bytes (a password's bytes
/// need not be UTF-8: the step gets them as they are).
fn percent_decoded(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(name: &str, value: &str) -> Vec<String> {
        proxy_credentials(name, value)
            .into_iter()
            .map(|h| {
                assert_eq!(h.what, format!("the credentials of proxy variable {name}"));
                String::from_utf8_lossy(&h.value).into_owned()
            })
            .collect()
    }

    /// Issue 43, second attack: a password whose escape is not UTF-8 is searched for
    /// and masked as its bytes.
    #[test]
    fn a_password_that_is_not_utf8_is_its_bytes() {
        let found = proxy_credentials(
            "HTTP_PROXY",
            "http://builder:Run1%FFSecretPw@127.0.0.1:3128",
        );
        assert!(
            found.iter().any(|h| h.value == b"Run1\xffSecretPw"),
            "{found:?}"
        );
    }

    #[test]
    fn a_proxys_credentials_are_its_user_information_and_password() {
        assert_eq!(
            values("HTTPS_PROXY", "http://ci-user:p%40ssw0rd@proxy.corp:3128/"),
            [
                "ci-user:p%40ssw0rd",
                "ci-user:p%40ssw0rd@proxy.corp:3128",
                "ci-user:p@ssw0rd",
                "p%40ssw0rd",
                "p@ssw0rd"
            ]
        );
        // No scheme; a token as the user; a password with `/` and `@` unencoded.
        assert_eq!(
            values("all_proxy", "tok3n@proxy:1080"),
            ["tok3n", "tok3n@proxy:1080"]
        );
        assert_eq!(
            values("http_proxy", "socks5://u:a/b@c@proxy"),
            ["a/b@c", "u:a/b@c", "u:a/b@c@proxy"]
        );
        // Nothing without user information, and never anything for NO_PROXY.
        for (name, value) in [
            ("HTTP_PROXY", "http://proxy.corp:3128"),
            ("HTTP_PROXY", "http://@proxy.corp:3128"),
            ("NO_PROXY", "user:password@localhost,.corp"),
            ("no_proxy", "localhost"),
        ] {
            assert!(values(name, value).is_empty(), "{name}={value}");
        }
        assert_eq!(percent_decoded("a%2Fb%zz%4"), b"a/b%zz%4");
    }
}
