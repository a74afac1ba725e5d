//! Build secrets, as `image build --secret` gives them: `id=ID,env=VARIABLE` or
//! `id=ID,src=FILE` (docker's own form; `id=ID` alone reads the variable `ID`). They
//! come from the command line, the host's, never from the manifest, which a pull
//! request writes: a recipe only says which IDs its steps mount. The value goes to the
//! engine on the build's session only, is masked in what the build prints
//! ([`crate::mask`]), and an image that holds it is refused ([`super::normalise`]), as
//! are the credentials of the environment's proxies ([`hidden`]).

use crate::engine::BuildSecret;
use crate::mask::Hidden;

/// The most a secret may hold (BuildKit's own limit).
const MAX_BYTES: u64 = 500 * 1024;

/// Why a `--secret` cannot be used (a usage error).
#[derive(Debug, thiserror::Error)]
#[error("--secret {spec}: {why}")]
pub struct SecretError {
    /// The flag's value, less what is not its ID and source.
    pub spec: String,
    pub why: String,
}

impl crate::error::ErrorKind for SecretError {
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }
}

/// Reads each `--secret`: its ID and its value, now (a missing variable or file stops
/// the build before the engine is asked anything). An ID given twice is refused.
pub fn read(specs: &[String]) -> Result<Vec<BuildSecret>, SecretError> {
    let mut out: Vec<BuildSecret> = Vec::new();
    for spec in specs {
        let secret = read_one(spec)?;
        if out.iter().any(|s| s.id == secret.id) {
            return Err(SecretError {
                spec: spec.clone(),
                why: format!("secret `{}` is given twice", secret.id),
            });
        }
        out.push(secret);
    }
    Ok(out)
}

fn read_one(spec: &str) -> Result<BuildSecret, SecretError> {
    let fail = |why: String| SecretError {
        spec: spec.to_string(),
        why,
    };
    let mut id = None;
    let mut env = None;
    let mut src = None;
    for part in spec.split(',') {
        let Some((key, value)) = part.split_once('=') else {
            return Err(fail(format!(
                "`{part}` is not KEY=VALUE (write id=ID,env=VARIABLE or id=ID,src=FILE)"
            )));
        };
        match key.trim() {
            "id" => id = Some(value.trim().to_string()),
            "env" => env = Some(value.trim().to_string()),
            "src" | "source" => src = Some(value.trim().to_string()),
            "type" if matches!(value.trim(), "env" | "file") => {}
            other => {
                return Err(fail(format!(
                    "`{other}` is not a key of a secret (id, env, src)"
                )));
            }
        }
    }
    let Some(id) = id.filter(|i| {
        !i.is_empty()
            && i.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    }) else {
        return Err(fail(
            "needs id=ID (letters, digits, `_`, `-` and `.`): the ID a step mounts".into(),
        ));
    };
    let value = match (env, src) {
        (Some(_), Some(_)) => return Err(fail("give env= or src=, not both".into())),
        (None, Some(path)) => {
            let (file, md) = crate::util::open_plain(std::path::Path::new(&path), true)
                .map_err(|e| fail(format!("{path}: {e}")))?;
            if md.len() > MAX_BYTES {
                return Err(fail(format!("{path} is over {} KiB", MAX_BYTES >> 10)));
            }
            let mut value = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_BYTES), &mut value)
                .map_err(|e| fail(format!("{path}: {e}")))?;
            value
        }
        (env, None) => {
            let name = env.unwrap_or_else(|| id.clone());
            let value = std::env::var_os(&name)
                .ok_or_else(|| fail(format!("the variable {name} is not set")))?;
            std::os::unix::ffi::OsStrExt::as_bytes(value.as_os_str()).to_vec()
        }
    };
    Ok(BuildSecret { id, value })
}

/// What the host gives a build that is never shown or kept in the image: each
/// secret's value, and the credentials of each proxy of the environment (a build
/// arguments file's are the pull request's own, in the lockset).
pub fn hidden(secrets: &[BuildSecret], env_proxies: &[(String, String)]) -> Vec<Hidden> {
    secrets
        .iter()
        .map(|s| Hidden {
            what: format!("secret `{}`", s.id),
            value: s.value.clone(),
        })
        .chain(
            env_proxies
                .iter()
                .flat_map(|(name, value)| super::build_args::proxy_credentials(name, value)),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_come_from_a_variable_or_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tok");
        std::fs::write(&file, "from-a-file\n").unwrap();
        let got = read(&[
            format!("id=a,src={}", file.display()),
            "id=PATH".into(),
            "id=b,env=HOME,type=env".into(),
        ])
        .unwrap();
        assert_eq!(got[0].id, "a");
        assert_eq!(got[0].value, b"from-a-file\n");
        assert_eq!(got[1].value, std::env::var("PATH").unwrap().as_bytes());
        assert_eq!(got[2].id, "b");
        for (spec, why) in [
            ("env=HOME", "needs id=ID"),
            ("id=a b", "needs id=ID"),
            ("id=x,env=CIBOX_TEST_SURELY_UNSET_VARIABLE", "is not set"),
            ("id=x,src=/nonexistent/secret", "/nonexistent/secret"),
            ("id=x,env=HOME,src=/x", "not both"),
            ("id=x,mode=0400", "is not a key"),
            ("id", "is not KEY=VALUE"),
        ] {
            let e = read(&[spec.to_string()]).unwrap_err().to_string();
            assert!(e.contains(why), "{spec}: {e}");
        }
        let e = read(&["id=PATH".into(), "id=PATH,env=HOME".into()]).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
        // Its value is never shown.
        assert_eq!(format!("{:?}", got[0]), "BuildSecret(a, 12 bytes)");
    }

    #[test]
    fn what_is_hidden_is_each_secret_and_each_proxys_credentials() {
        let secrets = [BuildSecret {
            id: "tok".into(),
            value: b"value".to_vec(),
        }];
        let proxies = [
            (
                "HTTPS_PROXY".to_string(),
                "http://u:password@p:1".to_string(),
            ),
            ("NO_PROXY".to_string(), "u:password@localhost".to_string()),
        ];
        let whats: Vec<String> = hidden(&secrets, &proxies)
            .into_iter()
            .map(|h| h.what)
            .collect();
        assert_eq!(whats[0], "secret `tok`");
        assert!(whats.len() > 1);
        assert!(
            whats[1..]
                .iter()
                .all(|w| w == "the credentials of proxy variable HTTPS_PROXY")
        );
    }
}
