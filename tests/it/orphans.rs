//! Nothing outlives its owner: containers of killed runs are swept host-wide, judged
//! in the lock dir their run used; a live run's are never touched.

use crate::common::*;

#[test]
fn a_dead_run_in_another_scope_is_swept_and_a_live_one_never() {
    let p = busybox_project(
        "  long:\n    gpus: 0\n    timeout: 10m\n    run: [\"sleep 600\"]\n  quick:\n    gpus: 0\n    timeout: 1m\n    allow_empty: true\n    run: [\"true\"]\n",
        "",
    );
    let locks = tempfile::tempdir().unwrap();
    let scope_a = format!("{}-a", p.scope());
    let mut long = p
        .batch_cmd(&["batch", "run", "long", "--scope", &scope_a])
        .env("CIBOX_GPU_LOCK_DIR", locks.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ours = |scope: &str| {
        let out = std::process::Command::new("docker")
            .args(["ps", "-a", "-q", "--filter"])
            .arg(format!("label=org.cibox.scope={scope}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    assert!(wait_until(30, || ours(&scope_a) == 1));
    // A cleanup of every scope, from where no manifest names that lock dir: the run is
    // alive in the lock dir its container names, so its container stays.
    let elsewhere = tempfile::tempdir().unwrap();
    let r = run(cibox(elsewhere.path()).arg("cleanup"));
    r.ok();
    assert_eq!(
        ours(&scope_a),
        1,
        "cleanup removed a live run's container: {}",
        r.stdout
    );
    // Killed, the run is dead: the next run in another scope (and another lock dir)
    // removes its container.
    long.kill().unwrap();
    long.wait().unwrap();
    let scope_b = format!("{}-b", p.scope());
    p.run(&["batch", "run", "quick", "--scope", &scope_b]).ok();
    assert!(
        wait_until(10, || ours(&scope_a) == 0),
        "a dead run's container in another scope was left"
    );
}
