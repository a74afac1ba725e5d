//! The policy's `builds:` section: what an image build's `RUN` steps get, by the
//! build's trust. A pull request writes the Dockerfile, so what its steps may reach
//! (the network, the secrets `--secret` gives) is for the host to grant, never the
//! manifest, and a build of code nobody merged gets less than one of merged code.
//!
//! ```yaml
//! builds:
//!   trusted: {network: bridge, secrets: any}   # the defaults
//!   untrusted: {network: none, secrets: [pip_token]}
//! ```

use serde::Deserialize;

use super::error::PolicyError;
pub use crate::image::trust::{BuildGrants, BuildNetwork, BuildTrust, GrantedSecrets};
use crate::manifest::Network;

/// `builds:`, each trust's grants (the defaults where it says nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildPolicy {
    pub trusted: BuildGrants,
    pub untrusted: BuildGrants,
}

impl Default for BuildPolicy {
    fn default() -> Self {
        BuildPolicy {
            trusted: BuildGrants::default_for(BuildTrust::Trusted),
            untrusted: BuildGrants::default_for(BuildTrust::Untrusted),
        }
    }
}

impl BuildPolicy {
    /// The grants of a build of `trust`.
    pub fn grants(&self, trust: BuildTrust) -> &BuildGrants {
        match trust {
            BuildTrust::Trusted => &self.trusted,
            BuildTrust::Untrusted => &self.untrusted,
        }
    }

    /// One line for `cibox host policy` and `doctor`.
    pub fn summary(&self) -> String {
        format!(
            "image builds: trusted {}; untrusted {}",
            self.trusted.summary(),
            self.untrusted.summary()
        )
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBuilds {
    trusted: Option<RawBuildGrants>,
    untrusted: Option<RawBuildGrants>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBuildGrants {
    network: Option<Network>,
    /// `any`, or a list of secret IDs: read in [`secrets`].
    secrets: Option<serde_json::Value>,
}

/// Reads `builds:`; `here` places an error at a key.
pub(super) fn build_policy(
    raw: RawBuilds,
    here: &dyn Fn(&[&str], String) -> PolicyError,
) -> Result<BuildPolicy, PolicyError> {
    let mut policy = BuildPolicy::default();
    for (trust, raw) in [
        (BuildTrust::Trusted, raw.trusted),
        (BuildTrust::Untrusted, raw.untrusted),
    ] {
        let Some(raw) = raw else { continue };
        let grants = match trust {
            BuildTrust::Trusted => &mut policy.trusted,
            BuildTrust::Untrusted => &mut policy.untrusted,
        };
        if let Some(network) = raw.network {
            grants.network = match network {
                Network::Bridge => BuildNetwork::Bridge,
                Network::None => BuildNetwork::None,
                Network::Host => BuildNetwork::Host,
            };
        }
        if let Some(value) = raw.secrets {
            grants.secrets = secrets(value, &|at: &[&str], why| {
                let mut path = vec!["builds", trust.key(), "secrets"];
                path.extend(at);
                here(&path, why)
            })?;
        }
    }
    Ok(policy)
}

/// `secrets`: `any`, or a list of IDs (`--secret id=ID`'s).
fn secrets(
    value: serde_json::Value,
    here: &dyn Fn(&[&str], String) -> PolicyError,
) -> Result<GrantedSecrets, PolicyError> {
    const SHAPE: &str = "secrets is `any`, or a list of the secret IDs a build may be given";
    let items = match value {
        serde_json::Value::String(s) if s == "any" => return Ok(GrantedSecrets::Any),
        serde_json::Value::Array(items) => items,
        other => return Err(here(&[], format!("`{other}`: {SHAPE}"))),
    };
    let mut ids = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let id = item.as_str().filter(|id| {
            !id.is_empty()
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        });
        let Some(id) = id else {
            return Err(here(
                &[&i.to_string()],
                format!("`{item}` is not a secret ID (letters, digits, `_`, `-` and `.`)"),
            ));
        };
        ids.push(id.to_string());
    }
    Ok(GrantedSecrets::Only(ids))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostPolicy;

    #[test]
    fn each_trust_gets_what_the_policy_says_and_the_defaults_elsewhere() {
        let p = HostPolicy::parse(
            "version: 1\nbuilds:\n  trusted: {secrets: [pip_token, hf.token]}\n  untrusted: {network: none}\n",
            "host.yaml",
        )
        .unwrap();
        let trusted = p.build_grants(BuildTrust::Trusted);
        assert_eq!(trusted.network, BuildNetwork::Bridge);
        assert_eq!(trusted.network_mode(), None);
        assert!(trusted.secrets.allows("hf.token") && !trusted.secrets.allows("other"));
        let untrusted = p.build_grants(BuildTrust::Untrusted);
        assert_eq!(untrusted.network_mode(), Some("none"));
        assert!(!untrusted.secrets.allows("pip_token"));
        assert!(untrusted.allows_network(BuildNetwork::None));
        assert!(!untrusted.allows_network(BuildNetwork::Host));
        assert!(!untrusted.allows_network(BuildNetwork::Bridge));
        assert_eq!(
            p.builds.summary(),
            "image builds: trusted network bridge, secrets pip_token, hf.token; untrusted network none, no secret"
        );
        // No section, or no policy: the engine's network, any secret for merged code
        // only.
        for p in [
            HostPolicy::default(),
            HostPolicy::parse("version: 1\n", "host.yaml").unwrap(),
        ] {
            assert_eq!(
                p.build_grants(BuildTrust::Trusted),
                BuildGrants {
                    network: BuildNetwork::Bridge,
                    secrets: GrantedSecrets::Any
                }
            );
            assert_eq!(
                p.build_grants(BuildTrust::Untrusted).secrets,
                GrantedSecrets::Only(vec![])
            );
        }
        let host = HostPolicy::parse(
            "version: 1\nbuilds: {trusted: {network: host, secrets: any}}\n",
            "host.yaml",
        )
        .unwrap();
        let g = host.build_grants(BuildTrust::Trusted);
        assert_eq!(g.network_mode(), Some("host"));
        assert!(g.allows_network(BuildNetwork::Host) && g.secrets.allows("x"));
    }

    #[test]
    fn a_bad_builds_section_is_refused_at_its_place() {
        let bad = |text: &str, want: &str| {
            let e = HostPolicy::parse(text, "host.yaml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        };
        bad(
            "version: 1\nbuilds: {trusted: {netwrok: none}}\n",
            "builds.trusted.netwrok: unknown key `netwrok`; did you mean `network`?",
        );
        bad(
            "version: 1\nbuilds: {pull_requests: {network: none}}\n",
            "builds.pull_requests: unknown key `pull_requests`",
        );
        bad(
            "version: 1\nbuilds:\n  untrusted: {network: internet}\n",
            "host.yaml:3:",
        );
        bad(
            "version: 1\nbuilds: {untrusted: {network: internet}}\n",
            "builds.untrusted.network: `internet` is not allowed here; expected one of none, bridge, host",
        );
        bad(
            "version: 1\nbuilds:\n  untrusted:\n    secrets: [ok, \"a b\"]\n",
            "host.yaml:4:19: builds.untrusted.secrets.1: `\"a b\"` is not a secret ID",
        );
        bad(
            "version: 1\nbuilds: {trusted: {secrets: all}}\n",
            "builds.trusted.secrets: `\"all\"`: secrets is `any`, or a list",
        );
    }
}
