//! Batches through Slurm (docs/interface.md §14), on the emulated 2-node cluster of
//! `.ci/setup-host.sh`: the record and reports of a batch run on a node, the GPUs
//! exactly as Slurm allocated them, a busy one refused, cancel, timeout, a killed
//! submitter, a batch on two nodes, Slurm down, bad input, what capacity and
//! `gpu status` say, the queue counted as a wait, a quiet batch's progress, and
//! `doctor` on a login node. These share the cluster's 8 GPUs: they run one at a time
//! (the `slurm` test group of `.config/nextest.toml`).

use crate::common::*;

fn steps(steps: &[&str]) -> String {
    let quoted: Vec<String> = steps
        .iter()
        .map(|s| serde_json::to_string(s).unwrap())
        .collect();
    format!("[{}]", quoted.join(", "))
}

/// A busybox project with one batch, under a Slurm policy of `host` (its `slurm`
/// keys `slurm`).
fn project(host: &SlurmHost, batch: &str, extra: &str, slurm: &str) -> BusyboxProject {
    busybox_project(batch, extra).with_policy(&host.policy(slurm, ""))
}

fn batch(name: &str, gpus: u32, timeout: &str, run: &[&str], extra: &str) -> String {
    format!(
        "  {name}:\n    gpus: {gpus}\n    timeout: {timeout}\n    run: {}\n{extra}",
        steps(run)
    )
}

/// The job name in a record, and that it names project, batch and run.
fn job_name(v: &serde_json::Value, batch: &str) -> String {
    let name = v["slurm"]["name"].as_str().unwrap().to_string();
    let run = v["run"].as_str().unwrap();
    assert_eq!(name, format!("cibox:bt:{batch}:{run}"), "{v}");
    name
}

/// Waits until the batch's log shows `text` (the batch runs on its node).
fn wait_for_log(p: &BusyboxProject, batch: &str, text: &str) {
    let log = p.reports().join(batch).join("log.txt");
    assert!(
        wait_until(120, || std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains(text))),
        "the batch never printed {text:?}"
    );
}

#[test]
fn a_batch_runs_on_a_node_and_leaves_its_record_and_reports() {
    let host = SlurmHost::new();
    let p = project(
        &host,
        &batch(
            "onnode",
            0,
            "1m",
            &[
                "echo hello from the node; echo \"job=$SLURM_JOB_ID\"",
                JUNIT_OK,
            ],
            "",
        ),
        "",
        "",
    );
    let r = host.run(&p, &["batch", "run", "onnode", "--wait", "120s"]);
    r.ok();
    assert!(r.stdout.contains("hello from the node"), "{}", r.stdout);
    // The container gets the manifest's environment only: no Slurm variable.
    assert!(r.stdout.contains("job=\n"), "{}", r.stdout);
    let v = p.result("onnode");
    assert_eq!(v["status"], "passed", "{v}");
    assert_eq!(v["tests"]["total"], 1);
    assert_eq!(v["reports"]["files"], 1, "{v}");
    assert!(
        NODES.contains(&v["slurm"]["nodes"][0].as_str().unwrap()),
        "{v}"
    );
    assert_eq!(v["slurm"]["partition"], "gpu");
    let name = job_name(&v, "onnode");
    let id = v["slurm"]["job_id"].as_str().unwrap();
    assert!(
        jobs_named(&name)
            .iter()
            .any(|j| j.starts_with(&format!("{id} "))),
        "Slurm knows the job by its name: {:?}",
        jobs_named(&name)
    );
    let dir = p.reports().join("onnode");
    let log = std::fs::read_to_string(dir.join("log.txt")).unwrap();
    assert!(log.contains("hello from the node"), "{log}");
    assert!(dir.join("junit.xml").is_file());
    assert!(p.reports().join("summary.md").is_file());
    assert!(live_jobs(&name).is_empty() || wait_until(10, || live_jobs(&name).is_empty()));
    assert!(p.containers().is_empty());
}

#[test]
fn the_node_takes_exactly_the_gpus_slurm_allocated() {
    let host = SlurmHost::new();
    let p = project(
        &host,
        &batch("exact", 2, "1m", &[JUNIT_OK], ""),
        "",
        "  options: [--nodelist=n1]\n",
    );
    // GPUs 0 and 1 of n1 go to another job: Slurm allocates 2 and 3.
    let holder = Holder::new("n1", 2);
    let r = host.run(&p, &["batch", "run", "exact", "--wait", "120s"]);
    drop(holder);
    // No GPU runtime on this engine: the container cannot start (as locally, exit 5);
    // the lease before it is what is checked.
    assert_eq!(r.code, 5, "{}", r.stderr);
    let v = p.result("exact");
    assert_eq!(v["status"], "infra_error", "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("could not start"),
        "{v}"
    );
    let gpus: Vec<(u64, String, String)> = v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["index"].as_u64().unwrap(),
                g["uuid"].as_str().unwrap().to_string(),
                g["node"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        gpus,
        [
            (2, node_uuid("n1", 2), "n1".to_string()),
            (3, node_uuid("n1", 3), "n1".to_string())
        ]
    );
    assert!(p.containers().is_empty());
}

#[test]
fn a_busy_gpu_slurm_hands_over_is_refused() {
    let host = SlurmHost::new();
    let p = project(
        &host,
        &batch("busy", 1, "1m", &[JUNIT_OK], ""),
        "",
        "  options: [--nodelist=n2]\n",
    );
    // Something outside Slurm computes on n2's GPU 0, the one Slurm gives first.
    host.set_apps("n2", &format!("{}, 4242, 2048\n", node_uuid("n2", 0)));
    let r = host.run(&p, &["batch", "run", "busy", "--wait", "120s"]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    let v = p.result("busy");
    assert_eq!(v["status"], "infra_error", "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains("Slurm allocated") && message.contains("outside Slurm"),
        "{message}"
    );
    assert!(message.contains("on node n2"), "{message}");
    assert_eq!(v["gpus"], serde_json::json!([]), "nothing was leased: {v}");
    assert!(p.containers().is_empty());
}

#[test]
fn a_signal_cancels_the_job_and_its_container() {
    let host = SlurmHost::new();
    let p = project(
        &host,
        &batch(
            "cancelme",
            0,
            "5m",
            &["echo started; sleep 300"],
            "    allow_empty: true\n",
        ),
        "",
        "",
    );
    for (signal, code) in [
        (nix::sys::signal::Signal::SIGINT, 130),
        (nix::sys::signal::Signal::SIGTERM, 143),
        (nix::sys::signal::Signal::SIGHUP, 129),
    ] {
        // The last round's log must not look like this one's start.
        let _ = std::fs::remove_dir_all(p.reports().join("cancelme"));
        let mut child = host
            .cmd(&p, &["batch", "run", "cancelme", "--wait", "120s"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        wait_for_log(&p, "cancelme", "started");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(code), "{signal}");
        let v = p.result("cancelme");
        assert_eq!(v["status"], "cancelled", "{v}");
        assert_eq!(v["exit_code"], code, "{v}");
        let name = job_name(&v, "cancelme");
        assert!(
            wait_until(10, || live_jobs(&name).is_empty()),
            "the job outlived the cancel: {:?}",
            jobs_named(&name)
        );
        assert!(wait_until(10, || p.containers().is_empty()));
    }
}

#[test]
fn a_layer_runs_through_slurm_with_its_github_outputs() {
    let host = SlurmHost::new();
    let batches = batch("green", 0, "2m", &[JUNIT_OK], "")
        + &batch(
            "red",
            0,
            "2m",
            &["echo red-ran; false"],
            "    verdict: exit-code\n",
        )
        + "layers:\n  both: {batches: [green, red]}\n";
    let p = project(&host, &batches, "", "");
    let out = p.project.path().join("github-output");
    let summary = p.project.path().join("github-summary");
    let r = run(host
        .cmd(
            &p,
            &["layer", "run", "both", "--parallel", "--wait", "120s"],
        )
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_OUTPUT", &out)
        .env("GITHUB_STEP_SUMMARY", &summary));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let outputs = std::fs::read_to_string(&out).unwrap();
    assert!(
        outputs.contains("status=failed\n") && outputs.contains("failed_batches=red\n"),
        "{outputs}"
    );
    for (name, status) in [("green", "passed"), ("red", "failed")] {
        let v = p.result(name);
        assert_eq!(v["status"], status, "{v}");
        assert_eq!(v["layer"], "both", "{v}");
        job_name(&v, name);
    }
    let s = std::fs::read_to_string(&summary).unwrap();
    assert!(s.contains("| red | failed |"), "{s}");
    assert!(
        r.stdout.contains("::group::batch red") && r.stdout.contains("red-ran"),
        "{}",
        r.stdout
    );
}

#[test]
fn a_batch_runs_again_as_a_new_job_and_a_failure_cancels_what_waits_under_fail_fast() {
    let host = SlurmHost::new();
    let shaky = "if [ \"$CIBOX_ATTEMPT\" = 1 ]; then echo attempt-one; exit 3; fi; echo attempt-$CIBOX_ATTEMPT";
    let batches = batch(
        "shaky",
        0,
        "2m",
        &[shaky],
        "    verdict: exit-code\n    retries: 1\n",
    ) + &batch("red", 0, "2m", &["false"], "    verdict: exit-code\n")
        + &batch("after", 0, "2m", &[JUNIT_OK], "")
        + "layers:\n  ff: {batches: [shaky, red, after], fail_fast: true}\n";
    let p = project(&host, &batches, "", "");
    let r = host.run(&p, &["layer", "run", "ff", "--wait", "120s"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    // Its second attempt was a job of its own, and it passed: flaky.
    let v = p.result("shaky");
    assert_eq!(
        (v["status"].as_str(), v["flaky"].as_bool()),
        (Some("passed"), Some(true)),
        "{v}"
    );
    assert_eq!(v["attempts"], 2, "{v}");
    let first: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(p.reports().join("shaky/attempt-1/result.json")).unwrap(),
    )
    .unwrap();
    assert_ne!(
        first["slurm"]["job_id"], v["slurm"]["job_id"],
        "{first} {v}"
    );
    assert!(
        v["slurm"]["name"].as_str().unwrap().ends_with(":2"),
        "the second attempt's job says so in its name: {v}"
    );
    let log = std::fs::read_to_string(p.reports().join("shaky/attempt-1/log.txt")).unwrap();
    assert!(log.contains("attempt-one"), "{log}");
    let log = std::fs::read_to_string(p.reports().join("shaky/log.txt")).unwrap();
    assert!(log.contains("attempt-2"), "{log}");
    // The hard failure stops the layer: the rest never reach Slurm.
    assert_eq!(p.result("red")["status"], "failed");
    let after = p.result("after");
    assert_eq!(after["status"], "not_run", "{after}");
    assert!(p.containers().is_empty());
}

#[test]
fn a_batch_past_its_timeout_ends_its_job() {
    let host = SlurmHost::new();
    let p = project(
        &host,
        &batch("slowpoke", 0, "3s", &["echo started; sleep 300"], ""),
        "",
        "",
    );
    let r = host.run(&p, &["batch", "run", "slowpoke", "--wait", "120s"]);
    assert_eq!(r.code, 124, "{}", r.stderr);
    assert!(r.stderr.contains("timeout after 3s"), "{}", r.stderr);
    let v = p.result("slowpoke");
    assert_eq!(v["status"], "timeout", "{v}");
    let name = job_name(&v, "slowpoke");
    assert!(wait_until(10, || live_jobs(&name).is_empty()));
    assert!(p.containers().is_empty());
}

#[test]
fn a_killed_submitter_leaves_no_job_and_no_container() {
    let host = SlurmHost::new();
    let p = project(
        &host,
        &batch(
            "orphaned",
            0,
            "5m",
            &["echo started; sleep 300"],
            "    allow_empty: true\n",
        ),
        "",
        "",
    );
    let mut child = host
        .cmd(&p, &["batch", "run", "orphaned", "--wait", "120s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_log(&p, "orphaned", "started");
    let jobs = || {
        let out = std::process::Command::new("squeue")
            .args(["-h", "-o", "%j"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("cibox:bt:orphaned:"))
            .count()
    };
    assert_eq!(jobs(), 1, "the job runs");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        wait_until(15, || jobs() == 0),
        "the job outlived its submitter"
    );
    assert!(
        wait_until(15, || p.containers().is_empty()),
        "the container outlived its submitter: {:?}",
        p.containers()
    );
}

#[test]
fn a_batch_on_two_nodes_meets_and_gathers_each_nodes_reports() {
    let host = SlurmHost::new();
    let junit = "echo \"<testsuite><testcase classname=\\\"rank$NODE_RANK\\\" name=\\\"ok\\\"/></testsuite>\" > $CIBOX_REPORTS/junit.xml";
    let p = project(
        &host,
        &format!(
            "{}{}",
            batch(
                "pair",
                0,
                "1m",
                &[
                    "echo \"rank=$NODE_RANK of $NNODES world=$WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT\"",
                    junit
                ],
                "    nodes: 2\n    container: {network: host}\n",
            ),
            batch(
                "onefails",
                0,
                "1m",
                &["if [ \"$NODE_RANK\" = 1 ]; then echo rank 1 fails; exit 3; fi; sleep 300"],
                "    nodes: 2\n    container: {network: host}\n",
            )
        ),
        "",
        "",
    );
    let r = host.run(&p, &["batch", "run", "pair", "--wait", "120s"]);
    r.ok();
    for rank in 0..2 {
        assert!(
            r.stdout.contains(&format!(
                "[node-{rank}] rank={rank} of 2 world=2 master=127.0.0.1:"
            )),
            "{}",
            r.stdout
        );
    }
    let v = p.result("pair");
    assert_eq!(v["status"], "passed", "{v}");
    assert_eq!(v["tests"]["total"], 2, "{v}");
    assert_eq!(v["slurm"]["nodes"], serde_json::json!(["n1", "n2"]), "{v}");
    for rank in 0..2 {
        let dir = p.reports().join("pair").join(format!("node-{rank}"));
        let rv: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("result.json")).unwrap())
                .unwrap();
        assert_eq!(rv["status"], "passed", "{rv}");
        let junit = std::fs::read_to_string(dir.join("junit.xml")).unwrap();
        assert!(junit.contains(&format!("rank{rank}")), "{junit}");
    }
    // The host network is a loosening, recorded.
    assert_eq!(v["loosened"]["network"], "host", "{v}");
    // A rank that fails fails the batch and ends the other one.
    let r = host.run(&p, &["batch", "run", "onefails", "--wait", "120s"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let v = p.result("onefails");
    assert_eq!(v["status"], "failed", "{v}");
    assert!(v["message"].as_str().unwrap().starts_with("rank 1"), "{v}");
    let name = job_name(&v, "onefails");
    assert!(wait_until(10, || live_jobs(&name).is_empty()));
    assert!(wait_until(10, || p.containers().is_empty()));
}

/// Every file below `dir`, with its text (what is not UTF-8, lossily).
fn files_below(dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                out.push((path, String::from_utf8_lossy(&bytes).into_owned()));
            }
        }
    }
    out
}

/// Issue 33: `MASTER_PORT` was 20000 plus the job ID, which is sequential, so another
/// user listened on the next ports and a rank met them. Each job's port is drawn at
/// random (and not the one its ID would give), and each rank has the job's token,
/// which no record, log or output of cibox's shows.
#[test]
fn a_rendezvous_port_is_unpredictable_and_the_ranks_share_a_secret_token() {
    let host = SlurmHost::new();
    let p = project(
        &host,
        &batch(
            "meet",
            0,
            "1m",
            &[
                "echo \"rank=$NODE_RANK port=$MASTER_PORT token-length=${#CIBOX_RENDEZVOUS_TOKEN}\"",
                "printf %s \"$CIBOX_RENDEZVOUS_TOKEN\" > $CIBOX_REPORTS/token",
                JUNIT_OK,
            ],
            "    nodes: 2\n    container: {network: host}\n",
        ),
        "",
        "",
    );
    let mut seen = Vec::new();
    for _ in 0..2 {
        let r = host.run(&p, &["batch", "run", "meet", "--wait", "120s"]);
        r.ok();
        let v = p.result("meet");
        let job: u64 = v["slurm"]["job_id"].as_str().unwrap().parse().unwrap();
        let ports: Vec<u64> = (0..2)
            .map(|rank| {
                let line = r
                    .stdout
                    .lines()
                    .find(|l| l.contains(&format!("[node-{rank}] rank={rank} port=")))
                    .unwrap_or_else(|| panic!("rank {rank}: {}", r.stdout));
                let port = line.split("port=").nth(1).unwrap();
                port.split_whitespace().next().unwrap().parse().unwrap()
            })
            .collect();
        assert_eq!(ports[0], ports[1], "the ranks meet on one port");
        assert_ne!(
            ports[0],
            20000 + job % 20000,
            "job {job}'s port is its ID's"
        );
        assert_ne!(ports[0], 20000 + job, "job {job}'s port is its ID's");
        assert_eq!(
            r.stdout.matches("token-length=64").count(),
            2,
            "each rank has a token: {}",
            r.stdout
        );
        let batch_dir = p.reports().join("meet");
        let tokens: Vec<String> = (0..2)
            .map(|rank| {
                std::fs::read_to_string(batch_dir.join(format!("node-{rank}/token"))).unwrap()
            })
            .collect();
        assert_eq!(tokens[0], tokens[1], "each rank has the job's token");
        assert_eq!(tokens[0].len(), 64);
        let token = tokens[0].clone();
        // Nowhere cibox writes or prints: the records, logs, summaries, the output.
        for (path, text) in files_below(&p.reports()) {
            if path.file_name().is_some_and(|n| n == "token") {
                continue;
            }
            assert!(!text.contains(&token), "the token is in {}", path.display());
        }
        assert!(!r.stdout.contains(&token) && !r.stderr.contains(&token));
        seen.push((job, ports[0], token));
    }
    let ((job_a, port_a, token_a), (job_b, port_b, token_b)) = (&seen[0], &seen[1]);
    assert_ne!(job_a, job_b);
    assert_ne!(port_a, port_b, "jobs {job_a} and {job_b} met on one port");
    assert_ne!(token_a, token_b, "each job has a token of its own");
}

#[test]
fn slurm_down_is_exit_5_and_submits_nothing() {
    let host = SlurmHost::new();
    let p = project(&host, &batch("nowhere", 0, "1m", &[JUNIT_OK], ""), "", "");
    // A controller that is not there: the cluster's configuration on another port.
    let conf = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string("/etc/slurm/slurm.conf").unwrap();
    std::fs::write(
        conf.path().join("slurm.conf"),
        text.replace("SlurmctldPort=6817", "SlurmctldPort=6899"),
    )
    .unwrap();
    let mut c = host.cmd(&p, &["batch", "run", "nowhere"]);
    c.env("SLURM_CONF", conf.path().join("slurm.conf"));
    let r = run(&mut c);
    r.fails_with(5, "Slurm does not answer");
    assert!(
        r.stderr.contains("Unable to contact slurm controller"),
        "{}",
        r.stderr
    );
    assert!(!p.reports().join("nowhere").exists());
}

#[test]
fn what_the_cluster_can_never_run_is_refused_before_submission() {
    let host = SlurmHost::new();
    let p = busybox_project(
        &format!(
            "{}{}{}{}{}",
            batch("wide", 5, "1m", &[JUNIT_OK], ""),
            batch(
                "many",
                1,
                "1m",
                &[JUNIT_OK],
                "    nodes: 3\n    container: {network: host}\n"
            ),
            batch("fine", 0, "1m", &[JUNIT_OK], ""),
            batch("split", 1, "1m", &[JUNIT_OK], "    shards: 2\n"),
            "  listed:\n    gpus: 0\n    timeout: 1m\n    run: [\"true\"]\n    collect: {run: \"echo '{\\\"file\\\": \\\"a.sh\\\"}'\"}\n",
        ),
        "",
    );
    let before = std::fs::read_to_string("/var/log/slurm/jobcomp.log").unwrap_or_default();
    let p = p.with_policy(&host.policy("", ""));
    host.run(&p, &["batch", "run", "wide"]).fails_with(
        4,
        "batch wide needs 5 GPU(s) on a node; no node of Slurm partition `gpu` has that many (the most: 4)",
    );
    host.run(&p, &["batch", "run", "many"]).fails_with(
        4,
        "batch many needs 3 node(s) with 1 GPU(s) each; Slurm partition `gpu` has 2",
    );
    // Slurm's node side runs a batch whole: a sharded one is refused at its key.
    let r = host.run(&p, &["batch", "run", "split"]);
    r.fails_with(
        2,
        "batch split has 2 shards, and this host submits batches to Slurm",
    );
    assert!(r.stderr.contains("cibox.yaml:"), "{}", r.stderr);
    // Its nodes read the manifest as committed: a list the code prints is refused.
    let r = host.run(&p, &["batch", "run", "listed"]);
    r.fails_with(
        2,
        "is of a list the project's code prints (`collect:`), and this host submits batches to Slurm",
    );
    assert!(r.stderr.contains("cibox.yaml:"), "{}", r.stderr);
    let p = p.with_policy(
        &host
            .policy("  options: []\n", "")
            .replace("partition: gpu", "partition: nope"),
    );
    host.run(&p, &["batch", "run", "fine"]).fails_with(
        2,
        "the host policy's slurm.partition `nope` is not a partition of this cluster (its partitions: gpu)",
    );
    for b in ["wide", "many", "fine", "split"] {
        assert!(!p.reports().join(b).exists(), "{b}");
    }
    let after = std::fs::read_to_string("/var/log/slurm/jobcomp.log").unwrap_or_default();
    let new = &after[before.len().min(after.len())..];
    assert!(
        !new.contains("Name=cibox:bt:"),
        "a job was submitted: {new}"
    );
    // A batch on several nodes must ask for the host network, which the policy grants.
    let no_net = Project::new(&format!(
        "version: 1\nproject: bt\nimage: {{locks: [cibox.yaml]}}\nbatches:\n{}",
        batch("lonely", 0, "1m", &[JUNIT_OK], "    nodes: 2\n")
    ));
    let policy = HostPolicyFile::new(&host.policy("", ""));
    let mut c = cibox(no_net.path());
    c.env("CIBOX_HOST_POLICY", policy.path())
        .args(["batch", "run", "lonely", "--image", &p.image.0]);
    run(&mut c).fails_with(
        2,
        "batches.lonely.nodes: a batch on 2 nodes needs `container: {network: host}`",
    );
}

#[test]
fn a_node_without_the_image_fetches_it_by_digest_or_refuses_it() {
    let host = SlurmHost::new();
    let p = project(&host, &batch("noimage", 0, "1m", &[JUNIT_OK], ""), "", "");
    // An ID no node has, and no `ref` to fetch it by.
    let missing = format!("sha256:{}", "e".repeat(64));
    let r = host.run(
        &p,
        &[
            "batch", "run", "noimage", "--image", &missing, "--wait", "120s",
        ],
    );
    assert_eq!(r.code, 3, "{}", r.stderr);
    let v = p.result("noimage");
    assert_eq!(v["status"], "image_refused", "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains("is not present on Slurm node") && message.contains("no `ref`"),
        "{message}"
    );
    // The project's own image, gone from the node's engine but pinned by digest in a
    // registry: the node fetches it, checks it is that ID, and runs the batch.
    let pinned = push_to_registry(&p.image.0);
    assert!(remove_image(&p.image.0), "the image could not be removed");
    let manifest = std::fs::read_to_string(p.project.path().join("cibox.yaml")).unwrap();
    let with_ref = manifest.replacen("image:\n", &format!("image:\n  ref: \"{pinned}\"\n"), 1);
    assert_ne!(with_ref, manifest);
    p.project.write("cibox.yaml", &with_ref);
    let r = host.run(&p, &["batch", "run", "noimage", "--wait", "120s"]);
    r.ok();
    assert!(
        r.stderr.contains(&format!("pulling {pinned}")),
        "{}",
        r.stderr
    );
    assert_eq!(p.result("noimage")["status"], "passed");
}

#[test]
fn capacity_and_gpu_status_say_what_the_cluster_has_free_by_node() {
    let host = SlurmHost::new();
    let p = Project::new(&format!(
        "version: 1\nproject: bt\nimage: {{locks: [cibox.yaml]}}\nbatches:\n{}{}layers:\n  two: {{batches: [pair]}}\n  four: {{batches: [quad]}}\n",
        batch("pair", 2, "1m", &[JUNIT_OK], ""),
        batch("quad", 4, "1m", &[JUNIT_OK], "")
    ));
    let policy = HostPolicyFile::new(&host.policy("", ""));
    let cibox_here = |args: &[&str]| {
        let mut c = cibox(p.path());
        c.env("CIBOX_HOST_POLICY", policy.path()).args(args);
        run(&mut c)
    };
    let _n1 = Holder::new("n1", 3);
    let _n2 = Holder::new("n2", 1);
    let status = cibox_here(&["gpu", "status", "--json"]);
    status.ok();
    let v: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(v["scheduler"], "slurm");
    let figures: Vec<(String, u64, u64, u64)> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node"].as_str().unwrap().to_string(),
                n["gpus"].as_u64().unwrap(),
                n["allocated"].as_u64().unwrap(),
                n["free"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        figures,
        [("n1".to_string(), 4, 3, 1), ("n2".to_string(), 4, 1, 3)]
    );
    let table = cibox_here(&["gpu", "status"]);
    table.ok();
    assert!(
        table.rows().contains(&"n1 mixed 4 3 1 -".to_string()),
        "{}",
        table.stdout
    );
    let cap = cibox_here(&["capacity", "--json"]);
    cap.ok();
    let v: serde_json::Value = serde_json::from_str(&cap.stdout).unwrap();
    assert_eq!(
        (v["pool"].as_u64(), v["available"].as_u64()),
        (Some(8), Some(4))
    );
    assert_eq!(v["layers"][0]["ready"], true, "two GPUs fit on n2: {v}");
    assert_eq!(v["layers"][1]["ready"], false, "{v}");
    cibox_here(&["capacity", "--require", "four"]).fails_with(
        4,
        "layer four cannot be admitted now: batch quad needs 1 node(s) with 4 GPU(s) free; partition gpu has n1: 1 free, n2: 3 free",
    );
    cibox_here(&["capacity", "--require", "two"]).ok();
}

#[test]
fn a_job_waiting_in_the_queue_says_why_and_gives_up_after_the_wait() {
    let host = SlurmHost::new();
    let p = project(&host, &batch("queued", 1, "1m", &[JUNIT_OK], ""), "", "");
    // Every GPU of the cluster held by other jobs.
    let _n1 = Holder::new("n1", 4);
    let _n2 = Holder::new("n2", 4);
    let r = host.run(&p, &["batch", "run", "queued", "--wait", "4s"]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("waits in the queue: PENDING (Resources); gives up in "),
        "{}",
        r.stderr
    );
    let v = p.result("queued");
    assert_eq!(v["status"], "capacity", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("still waits in the queue after 4s: PENDING (Resources)"),
        "{v}"
    );
    let name = job_name(&v, "queued");
    assert!(
        wait_until(10, || live_jobs(&name).is_empty()),
        "{:?}",
        jobs_named(&name)
    );
}

/// Waits until Slurm shows the job of `batch` pending.
fn wait_pending(batch: &str) {
    let prefix = format!("cibox:bt:{batch}:");
    let pending = || {
        let out = std::process::Command::new("squeue")
            .args(["-h", "-o", "%T %j"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.starts_with("PENDING ") && l.contains(&prefix))
    };
    assert!(wait_until(60, pending), "the job of {batch} never waited");
}

#[test]
fn the_time_a_job_waits_in_the_queue_is_the_batchs_wait_for_gpus() {
    let host = SlurmHost::new();
    let p = project(&host, &batch("queuewait", 1, "1m", &[JUNIT_OK], ""), "", "");
    // Every GPU of the cluster held by other jobs until the batch has waited a while.
    let n1 = Holder::new("n1", 4);
    let n2 = Holder::new("n2", 4);
    let child = host
        .cmd(&p, &["-v", "batch", "run", "queuewait", "--wait", "120s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_pending("queuewait");
    let seen = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_secs(4));
    drop(n1);
    drop(n2);
    let held = seen.elapsed().as_secs_f64();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // No GPU runtime on this engine: the container cannot start (exit 5) once the node
    // leased its GPU; the wait before it is what is checked.
    assert!(
        matches!(out.status.code(), Some(0 | 5)),
        "{:?}: {stderr}",
        out.status
    );
    let v = p.result("queuewait");
    let wait = v["gpu_wait_s"].as_f64().unwrap();
    let duration = v["duration_s"].as_f64().unwrap();
    eprintln!("held {held:.3}s; gpu_wait_s {wait}, duration_s {duration}");
    assert!(
        wait >= held - 0.5,
        "the batch waited at least {held:.1}s in the queue, its record says {wait}: {v}"
    );
    assert!(wait <= duration, "{v}");
    assert_eq!(v["gpus"].as_array().map(Vec::len), Some(1), "{v}");
    // Its steps, the queue's first, as a local run's under -v.
    for step in ["queue [", "lease [", "create ["] {
        assert!(stderr.contains(step), "no {step}: {stderr}");
    }
    assert!(stderr.contains("left the queue for n"), "{stderr}");
    // The timeline draws the queue as a wait, on the node's own GPU.
    let summary = std::fs::read_to_string(p.reports().join("summary.md")).unwrap();
    let node = v["gpus"][0]["node"].as_str().unwrap();
    let index = v["gpus"][0]["index"].as_u64().unwrap();
    assert!(
        summary.contains(&format!("section {node} GPU {index}")),
        "{summary}"
    );
    assert!(summary.contains("queuewait waits for GPUs :"), "{summary}");
}

#[test]
fn a_quiet_slurm_batch_shows_its_steps_and_heartbeat() {
    let host = SlurmHost::new();
    let p = project(
        &host,
        &batch("quiet", 0, "1m", &["echo started; sleep 5", JUNIT_OK], ""),
        "",
        "",
    );
    let mut c = host.cmd(&p, &["-v", "batch", "run", "quiet", "--wait", "120s"]);
    c.env("CIBOX_HEARTBEAT", "1s");
    let r = run(&mut c);
    r.ok();
    for step in [
        "queue [",
        "lease [",
        "create [",
        "copy [",
        "run [",
        "collect [",
    ] {
        assert!(
            r.stderr
                .lines()
                .any(|l| l.contains("batch quiet:") && l.contains(step)),
            "no {step}: {}",
            r.stderr
        );
    }
    assert!(
        r.stderr.contains("batch quiet: running for ") && r.stderr.contains("last output "),
        "no heartbeat during 5 s of silence: {}",
        r.stderr
    );
}

#[test]
fn doctor_on_a_slurm_login_node_leaves_the_gpus_to_the_nodes() {
    let host = SlurmHost::new();
    let p = project(&host, &batch("any", 1, "1m", &[JUNIT_OK], ""), "", "");
    let mut c = p.batch_cmd_bare(&["doctor", "--json"]);
    host.smi.apply(&mut c);
    let r = run(&mut c);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    let finding = |check: &str| {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == check)
            .unwrap_or_else(|| panic!("no {check} finding in {v}"))
            .clone()
    };
    assert_eq!(finding("slurm")["status"], "ok", "{v}");
    for check in ["gpu runtime", "gpu probe", "gpu pool"] {
        let f = finding(check);
        assert_eq!(f["status"], "info", "{v}");
        assert_eq!(f["blocks_gpu_batches"], false, "{v}");
        assert!(
            f["detail"]
                .as_str()
                .unwrap()
                .starts_with("not needed here: the Slurm nodes run the batches"),
            "{v}"
        );
    }
    // This engine has no GPU runtime: on a login node that fails nothing.
    assert_eq!(r.code, 0, "{v}");
    assert_eq!(v["ready_for_gpu_batches"], true, "{v}");
    // On a node (inside a job, or a host the controller names as a node) the same
    // policy checks the GPUs for real: this engine's missing runtime fails it.
    let mut c = p.batch_cmd_bare(&["doctor", "--json"]);
    host.smi.apply(&mut c);
    c.env("SLURM_JOB_ID", "1");
    let r = run(&mut c);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    assert_eq!(r.code, 5, "{v}");
    assert_eq!(v["ready_for_gpu_batches"], false, "{v}");
}
