//! Where a Dockerfile build's cache mounts (`RUN --mount=type=cache`) live, and what
//! its steps get: the trust model of run-time caches (docs/interface.md §6, *Caches*;
//! §13) carried over to builds. The engine's BuildKit keys each cache mount
//! `NAMESPACE/ID` (the ID defaulting to the target), the namespace being the build
//! argument `BUILDKIT_CACHE_MOUNT_NS` (BuildKit v0.8's `frontend/dockerfile/builder`,
//! read whether or not the Dockerfile declares it, and not recorded in the image). cibox
//! sets it on every BuildKit build to a namespace of the build's project and scope
//! that nothing a pull request writes can name or collide with, so that a pull
//! request's build never writes what another project's, or a trusted, build reads:
//!
//! - *trusted* (the host's `caches.trusted`, an event that runs merged code): the
//!   project's shared namespace;
//! - *a pull request's* (the host keeps pull requests' writes, and the event names one,
//!   believed as for runs): that pull request's own, which starts empty;
//! - *local* (no host policy, and no CI job): the project's own on this machine, which
//!   no CI scope shares;
//! - *private*: anything else, a namespace of this build alone.

use super::HostPolicy;
use crate::image::trust::{BuildScope, BuildTrust, Scope, namespace};

/// What decides a build's scope, as the host and the environment say it.
pub struct Facts<'a> {
    pub policy: &'a HostPolicy,
    pub project: &'a str,
    /// The workflow's event when it may run code nobody merged
    /// ([`crate::github::untrusted_event`]).
    pub event: Option<String>,
    /// Whether this is a CI job (`CI`, `GITHUB_ACTIONS` or `BUILDKITE` set).
    pub ci: bool,
    /// `GITHUB_REPOSITORY`.
    pub repository: Option<String>,
}

/// The scope of a build of `project` whose source is the checkout at `dir`, on this
/// host, in this job.
pub fn decide(
    policy: &HostPolicy,
    project: &str,
    dir: &std::path::Path,
) -> std::io::Result<BuildScope> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let facts = Facts {
        policy,
        project,
        event: crate::github::untrusted_event(),
        ci: var("CI").is_some_and(|v| !matches!(v.trim(), "0" | "false" | "FALSE" | "False"))
            || crate::github::active()
            || crate::buildkite::active(),
        repository: var("GITHUB_REPOSITORY"),
    };
    let sha = || {
        crate::git::text(dir, &["rev-parse", "--verify", "HEAD"])
            .ok()
            .filter(|s| s.len() == 40)
    };
    let (scope, trust) = scope_of(&facts, &|| crate::github::pull_request(sha().as_deref()));
    let nonce = match scope {
        Scope::Private { .. } => crate::util::random_hex(16)?,
        _ => String::new(),
    };
    let namespace = namespace(project, &scope, &nonce);
    Ok(BuildScope {
        scope,
        trust,
        namespace,
    })
}

/// The scope and trust `facts` give; `pull_request` reads the event's pull request
/// (asked only where the host keeps pull requests' writes).
pub fn scope_of(
    facts: &Facts<'_>,
    pull_request: &dyn Fn() -> Result<u64, String>,
) -> (Scope, BuildTrust) {
    let private = |why: String| (Scope::Private { why }, BuildTrust::Untrusted);
    if facts.policy.source.is_none() {
        let trust = match facts.event {
            Some(_) => BuildTrust::Untrusted,
            None => BuildTrust::Trusted,
        };
        return match (&facts.event, facts.ci) {
            (None, false) => (Scope::Local, trust),
            (Some(event), _) => (
                Scope::Private {
                    why: format!(
                        "a {event} build, whose code may not be merged, on a host without a policy"
                    ),
                },
                trust,
            ),
            (None, true) => (
                Scope::Private {
                    why: "a CI job on a host without a policy: nothing vouches for what reaches it"
                        .into(),
                },
                trust,
            ),
        };
    }
    let Some(caches) = facts.policy.caches.as_ref().filter(|c| c.trusted) else {
        return private(
            "the host policy does not say that only merged code reaches this host (caches.trusted)"
                .into(),
        );
    };
    if let Some(why) = caches
        .projects
        .refusal(facts.project, facts.repository.as_deref())
    {
        return private(why);
    }
    let Some(event) = &facts.event else {
        return (Scope::Trusted, BuildTrust::Trusted);
    };
    if !caches.pull_requests.keep {
        return private(format!("a {event} build, whose code may not be merged"));
    }
    match pull_request() {
        Ok(n) => (Scope::PullRequest(n), BuildTrust::Untrusted),
        Err(why) => private(format!(
            "a {event} build, not believed to be one pull request's ({why})"
        )),
    }
}

/// Why `policy` gives a build of `scope` no such secret, and which key would.
pub fn not_granted(policy: &HostPolicy, scope: &BuildScope) -> String {
    let what = match &scope.scope {
        Scope::PullRequest(n) => format!("it is pull request {n}'s build"),
        Scope::Private { why } => format!("it is an untrusted build ({why})"),
        Scope::Trusted | Scope::Local => "it is a trusted build".into(),
    };
    let key = scope.trust.key();
    match &policy.source {
        Some(s) => format!(
            "{what}, and the host policy {} does not list it in builds.{key}.secrets",
            s.path.display()
        ),
        None => format!(
            "{what}, and this host has no policy ({}) to grant it (builds.{key}.secrets)",
            crate::host::policy::DEFAULT_PATH
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> HostPolicy {
        let mut p = HostPolicy::parse(text, "host.yaml").unwrap();
        p.source = Some(crate::host::policy::PolicySource {
            path: "/etc/cibox/host.yaml".into(),
            digest: "sha256:0".into(),
        });
        p
    }

    fn scope(policy: &HostPolicy, event: Option<&str>, ci: bool, pr: Result<u64, &str>) -> Scope {
        let facts = Facts {
            policy,
            project: "slime",
            event: event.map(str::to_string),
            ci,
            repository: Some("THUDM/slime".into()),
        };
        scope_of(&facts, &|| pr.map_err(str::to_string)).0
    }

    const KEEP: &str = "version: 1\ncaches: {root: /var/cache/cibox, trusted: true, projects: {slime: THUDM/slime}, pull_requests: keep}\n";

    #[test]
    fn the_scope_follows_the_trust_model_of_run_time_caches() {
        let keep = policy(KEEP);
        assert_eq!(scope(&keep, None, true, Ok(7)), Scope::Trusted);
        assert_eq!(
            scope(&keep, Some("pull_request_target"), true, Ok(7)),
            Scope::PullRequest(7)
        );
        let Scope::Private { why } = scope(&keep, Some("pull_request"), true, Err("its own"))
        else {
            panic!()
        };
        assert!(
            why.contains("not believed to be one pull request's (its own)"),
            "{why}"
        );
        // A trusted host that does not keep pull requests' writes.
        let off = policy(&KEEP.replace(", pull_requests: keep", ""));
        assert!(matches!(
            scope(&off, Some("pull_request_target"), true, Ok(7)),
            Scope::Private { .. }
        ));
        // A host that does not trust writes, or binds the project to another repository.
        for text in [
            "version: 1\n".to_string(),
            KEEP.replace("trusted: true", "trusted: false")
                .replace(", pull_requests: keep", ""),
            KEEP.replace("THUDM/slime", "mallory/slime"),
        ] {
            assert!(
                matches!(
                    scope(&policy(&text), None, true, Ok(7)),
                    Scope::Private { .. }
                ),
                "{text}"
            );
        }
        // No policy: a developer's build is the project's own; a CI job's private.
        let none = HostPolicy::default();
        assert_eq!(scope(&none, None, false, Ok(7)), Scope::Local);
        assert!(matches!(
            scope(&none, None, true, Ok(7)),
            Scope::Private { .. }
        ));
        assert!(matches!(
            scope(&none, Some("pull_request"), false, Ok(7)),
            Scope::Private { .. }
        ));
    }

    #[test]
    fn only_merged_code_gets_the_trusted_grants() {
        let trust = |p: &HostPolicy, event: Option<&str>, ci: bool| {
            let facts = Facts {
                policy: p,
                project: "slime",
                event: event.map(str::to_string),
                ci,
                repository: Some("THUDM/slime".into()),
            };
            scope_of(&facts, &|| Ok(7)).1
        };
        let keep = policy(KEEP);
        assert_eq!(trust(&keep, None, true), BuildTrust::Trusted);
        assert_eq!(
            trust(&keep, Some("issue_comment"), true),
            BuildTrust::Untrusted
        );
        assert_eq!(
            trust(&policy("version: 1\n"), None, true),
            BuildTrust::Untrusted
        );
        let none = HostPolicy::default();
        assert_eq!(trust(&none, None, true), BuildTrust::Trusted);
        assert_eq!(
            trust(&none, Some("pull_request"), true),
            BuildTrust::Untrusted
        );
    }

    #[test]
    fn namespaces_differ_by_project_and_scope_and_cannot_be_forged() {
        let ns = |project: &str, scope: Scope, nonce: &str| namespace(project, &scope, nonce);
        let trusted = ns("a", Scope::Trusted, "");
        assert!(
            trusted.starts_with("cibox:") && trusted.len() == 6 + 64,
            "{trusted}"
        );
        assert_eq!(trusted, ns("a", Scope::Trusted, ""));
        let all = [
            trusted.clone(),
            ns("b", Scope::Trusted, ""),
            ns("a", Scope::Local, ""),
            ns("a", Scope::PullRequest(1), ""),
            ns("a", Scope::PullRequest(2), ""),
            // A project named to look like another's scope.
            ns("a/pull/1", Scope::Trusted, ""),
            ns("a", Scope::Private { why: String::new() }, "n1"),
            ns("a", Scope::Private { why: String::new() }, "n2"),
        ];
        let distinct: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len(), "{all:?}");
    }
}
