//! The host policy: one YAML file that the host's admin owns (`/etc/cibox/host.yaml`,
//! or `CIBOX_HOST_POLICY`), saying what batches on this host may be granted beyond the
//! locked-down default, and the host's GPU facts. A project's manifest only asks; a
//! pull request writes the manifest, so what it asks is granted only where this file
//! says so (docs/interface.md §13).
//!
//! The file must be one nobody but root (or the invoking user, when cibox is not root)
//! can change: owned by them, not writable by group or others, reached through folders
//! only they can change. A planted or loosely owned policy is refused, never read.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::admin_file::{read_small, trusted_file};
pub use super::builds::{BuildGrants, BuildPolicy, BuildTrust};
use super::builds::{RawBuilds, build_policy};
use super::caches::{CachePolicy, RawCaches, cache_policy};
use super::devices::{SeccompProfile, device_grants};
pub use super::error::PolicyError;
use super::scheduler::{RawScheduler, RawSlurm, Scheduler};
use crate::manifest::{
    CAP_ADD_ALLOWED, ContainerUser, IdlePolicy, Network, PoolSpec, ProbeChoice, ULIMIT_NAMES,
};
use crate::yaml::{self, Mark};
use std::collections::BTreeMap;

/// Where the host policy is, unless `CIBOX_HOST_POLICY` names another file.
pub const DEFAULT_PATH: &str = "/etc/cibox/host.yaml";

/// Environment variables that never pass into a batch, whatever a policy says: the
/// runner's and GitHub's credentials, the engine's, and cibox's own settings.
const NEVER_PASSED: [&str; 7] = [
    "ACTIONS_*",
    "RUNNER_*",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "GITHUB_PAT",
    "DOCKER_*",
    "SSH_AUTH_SOCK",
];

/// Whether `name` may never pass into a batch; the pattern that says so.
pub fn never_passed(name: &str) -> Option<&'static str> {
    NEVER_PASSED
        .iter()
        .chain(super::ci_tokens::CI_AGENT_TOKENS)
        .copied()
        .find(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == *p,
        })
}

/// The host's GPU facts, where the policy states them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostGpu {
    /// The GPUs CI may use on this host: a manifest may choose among them, not beyond.
    pub pool: Option<PoolSpec>,
    pub lock_dir: Option<PathBuf>,
    pub probe: Option<ProbeChoice>,
    pub allow_network_lock_dir: Option<bool>,
    pub idle: Option<IdlePolicy>,
}

/// A folder under which read-only mounts may be granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRoot {
    pub root: PathBuf,
    /// The admin vouches that nothing below is a socket, device or FIFO worth hiding:
    /// cibox does not look (for trees too big to walk before every run).
    pub special_files: bool,
}

/// What batches on this host may be granted, when their manifest asks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    pub mounts: Vec<MountRoot>,
    /// `root`, or `UID:GID`.
    pub users: Vec<ContainerUser>,
    /// `user: root` with host mounts, on an engine without user namespaces: uid 0 then
    /// reads every root-owned file below the mounts. Only when the policy says so.
    pub root_with_mounts: bool,
    pub ipc_host: bool,
    /// `bridge`, `host` (`none` is the default and needs no grant).
    pub network: Vec<Network>,
    pub cap_add: Vec<String>,
    /// ulimit names a batch may set.
    pub ulimits: Vec<String>,
    /// Host variables a batch's `pass_env` may name.
    pub pass_env: Vec<String>,
    /// Host device paths or patterns a batch may be given.
    pub devices: Vec<String>,
    /// Seccomp profiles a batch may name.
    pub seccomp: BTreeMap<String, SeccompProfile>,
}

/// Where the policy in force was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySource {
    pub path: PathBuf,
    /// `sha256:` of the file's bytes, recorded with what it granted.
    pub digest: String,
}

/// The policy in force on this host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostPolicy {
    /// `None`: this host has no policy; only the locked-down default runs.
    pub source: Option<PolicySource>,
    pub gpu: HostGpu,
    pub grants: Grants,
    /// Caches, where the host grants them.
    pub caches: Option<CachePolicy>,
    /// How batches run: here, or as Slurm jobs.
    pub scheduler: Scheduler,
    /// What image builds' steps get, by trust (the defaults without a `builds:`).
    pub builds: BuildPolicy,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    version: u32,
    #[serde(default)]
    gpu: RawGpu,
    #[serde(default)]
    grants: RawGrants,
    caches: Option<RawCaches>,
    builds: Option<RawBuilds>,
    scheduler: Option<RawScheduler>,
    slurm: Option<RawSlurm>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpu {
    pool: Option<PoolSpec>,
    lock_dir: Option<PathBuf>,
    probe: Option<ProbeChoice>,
    allow_network_lock_dir: Option<bool>,
    idle: Option<IdlePolicy>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrants {
    #[serde(default)]
    mounts: Vec<RawMountRoot>,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    root_with_mounts: bool,
    #[serde(default)]
    ipc_host: bool,
    #[serde(default)]
    network: Vec<Network>,
    #[serde(default)]
    cap_add: Vec<String>,
    #[serde(default)]
    ulimits: Vec<String>,
    #[serde(default)]
    pass_env: Vec<String>,
    #[serde(default)]
    devices: Vec<String>,
    #[serde(default)]
    seccomp: BTreeMap<String, String>,
}

/// A mount root: a path, or `{root: PATH, special_files: allow | refuse}`. Read as
/// any value and checked key by key in [`grants`], so an unknown key (a misspelt
/// `special_file: allow`) is refused at its place rather than taken for nothing.
#[derive(Deserialize)]
#[serde(transparent)]
struct RawMountRoot(serde_json::Value);

#[derive(Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum SpecialFiles {
    #[default]
    Refuse,
    Allow,
}

impl HostPolicy {
    /// The policy in force: the file `CIBOX_HOST_POLICY` names (which must exist), else
    /// [`DEFAULT_PATH`] when it exists, else none.
    pub fn load() -> Result<HostPolicy, PolicyError> {
        match std::env::var_os("CIBOX_HOST_POLICY").filter(|v| !v.is_empty()) {
            Some(path) => HostPolicy::load_from(Path::new(&path)),
            None if std::fs::symlink_metadata(DEFAULT_PATH).is_ok() => {
                HostPolicy::load_from(Path::new(DEFAULT_PATH))
            }
            None => Ok(HostPolicy::default()),
        }
    }

    /// Reads the policy at `path`, once it is shown to be the admin's.
    pub fn load_from(path: &Path) -> Result<HostPolicy, PolicyError> {
        let shown = path.display().to_string();
        let unusable = |message: String| PolicyError::Unusable {
            path: shown.clone(),
            message,
        };
        if !path.is_absolute() {
            return Err(unusable("must be an absolute path".into()));
        }
        let real = std::fs::canonicalize(path).map_err(|e| unusable(e.to_string()))?;
        // Named as it is: a link on the way could be re-pointed by whoever owns it.
        if real != path {
            return Err(unusable(format!(
                "is reached through a link (it resolves to {}); name the file itself",
                real.display()
            )));
        }
        if let Some(folder) = super::runner::pull_request_folders()
            .into_iter()
            .find(|f| real.starts_with(f))
        {
            return Err(unusable(format!(
                "lies in {}, where a pull request's files are; the host's policy lives outside every checkout",
                folder.display()
            )));
        }
        trusted_file(&real).map_err(&unusable)?;
        let bytes = read_small(&real).map_err(&unusable)?;
        let text = String::from_utf8(bytes.clone()).map_err(|_| unusable("is not UTF-8".into()))?;
        let mut policy = HostPolicy::parse(&text, &shown)?;
        policy.source = Some(PolicySource {
            path: real,
            digest: format!("sha256:{}", crate::util::hex(&Sha256::digest(&bytes))),
        });
        Ok(policy)
    }

    /// Parses a policy's text (`shown` names it in errors).
    pub fn parse(text: &str, shown: &str) -> Result<HostPolicy, PolicyError> {
        let at = |mark: Mark, message: String| PolicyError::At {
            path: shown.to_string(),
            mark,
            message,
        };
        let root = yaml::parse(text)
            .map_err(|e| at(e.mark, format!("YAML syntax: {}", e.message)))?
            .ok_or_else(|| {
                at(
                    Mark { line: 1, col: 1 },
                    "is empty; start with `version: 1`".into(),
                )
            })?;
        let raw: RawPolicy = serde_path_to_error::deserialize(root.to_json()).map_err(|e| {
            let path: Vec<String> = e
                .path()
                .iter()
                .map(|s| {
                    s.to_string()
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_string()
                })
                .collect();
            let (unknown, message) = yaml::serde_words(&e.inner().to_string());
            let mut path = path;
            if let Some(bad) = unknown
                && path.last() != Some(&bad)
            {
                path.push(bad);
            }
            let node = root.locate(&path);
            let key = path.join(".");
            at(node.mark, format!("{key}: {message}"))
        })?;
        let here = |path: &[&str], message: String| {
            let key = path.join(".");
            at(root.locate(path).mark, format!("{key}: {message}"))
        };
        if raw.version != 1 {
            return Err(here(
                &["version"],
                "this cibox reads policy version 1".into(),
            ));
        }
        if let Some(dir) = &raw.gpu.lock_dir
            && !dir.is_absolute()
        {
            return Err(here(
                &["gpu", "lock_dir"],
                "must be an absolute path".into(),
            ));
        }
        let scheduler =
            super::scheduler::scheduler(raw.scheduler, raw.slurm).map_err(|(path, why)| {
                let path: Vec<&str> = path.iter().map(String::as_str).collect();
                here(&path, why)
            })?;
        Ok(HostPolicy {
            source: None,
            scheduler,
            gpu: HostGpu {
                pool: raw.gpu.pool,
                lock_dir: raw.gpu.lock_dir,
                probe: raw.gpu.probe,
                allow_network_lock_dir: raw.gpu.allow_network_lock_dir,
                idle: raw.gpu.idle,
            },
            grants: grants(raw.grants, &here)?,
            caches: match raw.caches {
                Some(c) => Some(cache_policy(c, &here)?),
                None => None,
            },
            builds: match raw.builds {
                Some(b) => build_policy(b, &here)?,
                None => BuildPolicy::default(),
            },
        })
    }

    /// What the policy grants, in one line: `nothing beyond the locked-down default`, or
    /// each grant.
    pub fn grants_summary(&self) -> String {
        let g = &self.grants;
        let list = |items: Vec<String>| items.join(", ");
        let mut parts = Vec::new();
        if !g.mounts.is_empty() {
            parts.push(format!(
                "mounts under {}",
                list(
                    g.mounts
                        .iter()
                        .map(|m| {
                            let vouched = if m.special_files { " (unchecked)" } else { "" };
                            format!("{}{vouched}", m.root.display())
                        })
                        .collect()
                )
            ));
        }
        if !g.users.is_empty() {
            parts.push(format!(
                "users {}",
                list(g.users.iter().map(ToString::to_string).collect())
            ));
        }
        if g.root_with_mounts {
            parts.push("root with mounts".into());
        }
        if g.ipc_host {
            parts.push("ipc host".into());
        }
        if !g.network.is_empty() {
            parts.push(format!(
                "network {}",
                list(
                    g.network
                        .iter()
                        .map(|n| serde_json::to_value(n)
                            .unwrap_or_default()
                            .as_str()
                            .unwrap_or_default()
                            .to_string())
                        .collect()
                )
            ));
        }
        for (what, items) in [
            ("cap_add", &g.cap_add),
            ("ulimits", &g.ulimits),
            ("pass_env", &g.pass_env),
        ] {
            if !items.is_empty() {
                parts.push(format!("{what} {}", list(items.clone())));
            }
        }
        if !g.devices.is_empty() {
            parts.push(format!("devices {}", list(g.devices.clone())));
        }
        if !g.seccomp.is_empty() {
            parts.push(format!(
                "seccomp {}",
                list(g.seccomp.keys().cloned().collect())
            ));
        }
        if let Some(c) = &self.caches {
            parts.push(c.summary());
        }
        if self.builds != BuildPolicy::default() {
            parts.push(self.builds.summary());
        }
        if parts.is_empty() {
            "nothing beyond the locked-down default".into()
        } else {
            format!("grants {}", parts.join("; "))
        }
    }

    /// What a build of `trust` gets: its `RUN` steps' network and the secrets it may be
    /// given (`builds.trusted` or `builds.untrusted`, else their defaults).
    pub fn build_grants(&self, trust: BuildTrust) -> BuildGrants {
        self.builds.grants(trust).clone()
    }

    /// `path (sha256:…)`, or that there is none.
    pub fn describe(&self) -> String {
        match &self.source {
            Some(s) => format!("{} ({})", s.path.display(), s.digest),
            None => format!("none ({DEFAULT_PATH} does not exist)"),
        }
    }
}

/// One mount root: a path, or a mapping of `root` and `special_files` and nothing
/// else. `here` places a refusal at the entry, or at one of its keys.
fn mount_root(
    raw: serde_json::Value,
    here: &dyn Fn(Option<&str>, String) -> PolicyError,
) -> Result<(PathBuf, bool), PolicyError> {
    const SHAPE: &str = "a mount root is a path, or `{root: PATH, special_files: allow}` (special_files: allow | refuse)";
    let map = match raw {
        serde_json::Value::String(p) => return Ok((PathBuf::from(p), false)),
        serde_json::Value::Object(map) => map,
        other => return Err(here(None, format!("`{other}` is not a path; {SHAPE}"))),
    };
    if let Some(key) = map
        .keys()
        .find(|k| !matches!(k.as_str(), "root" | "special_files"))
    {
        return Err(here(Some(key), format!("unknown key `{key}`; {SHAPE}")));
    }
    let root = match map.get("root") {
        Some(serde_json::Value::String(p)) => PathBuf::from(p),
        Some(other) => {
            return Err(here(
                Some("root"),
                format!("`{other}` is not a path; {SHAPE}"),
            ));
        }
        None => return Err(here(None, format!("has no `root`; {SHAPE}"))),
    };
    let special_files = match map.get("special_files") {
        None => false,
        Some(v) => match serde_json::from_value::<SpecialFiles>(v.clone()) {
            Ok(choice) => choice == SpecialFiles::Allow,
            Err(_) => {
                return Err(here(
                    Some("special_files"),
                    format!("`{v}` is neither `allow` nor `refuse`"),
                ));
            }
        },
    };
    Ok((root, special_files))
}

/// Checks each grant: names the engine and cibox know, nothing that may never be
/// granted.
fn grants(
    raw: RawGrants,
    here: &dyn Fn(&[&str], String) -> PolicyError,
) -> Result<Grants, PolicyError> {
    let mut mounts = Vec::new();
    for (i, m) in raw.mounts.into_iter().enumerate() {
        let i = i.to_string();
        let (root, special_files) = mount_root(m.0, &|key: Option<&str>, why: String| {
            let mut at = vec!["grants", "mounts", i.as_str()];
            at.extend(key);
            here(&at, why)
        })?;
        if !root.is_absolute() || root == Path::new("/") {
            return Err(here(
                &["grants", "mounts", &i],
                format!(
                    "`{}` must be an absolute folder other than /",
                    root.display()
                ),
            ));
        }
        crate::manifest::check_mount_source(&root).map_err(|why| {
            here(
                &["grants", "mounts", &i],
                format!("`{}` {why}", root.display()),
            )
        })?;
        mounts.push(MountRoot {
            root,
            special_files,
        });
    }
    let mut users = Vec::new();
    for (i, u) in raw.users.iter().enumerate() {
        users.push(match u.as_str() {
            "root" => ContainerUser::Root,
            text => {
                let id = |s: &str| s.parse::<u32>().ok().filter(|n| (1..u32::MAX).contains(n));
                match text
                    .split_once(':')
                    .and_then(|(u, g)| Some((id(u)?, id(g)?)))
                {
                    Some((u, g)) => ContainerUser::Ids(u, g),
                    None => {
                        return Err(here(
                            &["grants", "users", &i.to_string()],
                            format!("`{text}` is not `root` or `UID:GID`"),
                        ));
                    }
                }
            }
        });
    }
    let mut cap_add = Vec::new();
    for (i, cap) in raw.cap_add.iter().enumerate() {
        let name = cap.to_ascii_uppercase();
        let name = name.strip_prefix("CAP_").unwrap_or(&name).to_string();
        if !CAP_ADD_ALLOWED.contains(&name.as_str()) {
            return Err(here(
                &["grants", "cap_add", &i.to_string()],
                format!(
                    "`{cap}` is not one cibox gives back ({})",
                    CAP_ADD_ALLOWED.join(", ")
                ),
            ));
        }
        cap_add.push(name);
    }
    for (i, name) in raw.ulimits.iter().enumerate() {
        if !ULIMIT_NAMES.contains(&name.as_str()) {
            return Err(here(
                &["grants", "ulimits", &i.to_string()],
                format!("`{name}` is not a ulimit the engine knows"),
            ));
        }
    }
    for (i, name) in raw.pass_env.iter().enumerate() {
        if let Some(pattern) = never_passed(name) {
            return Err(here(
                &["grants", "pass_env", &i.to_string()],
                format!(
                    "`{name}` may never pass into a batch ({pattern}: credentials of the runner, GitHub or the engine)"
                ),
            ));
        }
    }
    let (devices, seccomp) = device_grants(raw.devices, raw.seccomp, here)?;
    Ok(Grants {
        devices,
        seccomp,
        mounts,
        users,
        root_with_mounts: raw.root_with_mounts,
        ipc_host: raw.ipc_host,
        network: raw
            .network
            .into_iter()
            .filter(|n| *n != Network::None)
            .collect(),
        cap_add,
        ulimits: raw.ulimits,
        pass_env: raw.pass_env,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = "version: 1\ngpu: {pool: [0, 1], lock_dir: /run/lock/ci, probe: nvml}\ngrants:\n  mounts: [/data/models, {root: /data/sets, special_files: allow}]\n  users: [root, \"1000:1000\"]\n  ipc_host: true\n  network: [bridge]\n  cap_add: [cap_ipc_lock]\n  ulimits: [memlock]\n  pass_env: [HF_TOKEN]\n";

    #[test]
    fn a_policy_says_what_it_grants() {
        let p = HostPolicy::parse(FULL, "host.yaml").unwrap();
        assert_eq!(p.gpu.lock_dir.as_deref(), Some(Path::new("/run/lock/ci")));
        assert_eq!(p.gpu.probe, Some(ProbeChoice::Nvml));
        assert_eq!(
            p.grants.mounts,
            [
                MountRoot {
                    root: "/data/models".into(),
                    special_files: false
                },
                MountRoot {
                    root: "/data/sets".into(),
                    special_files: true
                }
            ]
        );
        assert_eq!(
            p.grants.users,
            [ContainerUser::Root, ContainerUser::Ids(1000, 1000)]
        );
        assert_eq!(p.grants.cap_add, ["IPC_LOCK"]);
        assert_eq!(p.grants.network, [Network::Bridge]);
        assert!(p.grants.ipc_host && !p.grants.root_with_mounts);
    }

    #[test]
    fn bad_policies_are_refused_with_a_position() {
        let bad = |text: &str, want: &str| {
            let e = HostPolicy::parse(text, "host.yaml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        };
        bad(
            "version: 2\n",
            "host.yaml:1:10: version: this cibox reads policy version 1",
        );
        bad(
            "version: 1\ngrants: {pass_env: [ACTIONS_RUNTIME_TOKEN]}\n",
            "may never pass",
        );
        bad(
            "version: 1\ngrants: {pass_env: [GITHUB_TOKEN]}\n",
            "may never pass",
        );
        bad(
            "version: 1\ngrants: {mounts: [/]}\n",
            "absolute folder other than /",
        );
        bad(
            "version: 1\ngrants: {mounts: [/var/run/docker.sock]}\n",
            "grants.mounts.0",
        );
        bad(
            "version: 1\ngrants: {cap_add: [SYS_ADMIN]}\n",
            "is not one cibox gives back",
        );
        bad(
            "version: 1\ngrants: {users: [\"0:0\"]}\n",
            "is not `root` or `UID:GID`",
        );
        bad(
            "version: 1\ngrants: {mount: []}\n",
            "unknown key `mount`; did you mean `mounts`?",
        );
        bad(
            "version: 1\ngrants:\n  mounts: [{root: /data, special_file: allow}]\n",
            "host.yaml:3:",
        );
        bad(
            "version: 1\ngrants: {mounts: [{root: /data, special_file: allow}]}\n",
            "grants.mounts.0.special_file: unknown key `special_file`",
        );
        bad(
            "version: 1\ngrants: {mounts: [{root: /data, special_files: maybe}]}\n",
            "grants.mounts.0.special_files: `\"maybe\"` is neither",
        );
        bad("version: 1\ngrants: {mounts: [[/data]]}\n", "is not a path");
        bad(
            "version: 1\ngpu: {lock_dir: locks}\n",
            "must be an absolute path",
        );
        bad("", "is empty");
    }

    #[test]
    fn never_passed_names() {
        assert_eq!(never_passed("ACTIONS_RUNTIME_TOKEN"), Some("ACTIONS_*"));
        assert_eq!(never_passed("RUNNER_TEMP"), Some("RUNNER_*"));
        assert_eq!(never_passed("GITHUB_TOKEN"), Some("GITHUB_TOKEN"));
        assert_eq!(never_passed("HF_TOKEN"), None);
        assert_eq!(never_passed("GITHUB_SHA"), None);
    }

    #[test]
    fn a_policy_others_could_change_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.yaml");
        std::fs::write(&path, "version: 1\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let p = HostPolicy::load_from(&path).unwrap();
        assert!(p.source.unwrap().digest.starts_with("sha256:"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = HostPolicy::load_from(&path).unwrap_err().to_string();
        assert!(
            e.contains("with mode 666") && e.contains("writable by nobody else"),
            "{e}"
        );
    }
}
