//! Registry credentials for a push, from the docker client's own configuration
//! (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`): an `auths` entry, or
//! the credential helper `credHelpers` or `credsStore` names (`docker-credential-NAME
//! get`, the docker CLI's protocol). Never from the manifest; nothing is printed of
//! them.

use std::path::PathBuf;
use std::process::Command;

use base64::Engine as _;
use bollard::auth::DockerCredentials;

use super::EngineError;

/// How long a credential helper may take to answer (one may ask a keyring or a
/// cloud's API); past it, it is killed with what it started.
const HELPER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Docker Hub's key in `auths`.
const DOCKER_HUB: &str = "https://index.docker.io/v1/";

/// The registry a repository lives on: its first component when that names a host
/// (has a `.` or a `:`, or is `localhost`), else Docker Hub.
pub fn registry_of(repository: &str) -> String {
    match repository.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first.to_string(),
        _ => DOCKER_HUB.to_string(),
    }
}

fn config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// The credentials the docker client would send to `registry`, if it has any.
pub fn credentials(registry: &str) -> Result<Option<DockerCredentials>, EngineError> {
    let Some(path) = config_path() else {
        return Ok(None);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(EngineError::Io {
                action: format!("reading {}", path.display()),
                reason: e.to_string(),
            });
        }
    };
    let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| EngineError::Io {
        action: format!("reading {}", path.display()),
        reason: format!("not JSON: {e}"),
    })?;
    from_config(&config, registry, &run_helper)
}

/// What a credential helper gives: a user name and a secret, or none for the registry.
type HelperAnswer = Result<Option<(String, String)>, EngineError>;

/// [`credentials`] from a parsed configuration, `helper` running a credential helper.
fn from_config(
    config: &serde_json::Value,
    registry: &str,
    helper: &dyn Fn(&str, &str) -> HelperAnswer,
) -> Result<Option<DockerCredentials>, EngineError> {
    let helper_name = config["credHelpers"][registry]
        .as_str()
        .or_else(|| config["credsStore"].as_str())
        .filter(|h| !h.is_empty());
    if let Some(name) = helper_name
        && let Some((username, secret)) = helper(name, registry)?
    {
        return Ok(Some(if username == "<token>" {
            DockerCredentials {
                identitytoken: Some(secret),
                serveraddress: Some(registry.to_string()),
                ..Default::default()
            }
        } else {
            DockerCredentials {
                username: Some(username),
                password: Some(secret),
                serveraddress: Some(registry.to_string()),
                ..Default::default()
            }
        }));
    }
    let Some(auths) = config["auths"].as_object() else {
        return Ok(None);
    };
    let bare = |k: &str| {
        k.trim_start_matches("https://")
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string()
    };
    let Some(entry) = auths
        .iter()
        .find(|(k, _)| *k == registry || bare(k) == bare(registry))
        .map(|(_, v)| v)
    else {
        return Ok(None);
    };
    let mut creds = DockerCredentials {
        serveraddress: Some(registry.to_string()),
        ..Default::default()
    };
    if let Some(auth) = entry["auth"].as_str().filter(|a| !a.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| {
                s.split_once(':')
                    .map(|(u, p)| (u.to_string(), p.to_string()))
            });
        let Some((user, password)) = decoded else {
            return Err(EngineError::Io {
                action: format!("reading the docker configuration's credentials for {registry}"),
                reason: "its `auth` is not base64 of USER:PASSWORD".into(),
            });
        };
        creds.username = Some(user);
        creds.password = Some(password);
    }
    if let Some(token) = entry["identitytoken"].as_str().filter(|t| !t.is_empty()) {
        creds.identitytoken = Some(token.to_string());
    }
    Ok(Some(creds))
}

/// `docker-credential-NAME get` for `registry`: its user name and secret, or `None`
/// when it has none for it.
fn run_helper(name: &str, registry: &str) -> HelperAnswer {
    let program = format!("docker-credential-{name}");
    let failed = |reason: String| EngineError::Io {
        action: format!("asking {program} for the credentials of {registry}"),
        reason,
    };
    let mut cmd = Command::new(&program);
    cmd.arg("get");
    let bounds = crate::process::bounded::Bounds {
        deadline: std::time::Instant::now() + HELPER_TIMEOUT,
        max_stdout: 1 << 20,
        max_stderr: 64 << 10,
    };
    let out = crate::process::bounded::run(cmd, format!("{registry}\n").as_bytes(), bounds)
        .map_err(|e| match e {
            crate::process::bounded::BoundedError::Timeout
            | crate::process::bounded::BoundedError::Held => failed(format!(
                "it did not answer within {} s",
                HELPER_TIMEOUT.as_secs()
            )),
            e => failed(e.to_string()),
        })?;
    if !out.status.success() {
        // "credentials not found in native keychain": none for this registry.
        let said = String::from_utf8_lossy(&out.stdout).to_lowercase()
            + &String::from_utf8_lossy(&out.stderr).to_lowercase();
        if said.contains("not found") {
            return Ok(None);
        }
        return Err(failed(format!("it exited with {}", out.status)));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| failed(format!("not JSON: {e}")))?;
    match (v["Username"].as_str(), v["Secret"].as_str()) {
        (Some(u), Some(s)) => Ok(Some((u.to_string(), s.to_string()))),
        _ => Err(failed("no Username and Secret in what it printed".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str, _: &str) -> HelperAnswer {
        Ok(None)
    }

    #[test]
    fn credentials_come_from_auths_or_a_helper() {
        assert_eq!(registry_of("127.0.0.1:5000/ci/gpu"), "127.0.0.1:5000");
        assert_eq!(registry_of("ghcr.io/org/img"), "ghcr.io");
        assert_eq!(registry_of("org/img"), DOCKER_HUB);
        assert_eq!(registry_of("img"), DOCKER_HUB);
        let auth = base64::engine::general_purpose::STANDARD.encode("ci:s3cret");
        let config = serde_json::json!({
            "auths": {
                "https://reg.example.com/": {"auth": auth},
                "tok.example.com": {"identitytoken": "t0k"},
            },
            "credHelpers": {"gcr.io": "gcr"},
        });
        let c = from_config(&config, "reg.example.com", &none)
            .unwrap()
            .unwrap();
        assert_eq!(c.username.as_deref(), Some("ci"));
        assert_eq!(c.password.as_deref(), Some("s3cret"));
        let c = from_config(&config, "tok.example.com", &none)
            .unwrap()
            .unwrap();
        assert_eq!(c.identitytoken.as_deref(), Some("t0k"));
        assert!(
            from_config(&config, "127.0.0.1:5000", &none)
                .unwrap()
                .is_none()
        );
        let helper = |name: &str, reg: &str| {
            assert_eq!((name, reg), ("gcr", "gcr.io"));
            Ok(Some(("<token>".to_string(), "id-token".to_string())))
        };
        let c = from_config(&config, "gcr.io", &helper).unwrap().unwrap();
        assert_eq!(c.identitytoken.as_deref(), Some("id-token"));
        let bad = serde_json::json!({"auths": {"r.io": {"auth": "%%%"}}});
        assert!(from_config(&bad, "r.io", &none).is_err());
    }
}
