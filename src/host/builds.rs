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
use crate::manifest::Network;

/// Whose code a build runs, as far as the host can tell: it picks the build's grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildTrust {
    /// Merged code: on a host with a policy, one that says only the base branch's
    /// workflows reach it (`caches.trusted`) and an event that runs merged code; on a
    /// host without one, anything but an event that may run code nobody merged.
    Trusted,
    /// Anything else: a pull request's build, a dispatch's, a merge queue's.
    Untrusted,
}

impl BuildTrust {
    /// The policy's key for this trust (`builds.KEY`).
    pub fn key(self) -> &'static str {
        match self {
            BuildTrust::Trusted => "trusted",
            BuildTrust::Untrusted => "untrusted",
        }
    }
}

/// The secrets a build may be given (`--secret`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantedSecrets {
    /// Whichever the command line gives.
    Any,
    /// These IDs only (none when empty).
    Only(Vec<String>),
}

impl GrantedSecrets {
    /// Whether a secret of this ID may be given.
    pub fn allows(&self, id: &str) -> bool {
        match self {
            GrantedSecrets::Any => true,
            GrantedSecrets::Only(ids) => ids.iter().any(|i| i == id),
        }
    }
}

/// What a build's `RUN` steps get: its network and the secrets it may be given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildGrants {
    /// The network every `RUN` step gets (`bridge`: the engine's default).
    pub network: Network,
    pub secrets: GrantedSecrets,
}

impl BuildGrants {
    /// The defaults for `trust`: the engine's default network either way (a build
    /// installs its dependencies); any secret for merged code, none for other code.
    pub fn default_for(trust: BuildTrust) -> BuildGrants {
        BuildGrants {
            network: Network::Bridge,
            secrets: match trust {
                BuildTrust::Trusted => GrantedSecrets::Any,
                BuildTrust::Untrusted => GrantedSecrets::Only(Vec::new()),
            },
        }
    }

    /// Whether a step may ask for the network `asked` (`RUN --network=…`): `none`
    /// always; the build's own network; never more than it (`host` over `bridge`).
    /// For the Dockerfile reader's check of `RUN --network` flags (Docker 20.10's own
    /// frontend refuses the flag: "Unknown flag: network").
    #[allow(dead_code)]
    pub fn allows_network(&self, asked: Network) -> bool {
        asked == Network::None || asked == self.network
    }

    /// The build request's `networkmode`: `None` for the engine's default network.
    pub fn network_mode(&self) -> Option<&'static str> {
        match self.network {
            Network::Bridge => None,
            Network::None => Some("none"),
            Network::Host => Some("host"),
        }
    }

    fn summary(&self) -> String {
        let network = match self.network {
            Network::Bridge => "bridge",
            Network::None => "none",
            Network::Host => "host",
        };
        let secrets = match &self.secrets {
            GrantedSecrets::Any => "any secret".to_string(),
            GrantedSecrets::Only(ids) if ids.is_empty() => "no secret".to_string(),
            GrantedSecrets::Only(ids) => format!("secrets {}", ids.join(", ")),
        };
        format!("network {network}, {secrets}")
    }
}

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
            grants.network = network;
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
        assert_eq!(trusted.network, Network::Bridge);
        assert_eq!(trusted.network_mode(), None);
        assert!(trusted.secrets.allows("hf.token") && !trusted.secrets.allows("other"));
        let untrusted = p.build_grants(BuildTrust::Untrusted);
        assert_eq!(untrusted.network_mode(), Some("none"));
        assert!(!untrusted.secrets.allows("pip_token"));
        assert!(untrusted.allows_network(Network::None));
        assert!(!untrusted.allows_network(Network::Host));
        assert!(!untrusted.allows_network(Network::Bridge));
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
                    network: Network::Bridge,
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
        assert!(g.allows_network(Network::Host) && g.secrets.allows("x"));
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
            "builds.trusted.netwrok: unknown field `netwrok`",
        );
        bad(
            "version: 1\nbuilds: {pull_requests: {network: none}}\n",
            "builds.pull_requests: unknown field `pull_requests`",
        );
        bad(
            "version: 1\nbuilds:\n  untrusted: {network: internet}\n",
            "host.yaml:3:",
        );
        bad(
            "version: 1\nbuilds: {untrusted: {network: internet}}\n",
            "builds.untrusted.network: unknown variant `internet`",
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
