//! What a manifest asks beyond the locked-down default, against what the host grants:
//! each loosening of each batch that will run is granted only when the host policy
//! lists it. Without a policy nothing is. A refusal is one line naming the loosening,
//! where the manifest asks for it, and the policy key that would grant it; nothing has
//! started then.

use std::path::Path;

use super::policy::{DEFAULT_PATH, HostPolicy, MountRoot, never_passed};
use crate::exit::Failure;
use crate::manifest::{Batch, ContainerUser, Ipc, Manifest, Network};
use crate::yaml::Mark;

/// A loosening the host does not grant.
#[derive(Debug, thiserror::Error)]
#[error("{path}:{mark}: {message}")]
pub struct GrantError {
    pub path: String,
    pub mark: Mark,
    pub message: String,
}

impl crate::error::ErrorKind for GrantError {
    fn failure(&self) -> Failure {
        Failure::Usage
    }
}

/// Refuses the first loosening of the named batches that `policy` does not grant.
pub fn check_requests(
    policy: &HostPolicy,
    manifest: &Manifest,
    names: &[String],
) -> Result<(), GrantError> {
    for name in names {
        if let Some(batch) = manifest.batches.get(name) {
            check_batch(policy, manifest, name, batch)?;
        }
    }
    Ok(())
}

/// The mount root of `policy` that `path` is or lies under.
pub fn mount_root<'p>(policy: &'p HostPolicy, path: &Path) -> Option<&'p MountRoot> {
    policy
        .grants
        .mounts
        .iter()
        .find(|m| path.starts_with(&m.root))
}

/// Why `policy` does not grant what `key` asks, and what would.
pub fn not_granted(policy: &HostPolicy, key: &str) -> String {
    match &policy.source {
        Some(s) => format!(
            "the host policy {} does not grant it (grants.{key})",
            s.path.display()
        ),
        None => format!(
            "this host has no policy ({DEFAULT_PATH}), so only the locked-down default runs; a host policy's grants.{key} would grant it"
        ),
    }
}

fn check_batch(
    policy: &HostPolicy,
    manifest: &Manifest,
    name: &str,
    batch: &Batch,
) -> Result<(), GrantError> {
    let c = &batch.container;
    let g = &policy.grants;
    let refuse = |key: &str, mark: Option<Mark>, what: String, grant_key: &str| GrantError {
        path: manifest.path.display().to_string(),
        mark: mark.unwrap_or_default(),
        message: format!(
            "batches.{name}.container.{key}: {what} is not granted on this host: {}",
            not_granted(policy, grant_key)
        ),
    };
    let mark = |key: &str| c.marks.get(key).copied();
    for m in &c.mounts {
        if mount_root(policy, &m.source).is_none() {
            return Err(refuse(
                "mounts",
                Some(m.mark),
                format!("a mount of `{}`", m.source.display()),
                "mounts",
            ));
        }
    }
    if c.user != ContainerUser::Invoker && !g.users.contains(&c.user) {
        return Err(refuse(
            "user",
            mark("user"),
            format!("`user: {}`", c.user),
            "users",
        ));
    }
    if c.ipc == Ipc::Host && !g.ipc_host {
        return Err(refuse("ipc", mark("ipc"), "`ipc: host`".into(), "ipc_host"));
    }
    if c.network != Network::None && !g.network.contains(&c.network) {
        let net = serde_json::to_value(c.network).unwrap_or_default();
        return Err(refuse(
            "network",
            mark("network"),
            format!("`network: {}`", net.as_str().unwrap_or_default()),
            "network",
        ));
    }
    if let Some(cap) = c.cap_add.iter().find(|cap| !g.cap_add.contains(cap)) {
        return Err(refuse(
            "cap_add",
            mark("cap_add"),
            format!("capability {cap}"),
            "cap_add",
        ));
    }
    if let Some(name) = c.ulimits.keys().find(|n| !g.ulimits.contains(n)) {
        return Err(refuse(
            "ulimits",
            mark("ulimits"),
            format!("ulimit `{name}`"),
            "ulimits",
        ));
    }
    for var in &c.pass_env {
        if let Some(pattern) = never_passed(var) {
            return Err(GrantError {
                path: manifest.path.display().to_string(),
                mark: mark("pass_env").unwrap_or_default(),
                message: format!(
                    "batches.{name}.container.pass_env: `{var}` never passes into a batch ({pattern}: the runner's, GitHub's or the engine's credentials)"
                ),
            });
        }
        if !g.pass_env.contains(var) {
            return Err(refuse(
                "pass_env",
                mark("pass_env"),
                format!("passing `{var}`"),
                "pass_env",
            ));
        }
    }
    for d in &c.devices {
        if !super::devices::device_granted(&g.devices, d) {
            return Err(refuse(
                "devices",
                mark("devices"),
                format!("device `{d}`"),
                "devices",
            ));
        }
    }
    if let Some(profile) = &c.seccomp
        && !g.seccomp.contains_key(profile)
    {
        return Err(refuse(
            "seccomp",
            mark("seccomp"),
            format!("seccomp profile `{profile}`"),
            "seccomp",
        ));
    }
    check_caches(policy, manifest, name, batch)
}

/// A batch's caches need the policy's `caches:`, and its project among those it lists
/// (bound to this run's repository, `GITHUB_REPOSITORY`, where the policy binds it).
fn check_caches(
    policy: &HostPolicy,
    manifest: &Manifest,
    name: &str,
    batch: &Batch,
) -> Result<(), GrantError> {
    let Some(first) = batch.caches.first() else {
        return Ok(());
    };
    let spec = &manifest.caches[first];
    let refuse = |why: String| GrantError {
        path: manifest.path.display().to_string(),
        mark: spec.mark,
        message: format!(
            "batches.{name}.caches: cache `{first}` at `{}` is not granted on this host: {why}",
            spec.path
        ),
    };
    match &policy.caches {
        None => Err(refuse(match &policy.source {
            Some(s) => format!(
                "the host policy {} has no `caches:` section (its root, sizes and who writes through)",
                s.path.display()
            ),
            None => format!(
                "this host has no policy ({DEFAULT_PATH}); a host policy's `caches:` would place and size caches"
            ),
        })),
        Some(c) => {
            let repository = std::env::var("GITHUB_REPOSITORY").ok();
            match c.projects.refusal(&manifest.project, repository.as_deref()) {
                Some(why) => Err(refuse(why)),
                None => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::policy::PolicySource;

    fn manifest(container: &str) -> Manifest {
        let text = format!(
            "version: 1\nproject: p\nimage: {{locks: [x]}}\nbatches:\n  b:\n    gpus: 0\n    timeout: 1m\n    run: [x]\n    container: {container}\n"
        );
        Manifest::parse(&text, Path::new("cibox.yaml")).unwrap()
    }

    fn policy(grants: &str) -> HostPolicy {
        let mut p =
            HostPolicy::parse(&format!("version: 1\ngrants: {grants}\n"), "host.yaml").unwrap();
        p.source = Some(PolicySource {
            path: "/etc/cibox/host.yaml".into(),
            digest: "sha256:x".into(),
        });
        p
    }

    fn refusal(policy: &HostPolicy, container: &str) -> String {
        check_requests(policy, &manifest(container), &["b".to_string()])
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn without_a_policy_only_the_locked_down_default_runs() {
        let none = HostPolicy::default();
        check_requests(&none, &manifest("{memory: 1g}"), &["b".into()]).unwrap();
        assert_eq!(
            refusal(&none, "{user: root}"),
            "cibox.yaml:9:23: batches.b.container.user: `user: root` is not granted on this host: this host has no policy (/etc/cibox/host.yaml), so only the locked-down default runs; a host policy's grants.users would grant it"
        );
        for (asks, key) in [
            ("{network: host}", "grants.network"),
            ("{network: bridge}", "grants.network"),
            ("{ipc: host}", "grants.ipc_host"),
            ("{pass_env: [HF_TOKEN]}", "grants.pass_env"),
            ("{ulimits: {memlock: unlimited}}", "grants.ulimits"),
            ("{mounts: [\"/data/models:/m\"]}", "grants.mounts"),
        ] {
            let e = refusal(&none, asks);
            assert!(e.contains(key), "{asks}: {e}");
        }
    }

    #[test]
    fn a_policy_grants_what_it_lists_and_nothing_else() {
        let p = policy(
            "{mounts: [/data/models], users: [root], network: [bridge], ipc_host: true, cap_add: [IPC_LOCK], ulimits: [memlock], pass_env: [HF_TOKEN]}",
        );
        check_requests(
            &p,
            &manifest("{mounts: [\"/data/models/llama:/m\"], user: root, network: bridge, ipc: host, cap_add: [IPC_LOCK], ulimits: {memlock: unlimited}, pass_env: [HF_TOKEN]}"),
            &["b".into()],
        )
        .unwrap();
        let e = refusal(&p, "{mounts: [\"/srv/runner:/m\"]}");
        assert!(
            e.contains("a mount of `/srv/runner` is not granted on this host: the host policy /etc/cibox/host.yaml does not grant it (grants.mounts)"),
            "{e}"
        );
        assert!(refusal(&p, "{network: host}").contains("`network: host`"));
        assert!(refusal(&p, "{user: \"1000:1000\"}").contains("`user: 1000:1000`"));
        assert!(refusal(&p, "{pass_env: [AWS_SECRET]}").contains("passing `AWS_SECRET`"));
        assert!(refusal(&p, "{ulimits: {nofile: 1024}}").contains("ulimit `nofile`"));
        // The runner's credentials never pass, whatever a policy says.
        let e = refusal(&p, "{pass_env: [ACTIONS_RUNTIME_TOKEN]}");
        assert!(e.contains("never passes into a batch (ACTIONS_*"), "{e}");
    }
}
