//! The GPU facts a host policy pins: the lock dir, the probe, whether the lock dir may
//! be on a network file system, the idle policy, and the pool a project may choose from.
//! Every project's runs on the host must share them: a manifest (a pull request writes
//! it) or a `CIBOX_GPU_*` variable that says otherwise is refused, not followed, since a
//! lock dir of its own would let it take GPUs others hold.

use super::policy::{HostPolicy, PolicyError};
use crate::manifest::GpuConfig;

/// The GPU facts a manifest may not choose: they are the host's (its policy's, or the
/// `CIBOX_GPU_*` variables'), since a lock dir, probe or idle policy of a pull request's
/// own would let it take GPUs others hold.
const HOST_FACTS: [&str; 4] = ["lock_dir", "probe", "allow_network_lock_dir", "idle"];

/// Lays the policy's GPU facts over `gpu` (the manifest's, with the `CIBOX_GPU_*`
/// overrides); refuses a value the manifest or a variable set otherwise. Without a
/// policy the variables decide, and the manifest may not set those facts to anything
/// but their defaults.
pub fn settle(policy: &HostPolicy, gpu: &mut GpuConfig) -> Result<(), PolicyError> {
    let Some(source) = &policy.source else {
        return manifest_keeps_to_defaults(gpu);
    };
    let pinned = &policy.gpu;
    let conflict = |key: &str, theirs: String, ours: String| -> Result<(), PolicyError> {
        match gpu.given_by(key) {
            Some(by) if theirs != ours => Err(PolicyError::Unusable {
                path: source.path.display().to_string(),
                message: format!(
                    "pins gpu.{key} to {ours}, and {by} says {theirs}: the host decides it; remove it there"
                ),
            }),
            _ => Ok(()),
        }
    };
    let defaults = GpuConfig::default();
    let lock_dir = pinned.lock_dir.clone().unwrap_or(defaults.lock_dir);
    conflict(
        "lock_dir",
        gpu.lock_dir.display().to_string(),
        lock_dir.display().to_string(),
    )?;
    let probe = pinned.probe.unwrap_or(defaults.probe);
    conflict("probe", label(&gpu.probe), label(&probe))?;
    let network = pinned
        .allow_network_lock_dir
        .unwrap_or(defaults.allow_network_lock_dir);
    conflict(
        "allow_network_lock_dir",
        gpu.allow_network_lock_dir.to_string(),
        network.to_string(),
    )?;
    // Like the others: a policy that does not name it pins the default.
    let idle = pinned.idle.clone().unwrap_or(defaults.idle);
    conflict(
        "idle",
        serde_json::to_string(&gpu.idle).unwrap_or_default(),
        serde_json::to_string(&idle).unwrap_or_default(),
    )?;
    gpu.idle = idle;
    gpu.lock_dir = lock_dir;
    gpu.probe = probe;
    gpu.allow_network_lock_dir = network;
    // A project may narrow the pool, never widen it: checked against the GPUs when the
    // pool is resolved.
    gpu.host_pool = pinned.pool.clone();
    if gpu.given_by("pool").is_none()
        && let Some(pool) = &pinned.pool
    {
        gpu.pool = pool.clone();
    }
    Ok(())
}

/// Without a policy: a host fact the manifest sets (and no variable overrode) must be
/// its default.
fn manifest_keeps_to_defaults(gpu: &GpuConfig) -> Result<(), PolicyError> {
    let defaults = GpuConfig::default();
    for key in HOST_FACTS {
        let Some(by) = gpu.given_by(key).filter(|by| by.starts_with("gpu.")) else {
            continue;
        };
        let (theirs, default) = match key {
            "lock_dir" => (
                gpu.lock_dir.display().to_string(),
                defaults.lock_dir.display().to_string(),
            ),
            "probe" => (label(&gpu.probe), label(&defaults.probe)),
            "allow_network_lock_dir" => (
                gpu.allow_network_lock_dir.to_string(),
                defaults.allow_network_lock_dir.to_string(),
            ),
            _ => (
                serde_json::to_string(&gpu.idle).unwrap_or_default(),
                serde_json::to_string(&defaults.idle).unwrap_or_default(),
            ),
        };
        if theirs != default {
            return Err(PolicyError::HostFact {
                message: format!(
                    "{by} sets it to {theirs}: the host decides gpu.{key} (in its policy, {}, or with CIBOX_GPU_* variables), not a project's manifest; remove it there",
                    super::policy::DEFAULT_PATH
                ),
            });
        }
    }
    Ok(())
}

fn label(v: &impl serde::Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::policy::PolicySource;
    use crate::manifest::{PoolSpec, ProbeChoice};

    fn policy(text: &str) -> HostPolicy {
        let mut p = HostPolicy::parse(text, "host.yaml").unwrap();
        p.source = Some(PolicySource {
            path: "/etc/cibox/host.yaml".into(),
            digest: "sha256:x".into(),
        });
        p
    }

    #[test]
    fn the_policy_pins_the_hosts_gpu_facts() {
        let p = policy("version: 1\ngpu: {lock_dir: /run/lock/ci, probe: nvml, pool: [0, 1]}\n");
        let mut gpu = GpuConfig::default();
        settle(&p, &mut gpu).unwrap();
        assert_eq!(gpu.lock_dir, std::path::Path::new("/run/lock/ci"));
        assert_eq!(gpu.probe, ProbeChoice::Nvml);
        assert_eq!(gpu.pool, PoolSpec::Devices(vec!["0".into(), "1".into()]));
        // A manifest (or variable) that says otherwise is refused, naming both.
        let mut gpu = GpuConfig::default();
        gpu.apply_env(|k| (k == "CIBOX_GPU_LOCK_DIR").then(|| "/tmp/mine".to_string()))
            .unwrap();
        let e = settle(&p, &mut gpu).unwrap_err().to_string();
        assert!(
            e.contains("pins gpu.lock_dir to /run/lock/ci, and CIBOX_GPU_LOCK_DIR says /tmp/mine"),
            "{e}"
        );
        // Saying the same is fine; a pool of its own narrows the host's.
        let mut gpu = GpuConfig::default();
        gpu.apply_env(|k| match k {
            "CIBOX_GPU_PROBE" => Some("nvml".into()),
            "CIBOX_GPU_POOL" => Some("1".into()),
            _ => None,
        })
        .unwrap();
        settle(&p, &mut gpu).unwrap();
        assert_eq!(gpu.pool, PoolSpec::Devices(vec!["1".into()]));
        assert!(gpu.host_pool.is_some());
    }

    #[test]
    fn a_policy_that_names_no_gpu_fact_pins_each_to_its_default() {
        // The policy names none of them (only a pool): a manifest's own lock dir, probe,
        // network lock dir or idle policy is refused all the same, and its defaults are
        // fine.
        let p = policy("version: 1\ngpu: {pool: [0, 1]}\n");
        let base = "version: 1\nproject: p\nimage: {locks: [x]}\ngpu: {GPU}\nbatches:\n  b: {gpus: 1, timeout: 1m, run: [x]}\n";
        let manifest = |gpu: &str| {
            crate::manifest::Manifest::parse(
                &base.replace("GPU", gpu),
                std::path::Path::new("cibox.yaml"),
            )
            .unwrap()
        };
        for (gpu, want) in [
            (
                "idle: {max_memory_mib: 81920, max_utilization: 100}",
                "pins gpu.idle to {\"max_memory_mib\":256,\"max_utilization\":0}, and gpu.idle in cibox.yaml says {\"max_memory_mib\":81920,\"max_utilization\":100}",
            ),
            (
                "lock_dir: /tmp/pr-locks",
                "pins gpu.lock_dir to /run/lock/cibox, and gpu.lock_dir in cibox.yaml says /tmp/pr-locks",
            ),
            (
                "probe: nvidia-smi",
                "pins gpu.probe to auto, and gpu.probe in cibox.yaml says nvidia-smi",
            ),
            (
                "allow_network_lock_dir: true",
                "pins gpu.allow_network_lock_dir to false, and gpu.allow_network_lock_dir in cibox.yaml says true",
            ),
        ] {
            let mut m = manifest(gpu);
            let e = settle(&p, &mut m.gpu).unwrap_err().to_string();
            assert!(e.contains(want), "{gpu}: {e}");
        }
        for same in [
            "idle: {max_memory_mib: 256}",
            "lock_dir: /run/lock/cibox",
            "probe: auto",
            "allow_network_lock_dir: false",
            "pool: [1]",
        ] {
            let mut m = manifest(same);
            settle(&p, &mut m.gpu).unwrap();
            assert_eq!(m.gpu.idle, crate::manifest::IdlePolicy::default(), "{same}");
        }
    }

    #[test]
    fn without_a_policy_the_variables_decide_and_the_manifest_may_not() {
        let mut gpu = GpuConfig::default();
        gpu.apply_env(|k| (k == "CIBOX_GPU_LOCK_DIR").then(|| "/tmp/mine".to_string()))
            .unwrap();
        settle(&HostPolicy::default(), &mut gpu).unwrap();
        assert_eq!(gpu.lock_dir, std::path::Path::new("/tmp/mine"));
        // A manifest's own lock dir (a pull request's) is refused; its default is fine.
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ngpu: {lock_dir: /tmp/pr-locks}\nbatches:\n  b: {gpus: 1, timeout: 1m, run: [x]}\n";
        let mut m =
            crate::manifest::Manifest::parse(text, std::path::Path::new("cibox.yaml")).unwrap();
        let e = settle(&HostPolicy::default(), &mut m.gpu)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "gpu.lock_dir in cibox.yaml sets it to /tmp/pr-locks: the host decides gpu.lock_dir"
            ),
            "{e}"
        );
        let text = text.replace("/tmp/pr-locks", "/run/lock/cibox");
        let mut m =
            crate::manifest::Manifest::parse(&text, std::path::Path::new("cibox.yaml")).unwrap();
        settle(&HostPolicy::default(), &mut m.gpu).unwrap();
    }
}
