//! GPU batches: a container that cannot start gives its lease back, and GPUs held by a
//! running cibox container are never leased.

use super::batch;
use crate::common::*;

#[test]
fn a_gpu_batch_on_an_engine_without_gpu_runtime_is_exit_5_and_cleaned_up() {
    let p = busybox_project(&batch("g", 1, "1m", &[JUNIT_OK], ""), "");
    let smi = FakeSmi::with_gpus(2);
    let locks = tempfile::tempdir().unwrap();
    let mut c = p.batch_cmd(&["batch", "run", "g"]);
    smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", locks.path());
    let r = run(&mut c);
    // The fixture's UUIDs exist on no host, so even an engine with a GPU runtime fails
    // to start this container: always exit 5.
    assert_eq!(r.code, 5, "{}", r.stderr);
    let v = p.result("g");
    assert_eq!(v["status"], "infra_error");
    assert!(
        v["message"].as_str().unwrap().contains("could not start"),
        "{v}"
    );
    // GPU 0, unless another test's cibox container names the fixture's GPU 0 just now.
    assert!(
        [uuid(0), uuid(1)].contains(
            &v["gpus"][0]["uuid"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        ),
        "{v}"
    );
    assert!(p.containers().is_empty());
    // The lease went with the container.
    let mut c = cibox(p.project.path());
    smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", locks.path())
        .args(["gpu", "exec", "--count", "2", "--wait", "0s", "--", "true"]);
    run(&mut c).ok();
}

#[test]
fn gpus_of_a_running_cibox_container_are_never_leased() {
    let p = busybox_project(&batch("g", 2, "1m", &[JUNIT_OK], ""), "");
    let smi = FakeSmi::with_gpus(2);
    let locks = tempfile::tempdir().unwrap();
    // A container left running by a cibox that died: its lock died with it, its label
    // still names GPU 0, and the dead run's record is in the lock dir's runs/.
    let name = format!("cibox-bt-orphan-{}", nonce());
    let run_id = "0123456789abcdef";
    std::fs::create_dir_all(locks.path().join("runs")).unwrap();
    std::fs::write(
        locks.path().join(format!("runs/{run_id}.lock")),
        r#"{"project":"bt","scope":"orphans"}"#,
    )
    .unwrap();
    let out = std::process::Command::new("docker")
        .args([
            "run",
            "-d",
            "--name",
            &name,
            "--label",
            "org.cibox.owner=cibox",
            "--label",
            &format!("org.cibox.run={run_id}"),
            "--label",
        ])
        .arg(format!("org.cibox.gpus={}", uuid(0)))
        .args([&p.image.0, "sleep", "600"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut c = p.batch_cmd(&["batch", "run", "g", "--wait", "0s"]);
    smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", locks.path());
    let r = run(&mut c);
    // `gpu exec` and `gpu status` see it too; GPU 1 stays free.
    let cibox_on_fixture = |args: &[&str]| {
        let mut c = cibox(p.project.path());
        smi.apply(&mut c);
        c.env("CIBOX_GPU_LOCK_DIR", locks.path()).args(args);
        run(&mut c)
    };
    let exec = cibox_on_fixture(&[
        "gpu",
        "exec",
        "--devices",
        "0",
        "--wait",
        "0s",
        "--",
        "true",
    ]);
    let exec_other = cibox_on_fixture(&[
        "gpu",
        "exec",
        "--devices",
        "1",
        "--wait",
        "0s",
        "--",
        "true",
    ]);
    let status = cibox_on_fixture(&["gpu", "status"]);
    std::process::Command::new("docker")
        .args(["rm", "-f", &name])
        .output()
        .unwrap();
    exec.fails_with(4, &format!("GPU 0 used by running cibox container {name}"));
    exec_other.ok();
    assert!(status.stdout.contains(&name), "{}", status.stdout);
    assert_eq!(r.code, 4, "{}", r.stderr);
    let v = p.result("g");
    assert_eq!(v["status"], "capacity");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains(&format!("GPU 0 used by running cibox container {name}")),
        "{v}"
    );
    assert!(p.containers().is_empty());
}

#[test]
fn a_batch_that_waits_for_its_gpus_says_where_it_stands_and_records_the_wait() {
    let p = busybox_project(&batch("g", 1, "1m", &[JUNIT_OK], ""), "");
    let host = GpuHost::new(1);
    let mut holder = host
        .cmd(&["gpu", "exec", "--count", "1", "--", "sleep", "2"])
        .spawn()
        .unwrap();
    assert!(wait_until(10, || host.leased() == [0] && host.queued() == 0));
    let mut c = p.batch_cmd(&["batch", "run", "g", "--wait", "30s"]);
    host.smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", host.locks.path())
        .env("CIBOX_PROBE_TIMEOUT", "2s");
    let r = run(&mut c);
    holder.wait().unwrap();
    // It got the GPU once the holder let go (and the engine, without a GPU runtime for
    // the fixture's UUIDs, could not start it).
    assert_eq!(r.code, 5, "{}", r.stderr);
    let line = r
        .stderr
        .lines()
        .find(|l| l.contains("batch g: waiting"))
        .unwrap_or_else(|| panic!("no wait line:\n{}", r.stderr));
    assert!(
        line.contains("for 1 GPU(s): queue position 1, leased: GPU 0 by pid"),
        "{line}"
    );
    assert!(line.contains("; gives up in 30s, at "), "{line}");
    let v = p.result("g");
    assert_eq!(v["gpus"][0]["uuid"], uuid(0), "{v}");
    let waited = v["gpu_wait_s"].as_f64().unwrap();
    assert!(
        waited > 0.0 && waited <= v["duration_s"].as_f64().unwrap(),
        "{v}"
    );
}

#[test]
fn the_record_says_what_hardware_the_batch_ran_on_with_either_probe() {
    let p = busybox_project(
        &(batch("g", 1, "1m", &[JUNIT_OK], "") + &batch("cpu", 0, "1m", &[JUNIT_OK], "")),
        "",
    );
    for backend in Backend::BOTH {
        let smi = FakeSmi::with_gpus(2);
        smi.set("gpu_name", "NVIDIA A100-SXM4-80GB");
        smi.set("compute_cap", "8.0");
        smi.set("cuda_version", "12.2");
        smi.set("driver_version", "535.104.05");
        let locks = tempfile::tempdir().unwrap();
        let mut c = p.batch_cmd(&["batch", "run", "g", "cpu", "--wait", "30s"]);
        smi.apply(&mut c);
        backend.apply(&mut c);
        c.env("CIBOX_GPU_LOCK_DIR", locks.path());
        let r = run(&mut c);
        // The fixture's GPUs exist on no engine: the batch leases one and cannot start.
        assert_eq!(r.code, 5, "{backend:?}: {}", r.stderr);
        let hw = &p.result("g")["hardware"];
        // Another test's cibox container may hold the fixture's GPU 0 for a moment: the
        // lease then takes GPU 1, and the record must name whichever it was.
        let index = hw["gpus"][0]["index"].as_u64().unwrap_or(0) as usize;
        assert!(index < 2, "{backend:?}: {hw}");
        assert_eq!(
            hw["gpus"],
            serde_json::json!([{
                "index": index,
                "uuid": uuid(index),
                "name": "NVIDIA A100-SXM4-80GB",
                "memory_mib": 81559,
                "driver": "535.104.05",
                "cuda": "12.2",
                "compute_capability": "8.0",
            }]),
            "{backend:?}: {hw}"
        );
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        assert_eq!(hw["kernel"], kernel.trim(), "{hw}");
        assert!(!hw["engine"].as_str().unwrap().is_empty(), "{hw}");
        let cpu = &p.result("cpu")["hardware"];
        assert_eq!(cpu["gpus"], serde_json::json!([]), "{cpu}");
        assert_eq!(cpu["engine"], hw["engine"], "{cpu}");
    }
    // A driver too old to say the compute capability: the rest is still recorded.
    let smi = FakeSmi::with_gpus(1);
    smi.set("compute_cap", "old");
    let locks = tempfile::tempdir().unwrap();
    let mut c = p.batch_cmd(&["batch", "run", "g", "--wait", "30s"]);
    smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", locks.path());
    assert_eq!(run(&mut c).code, 5);
    let gpu = &p.result("g")["hardware"]["gpus"][0];
    assert_eq!(gpu["name"], "NVIDIA H100 80GB HBM3", "{gpu}");
    assert!(gpu["compute_capability"].is_null(), "{gpu}");
}

#[test]
fn the_summary_and_timeline_svg_picture_which_batch_ran_on_which_gpu_when() {
    let p = busybox_project(
        &(batch("cpu", 0, "1m", &["sleep 1", JUNIT_OK], "")
            + &batch("g1", 1, "1m", &[JUNIT_OK], "")
            + &batch("g2", 1, "1m", &[JUNIT_OK], "")),
        "",
    );
    let host = GpuHost::new(1);
    let mut c = p.batch_cmd(&[
        "batch",
        "run",
        "cpu",
        "g1",
        "g2",
        "--parallel",
        "--wait",
        "30s",
    ]);
    host.smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", host.locks.path());
    let r = run(&mut c);
    // The fixture's GPU exists on no engine: both GPU batches get GPU 0, one after the
    // other, and cannot start.
    assert_eq!(r.code, 5, "{}", r.stderr);
    let summary = std::fs::read_to_string(p.reports().join("summary.md")).unwrap();
    let block = summary
        .split("```mermaid\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("no Mermaid block:\n{summary}"));
    // Room for the GPUs' names left of the bars, then the chart.
    assert!(
        block.starts_with("%%{init: {\"gantt\": {\"leftPadding\": 223}}}%%\n"),
        "{block}"
    );
    let lines: Vec<&str> = block.lines().skip(1).map(str::trim).collect();
    assert_eq!(lines[0], "gantt", "{block}");
    assert!(lines.contains(&"axisFormat %M:%S.%L"), "{block}");
    assert!(lines.contains(&"dateFormat x"), "{block}");
    assert!(
        lines.contains(&"section GPU 0 (NVIDIA H100 80GB HBM3)") && lines.contains(&"section CPU"),
        "{block}"
    );
    // Every task: `NAME :[tags, ]id, start, end` with start < end in Unix milliseconds.
    let tasks: Vec<&str> = lines.iter().copied().filter(|l| l.contains(" :")).collect();
    for t in &tasks {
        let (_, data) = t.split_once(" :").unwrap();
        let fields: Vec<&str> = data.split(", ").collect();
        let (start, end) = (fields[fields.len() - 2], fields[fields.len() - 1]);
        let (start, end): (u64, u64) = (start.parse().unwrap(), end.parse().unwrap());
        assert!(start < end && start > 1_700_000_000_000, "{t}");
    }
    for name in [
        "cpu passed :done",
        "g1 infra_error :crit",
        "g2 infra_error :crit",
    ] {
        assert!(tasks.iter().any(|t| t.starts_with(name)), "{name}: {block}");
    }
    let svg = std::fs::read_to_string(p.reports().join("timeline.svg")).unwrap();
    assert!(
        svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "{svg}"
    );
    for text in [
        ">GPU 0 (NVIDIA H100 80GB HBM3)<",
        ">CPU<",
        ">g1<",
        ">g2<",
        ">cpu<",
        "passed ",
    ] {
        assert!(
            svg.contains(text),
            "{text} missing from the picture:\n{svg}"
        );
    }
    assert!(!svg.contains("<script") && !svg.contains("href"), "{svg}");
}

#[test]
fn a_batch_asking_a_gpu_model_leases_only_that_model_and_records_it() {
    // A mixed host: GPUs 1 and 3 are A100s, 0 and 2 H100s. `defaults` asks the
    // H100, one batch the A100, one a model the host lacks.
    let p = busybox_project(
        &format!(
            "{}{}{}",
            batch("h", 1, "1m", &[JUNIT_OK], ""),
            batch("a", 1, "1m", &[JUNIT_OK], "    gpu_model: \"*A100*\"\n"),
            batch("b", 1, "1m", &[JUNIT_OK], "    gpu_model: \"*B200*\"\n"),
        ),
        "defaults:\n  gpu_model: \"*H100*\"\n",
    );
    let smi = FakeSmi::with_gpus(4);
    smi.set("gpu_name.1", "NVIDIA A100-SXM4-80GB");
    smi.set("gpu_name.3", "NVIDIA A100-SXM4-80GB");
    let locks = tempfile::tempdir().unwrap();
    let batch_run = |name: &str| {
        let mut c = p.batch_cmd(&["batch", "run", name, "--wait", "0s"]);
        smi.apply(&mut c);
        c.env("CIBOX_GPU_LOCK_DIR", locks.path());
        run(&mut c)
    };
    for (name, own, model) in [
        ("a", [uuid(1), uuid(3)], "NVIDIA A100-SXM4-80GB"),
        ("h", [uuid(0), uuid(2)], "NVIDIA H100 80GB HBM3"),
    ] {
        // No host here can start a container on the fixture's GPUs: exit 5, after the
        // lease (another test's container may hold one of the two just now).
        let r = batch_run(name);
        assert_eq!(r.code, 5, "{name}: {}", r.stderr);
        let v = p.result(name);
        let leased = v["gpus"][0]["uuid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(own.contains(&leased), "{name} leased {v}");
        assert_eq!(v["hardware"]["gpus"][0]["name"], model, "{v}");
        assert_eq!(
            v["gpu_model"],
            if name == "a" { "*A100*" } else { "*H100*" }
        );
    }
    let r = batch_run("b");
    assert_eq!(r.code, 4, "{}", r.stderr);
    let v = p.result("b");
    assert_eq!(v["status"], "capacity");
    assert!(
        v["message"].as_str().unwrap().contains(
            "no GPU of model `*B200*` in the pool; it has 2 × NVIDIA H100 80GB HBM3, 2 × NVIDIA A100-SXM4-80GB"
        ),
        "{v}"
    );
    assert!(p.containers().is_empty());
}
