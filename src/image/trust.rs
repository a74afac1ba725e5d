//! What an image build may reach and where its cache mounts live, as the host decides
//! them (`host::build_scope`, `host::builds`): the build's trust, its scope (the
//! namespace of its cache mounts, `BUILDKIT_CACHE_MOUNT_NS`), and its grants (the
//! network its `RUN` steps get, the secrets it may be given). Data only: the image
//! room builds with what it is handed.

/// The network a build's `RUN` steps get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildNetwork {
    /// The engine's default network.
    Bridge,
    /// The loopback only.
    None,
    /// The host's network.
    Host,
}

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
    pub network: BuildNetwork,
    pub secrets: GrantedSecrets,
}

impl BuildGrants {
    /// The defaults for `trust`: the engine's default network either way (a build
    /// installs its dependencies); any secret for merged code, none for other code.
    pub fn default_for(trust: BuildTrust) -> BuildGrants {
        BuildGrants {
            network: BuildNetwork::Bridge,
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
    pub fn allows_network(&self, asked: BuildNetwork) -> bool {
        asked == BuildNetwork::None || asked == self.network
    }

    /// The build request's `networkmode`: `None` for the engine's default network.
    pub fn network_mode(&self) -> Option<&'static str> {
        match self.network {
            BuildNetwork::Bridge => None,
            BuildNetwork::None => Some("none"),
            BuildNetwork::Host => Some("host"),
        }
    }

    pub fn summary(&self) -> String {
        let network = match self.network {
            BuildNetwork::Bridge => "bridge",
            BuildNetwork::None => "none",
            BuildNetwork::Host => "host",
        };
        let secrets = match &self.secrets {
            GrantedSecrets::Any => "any secret".to_string(),
            GrantedSecrets::Only(ids) if ids.is_empty() => "no secret".to_string(),
            GrantedSecrets::Only(ids) => format!("secrets {}", ids.join(", ")),
        };
        format!("network {network}, {secrets}")
    }
}

/// The build argument that namespaces BuildKit's cache mounts.
pub const CACHE_NS_ARG: &str = "BUILDKIT_CACHE_MOUNT_NS";

/// Which of the project's cache namespaces a build uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Merged code on a trusted host: the project's shared namespace.
    Trusted,
    /// A developer's build on a host without a policy: the project's own here.
    Local,
    /// One pull request's build: that pull request's namespace.
    PullRequest(u64),
    /// A namespace of this build alone, and why.
    Private { why: String },
}

/// A build's scope, its trust (which picks its grants), and the namespace its cache
/// mounts get.
#[derive(Debug, Clone)]
pub struct BuildScope {
    pub scope: Scope,
    pub trust: BuildTrust,
    /// The value of [`CACHE_NS_ARG`]: `cibox:` and 64 hex digits.
    pub namespace: String,
}

/// The namespace of `project`'s `scope` (`nonce`: a private one's own): `cibox:` and the
/// hex of a SHA-256 over both, each with its length, so that no project name (one with
/// `/` in it, say) names another project's or another scope's.
pub fn namespace(project: &str, scope: &Scope, nonce: &str) -> String {
    use sha2::Digest;
    let scope = match scope {
        Scope::Trusted => "trusted".to_string(),
        Scope::Local => "local".to_string(),
        Scope::PullRequest(n) => format!("pull/{n}"),
        Scope::Private { .. } => format!("private/{nonce}"),
    };
    let mut h = sha2::Sha256::new();
    for part in ["cibox build cache mounts v1", project, &scope] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    format!("cibox:{}", crate::util::hex(&h.finalize()))
}

impl BuildScope {
    /// One line for the build's progress: whose cache mounts it uses, and why.
    pub fn describe(&self, project: &str) -> String {
        match &self.scope {
            Scope::Trusted => format!(
                "project {project}'s shared namespace (a trusted build: the host's caches.trusted, and merged code)"
            ),
            Scope::Local => format!(
                "project {project}'s own namespace on this machine (no host policy, and no CI job)"
            ),
            Scope::PullRequest(n) => format!(
                "pull request {n}'s own namespace (the host's caches.pull_requests: keep): no other pull request's build, nor a trusted one, reads it"
            ),
            Scope::Private { why } => format!(
                "a namespace of this build alone ({why}): nothing it writes is read by another build"
            ),
        }
    }
}
