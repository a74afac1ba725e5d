//! The host grants, the manifest asks (docs/interface.md §13): each attack a hostile
//! pull request's manifest tried, refused before anything starts; what a policy grants
//! runs and is recorded; a planted or loosely owned policy is never read.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::common::*;

const ID: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A project whose one batch `b` asks for `container`; no image is needed, since every
/// refusal here comes before the engine is asked.
fn asking(container: &str) -> Project {
    Project::new(&format!(
        "version: 1\nproject: p\nimage: {{locks: [cibox.yaml]}}\nbatches:\n  b:\n    gpus: 0\n    timeout: 1m\n    run: [\"true\"]\n    container: {container}\n"
    ))
}

/// `batch run b` of `p` under `policy` (none: the host's, which must be none).
fn run_b(p: &Project, policy: Option<&HostPolicyFile>) -> Run {
    let mut c = cibox(p.path());
    if let Some(policy) = policy {
        c.env("CIBOX_HOST_POLICY", policy.path());
    }
    c.args(["batch", "run", "b", "--image", ID, "--reports"])
        .arg(p.path().join("reports"));
    run(&mut c)
}

/// A folder under the tests' data root holding a root-only file, as a runner's install
/// folder (`.credentials_rsaparams`) does.
fn folder_with_a_root_only_secret() -> tempfile::TempDir {
    let dir = data_dir();
    let secret = dir.path().join(".credentials_rsaparams");
    std::fs::write(&secret, "PRIVATE KEY").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    dir
}

#[test]
fn without_a_policy_only_the_locked_down_default_runs() {
    require_no_host_policy();
    let secrets = folder_with_a_root_only_secret();
    for (container, key, grant) in [
        (
            format!(
                "{{user: root, mounts: [\"{}:/s\"]}}",
                secrets.path().display()
            ),
            "mounts",
            "grants.mounts",
        ),
        ("{user: root}".to_string(), "user", "grants.users"),
        ("{network: host}".to_string(), "network", "grants.network"),
        ("{ipc: host}".to_string(), "ipc", "grants.ipc_host"),
        (
            "{pass_env: [HF_TOKEN]}".to_string(),
            "pass_env",
            "grants.pass_env",
        ),
    ] {
        let p = asking(&container);
        let r = run_b(&p, None);
        r.fails_with(2, &format!("batches.b.container.{key}: "));
        assert!(
            r.stderr
                .contains("this host has no policy (/etc/cibox/host.yaml)")
                && r.stderr.contains(grant),
            "{container}: {}",
            r.stderr
        );
        assert!(
            !p.path().join("reports/b").exists(),
            "nothing was made for {container}"
        );
    }
}

#[test]
fn the_runners_credentials_never_pass_whatever_a_policy_says() {
    // A policy cannot grant them...
    let policy = HostPolicyFile::new("version: 1\ngrants: {pass_env: [ACTIONS_RUNTIME_TOKEN]}\n");
    let p = asking("{pass_env: [ACTIONS_RUNTIME_TOKEN]}");
    run_b(&p, Some(&policy)).fails_with(2, "`ACTIONS_RUNTIME_TOKEN` may never pass into a batch");
    // ... and a manifest cannot ask for them under a policy that grants others.
    let policy = HostPolicyFile::new("version: 1\ngrants: {pass_env: [HF_TOKEN]}\n");
    for name in [
        "ACTIONS_RUNTIME_TOKEN",
        "GITHUB_TOKEN",
        "RUNNER_TEMP",
        "DOCKER_AUTH_CONFIG",
    ] {
        let p = asking(&format!("{{pass_env: [{name}]}}"));
        run_b(&p, Some(&policy)).fails_with(2, &format!("`{name}` never passes into a batch"));
    }
}

#[test]
fn ci_agents_own_tokens_never_pass_whatever_a_policy_says() {
    // Buildkite's job token (what `buildkite-agent` uploads and annotates with), its
    // registration token, GitLab's job token: granted by mistake, refused at the policy.
    for name in [
        "BUILDKITE_AGENT_ACCESS_TOKEN",
        "BUILDKITE_AGENT_TOKEN",
        "CI_JOB_TOKEN",
        "CI_JOB_JWT_V2",
        "SYSTEM_ACCESSTOKEN",
    ] {
        let policy = HostPolicyFile::new(&format!("version: 1\ngrants: {{pass_env: [{name}]}}\n"));
        let p = asking(&format!("{{pass_env: [{name}]}}"));
        run_b(&p, Some(&policy)).fails_with(2, &format!("`{name}` may never pass into a batch"));
        assert!(
            !p.path().join("reports/b").exists(),
            "nothing made for {name}"
        );
    }
    // Buildkite's other variables are the host's to grant.
    let policy = HostPolicyFile::new("version: 1\ngrants: {pass_env: [BUILDKITE_BUILD_URL]}\n");
    let p = asking("{pass_env: [BUILDKITE_BUILD_URL]}");
    let r = run_b(&p, Some(&policy));
    assert!(!r.stderr.contains("never pass"), "{}", r.stderr);
}

#[test]
fn a_mount_outside_the_granted_roots_is_refused_as_named_and_as_resolved() {
    let data = data_dir();
    let granted = data.path().join("granted");
    let elsewhere = data.path().join("elsewhere");
    std::fs::create_dir_all(&granted).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, granted.join("link")).unwrap();
    let policy = HostPolicyFile::new(&format!(
        "version: 1\ngrants: {{mounts: [{}]}}\n",
        granted.display()
    ));
    let p = asking(&format!("{{mounts: [\"{}:/m\"]}}", elsewhere.display()));
    run_b(&p, Some(&policy)).fails_with(2, "is not granted on this host: the host policy");
    // Named under the root, but a link leads out of it.
    let p = asking(&format!(
        "{{mounts: [\"{}:/m\"]}}",
        granted.join("link").display()
    ));
    run_b(&p, Some(&policy)).fails_with(2, "lies outside every mount root this host grants");
}

#[test]
fn root_with_a_granted_mount_is_refused_unless_the_policy_says_so() {
    must_run_as_root();
    let secrets = folder_with_a_root_only_secret();
    let checks = ["cat /s/.credentials_rsaparams", JUNIT_OK];
    let container = format!(
        "    container:\n      user: root\n      mounts: [\"{}:/s\"]\n",
        secrets.path().display()
    );
    let grants = "version: 1\ngrants: {mounts: [/srv/cibox-tests], users: [root]}\n";
    let batch = batch_yaml("b", &checks, &container);
    let p = busybox_project(&batch, "").with_policy(grants);
    let engine_remaps_root = Command::new("docker")
        .args(["info", "--format", "{{.SecurityOptions}}"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("name=userns"))
        .unwrap_or(false);
    let r = p.run(&["batch", "run", "b"]);
    if engine_remaps_root {
        r.ok();
    } else {
        r.fails_with(
            2,
            "batches.b.container.user: `root` with host mounts would read every root-owned file below them as host uid 0",
        );
        assert!(r.stderr.contains("grants.root_with_mounts"), "{}", r.stderr);
        assert!(p.containers().is_empty(), "no container was made");
    }
    // Said in so many words, it runs, and the record says what was granted by whom.
    let p = busybox_project(&batch, "")
        .with_policy(&grants.replace("users: [root]}", "users: [root], root_with_mounts: true}"));
    p.run(&["batch", "run", "b"]).ok();
    let v = p.result("b");
    assert_eq!(v["loosened"]["user"], "root", "{v}");
    assert!(
        v["loosened"]["policy"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
}

#[test]
fn a_socket_below_a_mount_is_refused_unless_the_policy_vouches_for_its_root() {
    // A service's socket in a folder only root may enter: read-only mounts do not stop
    // connect(), and root in the container is root to the service.
    let data = data_dir();
    let service = data.path().join("var/service");
    std::fs::create_dir_all(&service).unwrap();
    std::fs::set_permissions(&service, std::fs::Permissions::from_mode(0o700)).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(service.join("daemon.sock")).unwrap();
    let policy = HostPolicyFile::new(&format!(
        "version: 1\ngrants: {{mounts: [{}]}}\n",
        data.path().display()
    ));
    let p = asking(&format!(
        "{{mounts: [\"{}:/v\"]}}",
        data.path().join("var").display()
    ));
    let r = run_b(&p, Some(&policy));
    r.fails_with(2, "holds a socket");
    assert!(r.stderr.contains("daemon.sock") && r.stderr.contains("special_files: allow"));
    // A FIFO and a device are refused the same way.
    std::fs::remove_file(service.join("daemon.sock")).unwrap();
    nix::unistd::mkfifo(
        &service.join("pipe"),
        nix::sys::stat::Mode::from_bits(0o600).unwrap(),
    )
    .unwrap();
    run_b(&p, Some(&policy)).fails_with(2, "holds a FIFO");
}

#[test]
fn network_and_ipc_are_granted_only_as_listed() {
    let policy = HostPolicyFile::new("version: 1\ngrants: {network: [bridge]}\n");
    let p = asking("{network: host}");
    run_b(&p, Some(&policy)).fails_with(2, "`network: host` is not granted on this host");
    let p = asking("{ipc: host}");
    run_b(&p, Some(&policy)).fails_with(2, "`ipc: host` is not granted on this host");
}

#[test]
fn a_planted_or_loosely_owned_policy_is_never_read() {
    must_run_as_root();
    let p = asking("{}");
    let policy = HostPolicyFile::new("version: 1\ngrants: {users: [root]}\n");
    let list = |policy: &HostPolicyFile| {
        run(cibox(p.path())
            .env("CIBOX_HOST_POLICY", policy.path())
            .args(["batch", "list"]))
    };
    list(&policy).ok();
    std::fs::set_permissions(policy.path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    list(&policy).fails_with(2, "with mode 666: a policy must be owned by root");
    std::fs::set_permissions(policy.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    nix::unistd::chown(policy.path(), Some(65534.into()), None).unwrap();
    list(&policy).fails_with(2, "is owned by uid 65534 (nobody)");
    // One that does not exist at the path named is an error, not "no policy".
    run(cibox(p.path())
        .env("CIBOX_HOST_POLICY", p.path().join("missing.yaml"))
        .args(["batch", "list"]))
    .fails_with(2, "missing.yaml");
}

#[test]
fn a_policy_pins_the_hosts_gpu_facts() {
    let h = GpuHost::new(1);
    let policy = HostPolicyFile::new(&format!(
        "version: 1\ngpu: {{lock_dir: {}}}\n",
        h.locks.path().display()
    ));
    // The host's lock dir, whatever a variable (or a manifest) would like instead.
    let other = tempfile::tempdir().unwrap();
    run(h
        .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_HOST_POLICY", policy.path())
        .env("CIBOX_GPU_LOCK_DIR", other.path()))
    .fails_with(2, "pins gpu.lock_dir to");
    run(h
        .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_HOST_POLICY", policy.path()))
    .ok();
    // A pool of its own may narrow the host's, not widen it.
    let policy = HostPolicyFile::new(&format!(
        "version: 1\ngpu: {{lock_dir: {}, pool: [0]}}\n",
        h.locks.path().display()
    ));
    let h2 = GpuHost::new(2);
    run(h2
        .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_HOST_POLICY", policy.path())
        .env_remove("CIBOX_GPU_LOCK_DIR")
        .env("CIBOX_GPU_POOL", "1"))
    .fails_with(2, "is not in this host's pool");
}

fn must_run_as_root() {
    assert!(
        nix::unistd::getuid().is_root(),
        "this test changes owners and reads root-only files: it must run as root (CI does)"
    );
}

/// One batch of `checks`, with `container` lines under it.
fn batch_yaml(name: &str, checks: &[&str], container: &str) -> String {
    let run: Vec<String> = checks.iter().map(|c| format!("      - {c:?}\n")).collect();
    format!(
        "  {name}:\n    gpus: 0\n    timeout: 1m\n    run:\n{}{container}",
        run.concat()
    )
}

#[test]
fn a_policy_reached_through_a_link_or_lying_in_the_checkout_is_never_read() {
    let p = asking("{user: root}");
    // The pull request's own file, in the checkout: owned right, never the host's.
    std::fs::write(
        p.path().join("host.yaml"),
        "version: 1\ngrants: {users: [root]}\n",
    )
    .unwrap();
    std::fs::set_permissions(
        p.path().join("host.yaml"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let mut c = cibox(p.path());
    c.env("CIBOX_HOST_POLICY", p.path().join("host.yaml"))
        .args(["batch", "run", "b", "--image", ID]);
    run(&mut c).fails_with(2, "where a pull request's files are");
    // A link to a good policy: whoever owns the link could re-point it.
    let good = HostPolicyFile::new("version: 1\n");
    let links = tempfile::tempdir().unwrap();
    let link = links.path().join("host.yaml");
    std::os::unix::fs::symlink(good.path(), &link).unwrap();
    run(cibox(p.path())
        .env("CIBOX_HOST_POLICY", &link)
        .args(["batch", "list"]))
    .fails_with(2, "is reached through a link");
}

#[test]
fn a_granted_mount_root_that_others_may_change_grants_nothing() {
    must_run_as_root();
    // The admin grants /…/shared/models; /…/shared is another user's, so they could
    // point `models` anywhere after the grant.
    let data = data_dir();
    let shared = data.path().join("shared");
    std::fs::create_dir_all(shared.join("models")).unwrap();
    nix::unistd::chown(&shared, Some(65534.into()), Some(65534.into())).unwrap();
    let policy = HostPolicyFile::new(&format!(
        "version: 1\ngrants: {{mounts: [{}]}}\n",
        shared.join("models").display()
    ));
    let p = asking(&format!(
        "{{mounts: [\"{}:/m\"]}}",
        shared.join("models").display()
    ));
    let r = run_b(&p, Some(&policy));
    r.fails_with(2, "is under the host policy's mount root");
    assert!(r.stderr.contains("owned by uid 65534"), "{}", r.stderr);
}

#[test]
fn a_folder_below_a_mount_that_anyone_may_write_is_refused() {
    // A socket made there after the check would reach the batch all the same.
    let data = data_dir();
    let open = data.path().join("models/incoming");
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let policy = HostPolicyFile::new(&format!(
        "version: 1\ngrants: {{mounts: [{}]}}\n",
        data.path().display()
    ));
    let p = asking(&format!(
        "{{mounts: [\"{}:/m\"]}}",
        data.path().join("models").display()
    ));
    run_b(&p, Some(&policy)).fails_with(2, "holds a folder anyone may write");
}

#[test]
fn without_a_policy_a_manifest_cannot_bring_its_own_lock_dir_or_idle_policy() {
    require_no_host_policy();
    for gpu in [
        "gpu: {lock_dir: /srv/pr-locks}",
        "gpu: {idle: {max_memory_mib: 80000, max_utilization: 100}}",
        "gpu: {probe: nvidia-smi}",
    ] {
        let p = Project::new(&format!(
            "version: 1\nproject: p\nimage: {{locks: [cibox.yaml]}}\n{gpu}\nbatches:\n  b: {{gpus: 1, timeout: 1m, run: [\"true\"]}}\n"
        ));
        run(cibox(p.path()).args(["batch", "list"])).fails_with(2, "the host decides gpu.");
    }
}

/// Issue 33: an unknown key in a mount root's mapping (a misspelt `special_file:
/// allow`) is refused at its place, not taken for nothing; so is one anywhere else.
#[test]
fn unknown_keys_anywhere_in_the_policy_are_refused() {
    let p = asking("{}");
    let list = |text: &str| {
        let policy = HostPolicyFile::new(text);
        run(cibox(p.path())
            .env("CIBOX_HOST_POLICY", policy.path())
            .args(["batch", "list"]))
    };
    let r =
        list("version: 1\ngrants:\n  mounts: [{root: /srv/cibox-tests, special_file: allow}]\n");
    r.fails_with(
        2,
        "grants.mounts.0.special_file: unknown key `special_file`",
    );
    assert!(
        r.stderr.contains(":3:"),
        "the line of the key: {}",
        r.stderr
    );
    list("version: 1\ngrants:\n  mounts: [{root: /srv/cibox-tests, special_files: yes}]\n")
        .fails_with(2, "grants.mounts.0.special_files:");
    list("version: 1\ngrants:\n  mounts: [{special_files: allow}]\n")
        .fails_with(2, "grants.mounts.0: has no `root`");
    for (text, key) in [
        (
            "version: 1\ncaches: {root: /var/cache/x, trust: true}\n",
            "trust",
        ),
        ("version: 1\ngpu: {idle: {max_memory: 1}}\n", "max_memory"),
        (
            "version: 1\nscheduler: slurm\nslurm: {partitions: gpu}\n",
            "partitions",
        ),
        ("version: 1\ngrants: {device: []}\n", "device"),
    ] {
        list(text).fails_with(2, &format!("unknown key `{key}`"));
    }
    list("version: 1\ngrants:\n  mounts: [{root: /srv/cibox-tests, special_files: allow}]\n").ok();
}
