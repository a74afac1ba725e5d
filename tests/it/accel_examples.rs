//! The example manifests of SGLang's and verl's Ascend, Moore Threads and Intel jobs
//! (`examples/accelerators/`, issue 45): each parses with its host policy, and each
//! vendor's largest batch, as written there (GPU count and model glob), is leased and
//! handed over on a host of that vendor's doubles through the real engine.

use std::path::Path;

use crate::common::*;

fn example(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/accelerators")
        .join(name)
}

/// `batch list --json` of an example: each batch's name, GPU count and model.
fn batches(name: &str) -> Vec<(String, u64, String)> {
    let dir = example(name);
    let r = run(cibox(&dir).args(["--json", "batch", "list"]));
    r.ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    let list = v["batches"].as_array().unwrap_or_else(|| panic!("{v}"));
    list.iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_string(),
                b["gpus"].as_u64().unwrap(),
                b["gpu_model"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// A busybox batch named `name` asking what the example's batch asks, printing the
/// device files it got.
fn looking(name: &str, gpus: u64, model: &str) -> String {
    let script = "echo \"NODES=$(ls /dev /dev/dri 2>/dev/null | grep -E '^(davinci[0-9]|mtgpu|renderD|card)' | sort | tr '\\n' ' ')\"";
    format!(
        "  {name}:\n    gpus: {gpus}\n    gpu_model: {}\n    timeout: 1m\n    run: [{}, {}]\n",
        serde_json::to_string(model).unwrap(),
        serde_json::to_string(script).unwrap(),
        serde_json::to_string(JUNIT_OK).unwrap()
    )
}

fn nodes_of(out: &str) -> Vec<String> {
    out.lines()
        .find_map(|l| l.strip_prefix("NODES="))
        .unwrap_or_else(|| panic!("no NODES= line: {out}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Points a command at a host of doubles.
type Apply<'a> = dyn Fn(&mut std::process::Command) + 'a;

#[test]
fn each_example_parses_and_its_host_policy_chooses_its_probe() {
    let smi = FakeSmi::idle();
    let ascend = AscendHost::new(2);
    let mtt = OtherHost::new(Other::MooreThreads, 2);
    let xpu = OtherHost::new(Other::Intel, 2);
    let apply: [(&str, &str, usize, &Apply<'_>); 4] = [
        ("sglang-npu", "npu-smi", 8, &|c| ascend.apply(c)),
        ("verl-ascend", "npu-smi", 4, &|c| ascend.apply(c)),
        ("sglang-musa", "mthreads-gmi", 5, &|c| mtt.apply(c)),
        ("sglang-xpu", "xpu-smi", 2, &|c| xpu.apply(c)),
    ];
    for (name, probe, count, host) in apply {
        assert_eq!(batches(name).len(), count, "{name}");
        // A host's policy lives outside every checkout: a copy of the example's. Under
        // `auto`, the nvidia-smi that CIBOX_NVIDIA_SMI names would answer; the policy
        // chooses the vendor's tool.
        let text = std::fs::read_to_string(example(name).join("host-policy.yaml")).unwrap();
        let policy = HostPolicyFile::new(&text);
        let mut c = cibox(&example(name));
        host(&mut c);
        smi.apply(&mut c);
        c.env_remove("CIBOX_GPU_LOCK_DIR")
            .env("CIBOX_HOST_POLICY", policy.path())
            .args(["--json", "gpu", "status"]);
        let r = run(&mut c);
        r.ok();
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        assert!(
            v["probe"].as_str().unwrap().starts_with(probe),
            "{name}: {v}"
        );
    }
}

/// The example's batch `batch`, run as written (count, model) on `apply`'s host.
fn run_as_written(
    example_name: &str,
    batch: &str,
    apply: &Apply<'_>,
) -> (Vec<String>, serde_json::Value) {
    let (_, gpus, model) = batches(example_name)
        .into_iter()
        .find(|(n, ..)| n == batch)
        .unwrap_or_else(|| panic!("{example_name} has no batch {batch}"));
    let p = busybox_project(&looking(batch, gpus, &model), "");
    let mut c = p.batch_cmd(&["batch", "run", batch, "--wait", "30s"]);
    apply(&mut c);
    let r = run(&mut c);
    r.ok();
    let rec = p.result(batch);
    assert!(p.containers().is_empty());
    (nodes_of(&r.stdout), rec)
}

#[test]
fn the_examples_ascend_batches_lease_and_hand_over_through_the_doubles() {
    // verl's 8-NPU job on an Atlas 800T A2 of 8 chips (910B3), one of them sick: it
    // cannot be met, and says which chip.
    let h = AscendHost::new(8);
    let (nodes, rec) = run_as_written("verl-ascend", "e2e-ppo-grpo", &|c| {
        h.apply(c);
        c.env("CIBOX_GPU_PROBE", "npu-smi");
    });
    let want: Vec<String> = (0..8).map(|i| format!("davinci{i}")).collect();
    assert_eq!(nodes, want);
    assert_eq!(rec["gpus"].as_array().unwrap().len(), 8);
    // SGLang's A3 job (4 chips of an Ascend910 host).
    let h = AscendHost::new(8);
    h.set("npu_name", "Ascend910");
    h.set("apps.csv", "0, 4242, python3, 2890\n");
    let (nodes, _) = run_as_written("sglang-npu", "stage-b-test-4-npu-a3", &|c| h.apply(c));
    assert_eq!(nodes, ["davinci1", "davinci2", "davinci3", "davinci4"]);
}

#[test]
fn the_examples_musa_and_xpu_batches_lease_and_hand_over_through_the_doubles() {
    let h = OtherHost::new(Other::MooreThreads, 2);
    let (nodes, _) = run_as_written("sglang-musa", "multimodal-gen-test-2-gpu-musa", &|c| {
        h.apply(c);
        c.env("CIBOX_GPU_PROBE", "mthreads-gmi");
    });
    assert_eq!(nodes, ["mtgpu.0", "mtgpu.1"]);
    let h = OtherHost::new(Other::Intel, 2);
    h.set_busy(&[0]);
    let (nodes, rec) = run_as_written("sglang-xpu", "stage-a-test-1-gpu-xpu", &|c| {
        h.apply(c);
        c.env("CIBOX_GPU_PROBE", "xpu-smi");
    });
    let mut want = h.nodes(1);
    want.sort();
    assert_eq!(nodes, want);
    assert_eq!(rec["gpus"][0]["uuid"], h.id(1));
}
