//! The policy's `caches:` section: where a project's caches live on this host, how
//! big each may grow, and whether runs here write through. Only the host can say the
//! last: in a job a pull request's workflow runs, every variable and flag cibox sees is
//! the pull request's to set; a host that only trusted workflows reach (a runner group
//! restricted to protected branches, say) can say so here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::PolicyError;
use crate::units::Size;

/// What the host grants for caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachePolicy {
    /// The store, as cibox sees it.
    pub root: PathBuf,
    /// The store as the engine sees it, when cibox runs in a container of the engine's
    /// host and the policy says so (else it is found from the engine, or is `root`).
    pub host_root: Option<PathBuf>,
    /// The most a cache may hold, unless `sizes` names it.
    pub size: u64,
    /// Caps by `PROJECT/NAME`.
    pub sizes: BTreeMap<String, u64>,
    /// The memory-backed layer an untrusted run writes into, per cache.
    pub private_size: u64,
    /// Runs on this host write through.
    pub trusted: bool,
    /// Projects whose manifests may use caches here, and whose repository each is.
    pub projects: CacheProjects,
    /// Whether a pull request's passing run keeps its writes, in a scope of its own.
    pub pull_requests: PullRequestScopes,
}

/// `caches.pull_requests` (with `pull_request_size` and `pull_request_expiry`): a
/// pull request's run reads the base branch's generation with its own scope laid over
/// it, and, when it passes, keeps what it wrote in that scope only: never in the base,
/// never where another pull request or a base run reads. Only a host whose workflows
/// are all the base branch's (`trusted: true`) can believe an event's pull request
/// number, and a number means something only within its repository (`projects` as a
/// mapping): the policy is refused otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequestScopes {
    /// `keep`: kept in the pull request's scope; `off` (default): private, as before.
    pub keep: bool,
    /// The most a scope holds of one cache; `None`: the cache's own cap.
    pub size: Option<u64>,
    /// A scope no run used for this long goes (at a promotion or a prune).
    pub expiry: std::time::Duration,
}

/// A scope unused for two weeks goes.
pub const DEFAULT_SCOPE_EXPIRY: std::time::Duration = std::time::Duration::from_secs(14 * 86_400);

impl Default for PullRequestScopes {
    fn default() -> Self {
        PullRequestScopes {
            keep: false,
            size: None,
            expiry: DEFAULT_SCOPE_EXPIRY,
        }
    }
}

/// `caches.projects`: which projects may use caches here. A manifest names its own
/// project, so on a host that serves several repositories a pull request of one could
/// name another's; the mapping binds each project to its repository (`OWNER/NAME`, as
/// `GITHUB_REPOSITORY` says it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CacheProjects {
    /// Any project (no `projects`): a host that serves one repository.
    #[default]
    Any,
    /// `projects: [slime]`: these, from whichever repository (one served).
    Listed(Vec<String>),
    /// `projects: {slime: THUDM/slime}`: these, each from its repository only.
    Bound(BTreeMap<String, String>),
}

impl CacheProjects {
    /// Why `project`, in a run of `repository` (`GITHUB_REPOSITORY`), may not use
    /// caches here; `None` when it may.
    pub fn refusal(&self, project: &str, repository: Option<&str>) -> Option<String> {
        let unlisted =
            || format!("the host policy's caches.projects does not list project `{project}`");
        match self {
            CacheProjects::Any => None,
            CacheProjects::Listed(list) => (!list.iter().any(|p| p == project)).then(unlisted),
            CacheProjects::Bound(map) => {
                let Some(owner) = map.get(project) else {
                    return Some(unlisted());
                };
                match repository.map(str::trim).filter(|r| !r.is_empty()) {
                    Some(r) if r.eq_ignore_ascii_case(owner) => None,
                    Some(r) => Some(format!(
                        "the host policy's caches.projects binds project `{project}` to the repository {owner}, and this run is of {} (GITHUB_REPOSITORY): a project's caches are its own repository's; name this repository's own project in the manifest",
                        crate::util::escape(r)
                    )),
                    None => Some(format!(
                        "the host policy's caches.projects binds project `{project}` to the repository {owner}, and GITHUB_REPOSITORY is not set, so this run's repository is not known; set it to {owner} where the run is that repository's (a GitHub Actions job sets it)"
                    )),
                }
            }
        }
    }
}

impl CachePolicy {
    /// The cap of `project`'s cache `name`.
    pub fn cap(&self, project: &str, name: &str) -> u64 {
        self.sizes
            .get(&format!("{project}/{name}"))
            .copied()
            .unwrap_or(self.size)
    }

    /// The cap of pull request scopes of `project`'s cache `name`.
    pub fn scope_cap(&self, project: &str, name: &str) -> u64 {
        self.pull_requests
            .size
            .unwrap_or_else(|| self.cap(project, name))
    }

    /// One line for `cibox host policy` and `doctor`.
    pub fn summary(&self) -> String {
        format!(
            "caches in {} ({} each, {} private layer; {})",
            self.root.display(),
            Size(self.size),
            Size(self.private_size),
            match (self.trusted, self.pull_requests.keep) {
                (true, true) =>
                    "base-branch runs here write through; a pull request's into its own scope",
                (true, false) => "runs here write through",
                _ => "no run here writes through",
            }
        )
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCaches {
    root: PathBuf,
    host_root: Option<PathBuf>,
    size: Option<Size>,
    #[serde(default)]
    sizes: BTreeMap<String, Size>,
    private_size: Option<Size>,
    #[serde(default)]
    trusted: bool,
    /// A list of projects, or a mapping of project to repository: read in
    /// [`cache_projects`].
    projects: Option<serde_json::Value>,
    /// `off` or `keep`.
    pull_requests: Option<String>,
    pull_request_size: Option<Size>,
    pull_request_expiry: Option<crate::units::Span>,
}

/// Reads `caches:`; `here` places an error at a key.
pub(super) fn cache_policy(
    raw: RawCaches,
    here: &dyn Fn(&[&str], String) -> PolicyError,
) -> Result<CachePolicy, PolicyError> {
    for (key, path) in [
        ("root", Some(&raw.root)),
        ("host_root", raw.host_root.as_ref()),
    ] {
        // The engine hands the paths to the kernel in one option string.
        if let Some(p) = path
            && (!p.is_absolute()
                || p == Path::new("/")
                || p.components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
                || p.to_str()
                    .is_none_or(|s| s.contains([',', ':']) || s.chars().any(char::is_control)))
        {
            return Err(here(
                &["caches", key],
                format!(
                    "`{}` must be an absolute folder other than /, without `..`, `,`, `:` or control characters",
                    p.display()
                ),
            ));
        }
    }
    for name in raw.sizes.keys() {
        let ok = name.split_once('/').is_some_and(|(p, n)| {
            crate::cache::is_folder_name(p) && crate::cache::is_folder_name(n)
        });
        if !ok {
            return Err(here(
                &["caches", "sizes", name],
                format!("`{name}` is not `PROJECT/NAME`"),
            ));
        }
    }
    let keep = match raw.pull_requests.as_deref() {
        None | Some("off") => false,
        Some("keep") => true,
        Some(other) => {
            return Err(here(
                &["caches", "pull_requests"],
                format!(
                    "`{}`: write `off` (a pull request's writes are private) or `keep` (kept in its own scope)",
                    crate::util::escape(other)
                ),
            ));
        }
    };
    let projects = match raw.projects {
        None => CacheProjects::Any,
        Some(v) => cache_projects(v, here)?,
    };
    if keep && !raw.trusted {
        return Err(here(
            &["caches", "pull_requests"],
            "`keep` needs `trusted: true`: a pull request's number is believed only where every workflow that reaches this host is the base branch's (a workflow a pull request controls can write any event file)".into(),
        ));
    }
    if keep && !matches!(projects, CacheProjects::Bound(_)) {
        return Err(here(
            &["caches", "pull_requests"],
            "`keep` needs `projects` as a mapping of each project to its repository (`{slime: THUDM/slime}`): a pull request's number means something only within its repository".into(),
        ));
    }
    let pull_requests = PullRequestScopes {
        keep,
        size: raw.pull_request_size.map(|s| s.0),
        expiry: raw
            .pull_request_expiry
            .map_or(DEFAULT_SCOPE_EXPIRY, |s| s.0),
    };
    Ok(CachePolicy {
        root: raw.root,
        host_root: raw.host_root,
        size: raw.size.map_or(10 << 30, |s| s.0),
        sizes: raw.sizes.into_iter().map(|(k, v)| (k, v.0)).collect(),
        private_size: raw.private_size.map_or(1 << 30, |s| s.0),
        trusted: raw.trusted,
        projects,
        pull_requests,
    })
}

/// `caches.projects`: `[PROJECT, …]`, or `{PROJECT: OWNER/NAME, …}`.
fn cache_projects(
    raw: serde_json::Value,
    here: &dyn Fn(&[&str], String) -> PolicyError,
) -> Result<CacheProjects, PolicyError> {
    const SHAPE: &str = "caches.projects is a list of projects, or a mapping of each project to its repository (`{slime: THUDM/slime}`)";
    let project = |at: &[&str], name: &str| {
        if crate::cache::is_folder_name(name) {
            Ok(name.to_string())
        } else {
            Err(here(at, format!("`{name}` is not a project name")))
        }
    };
    match raw {
        serde_json::Value::Array(items) => {
            let mut out = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let i = i.to_string();
                let at = ["caches", "projects", i.as_str()];
                let Some(name) = item.as_str() else {
                    return Err(here(
                        &at,
                        format!("`{item}` is not a project name; {SHAPE}"),
                    ));
                };
                out.push(project(&at, name)?);
            }
            Ok(CacheProjects::Listed(out))
        }
        serde_json::Value::Object(map) => {
            let mut out = BTreeMap::new();
            for (name, repo) in &map {
                let at = ["caches", "projects", name.as_str()];
                let name = project(&at, name)?;
                let repo = repo.as_str().filter(|r| is_repository(r)).ok_or_else(|| {
                    here(
                        &at,
                        format!("`{repo}` is not a repository as GITHUB_REPOSITORY names one (`OWNER/NAME`)"),
                    )
                })?;
                out.insert(name, repo.to_string());
            }
            Ok(CacheProjects::Bound(out))
        }
        other => Err(here(&["caches", "projects"], format!("`{other}`: {SHAPE}"))),
    }
}

/// `OWNER/NAME`, of the letters, digits and marks GitHub allows in them.
fn is_repository(text: &str) -> bool {
    let part = |s: &str, marks: &[u8]| {
        !s.is_empty()
            && s.len() <= 100
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || marks.contains(&b))
    };
    text.split_once('/').is_some_and(|(owner, name)| {
        part(owner, b"-") && part(name, b"-_.") && name != "." && name != ".."
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostPolicy;

    fn projects(text: &str) -> Result<CacheProjects, String> {
        HostPolicy::parse(
            &format!("version: 1\ncaches: {{root: /var/cache/c, projects: {text}}}\n"),
            "host.yaml",
        )
        .map(|p| p.caches.unwrap().projects)
        .map_err(|e| e.to_string())
    }

    fn scopes(text: &str) -> Result<PullRequestScopes, String> {
        HostPolicy::parse(
            &format!("version: 1\ncaches: {{root: /var/cache/c, {text}}}\n"),
            "host.yaml",
        )
        .map(|p| p.caches.unwrap().pull_requests)
        .map_err(|e| e.to_string())
    }

    #[test]
    fn pull_requests_scopes_need_a_trusted_host_and_projects_bound_to_repositories() {
        assert_eq!(
            scopes("trusted: true").unwrap(),
            PullRequestScopes::default()
        );
        let keep = scopes(
            "trusted: true, projects: {slime: THUDM/slime}, pull_requests: keep, pull_request_size: 2g, pull_request_expiry: 3d",
        )
        .unwrap();
        assert!(keep.keep);
        assert_eq!(keep.size, Some(2 << 30));
        assert_eq!(keep.expiry, std::time::Duration::from_secs(3 * 86_400));
        for (bad, want) in [
            (
                "projects: {slime: THUDM/slime}, pull_requests: keep",
                "`keep` needs `trusted: true`",
            ),
            (
                "trusted: true, pull_requests: keep",
                "needs `projects` as a mapping",
            ),
            (
                "trusted: true, projects: [slime], pull_requests: keep",
                "needs `projects` as a mapping",
            ),
            (
                "trusted: true, pull_requests: yes",
                "caches.pull_requests: `yes`: write `off`",
            ),
            (
                "trusted: true, pull_request_expiry: soon",
                "pull_request_expiry",
            ),
        ] {
            let e = scopes(bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn a_projects_caches_are_bound_to_its_repository() {
        let bound = projects("{slime: THUDM/slime}").unwrap();
        assert_eq!(bound.refusal("slime", Some("THUDM/slime")), None);
        assert_eq!(bound.refusal("slime", Some("thudm/Slime")), None);
        let other = bound.refusal("slime", Some("mallory/slime")).unwrap();
        assert!(
            other.contains("binds project `slime` to the repository THUDM/slime"),
            "{other}"
        );
        assert!(other.contains("mallory/slime"), "{other}");
        let unset = bound.refusal("slime", None).unwrap();
        assert!(unset.contains("GITHUB_REPOSITORY is not set"), "{unset}");
        assert!(
            bound
                .refusal("victim", Some("THUDM/slime"))
                .unwrap()
                .contains("does not list")
        );
        // The list form: a host serving one repository.
        let listed = projects("[slime]").unwrap();
        assert_eq!(listed.refusal("slime", None), None);
        assert!(listed.refusal("victim", None).is_some());
        assert_eq!(CacheProjects::Any.refusal("any", None), None);
        for (bad, want) in [
            (
                "{slime: THUDM}",
                "caches.projects.slime: `\"THUDM\"` is not a repository",
            ),
            ("{slime: a/b/c}", "is not a repository"),
            ("{slime: [x]}", "is not a repository"),
            ("slime", "caches.projects: `\"slime\"`"),
            ("[{a: b}]", "caches.projects.0:"),
            ("[\"../x\"]", "is not a project name"),
        ] {
            let e = projects(bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }
}
