use super::*;

/// The plan of the test manifest's batch `b` (1 GPU).
pub(crate) fn run_plan() -> RunPlan {
    plan(manifest(), request(&["b"], None), &host()).unwrap()
}

/// A planned batch named `name` (batch `b` of the test manifest, 1 GPU).
pub(crate) fn batch_plan(name: &str) -> BatchPlan {
    let mut b = plan(manifest(), request(&["b"], None), &host())
        .unwrap()
        .batches
        .remove(0);
    b.name = name.into();
    b
}

const IMAGE: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn manifest() -> Manifest {
    let text = "version: 1\nproject: p\nimage: {locks: [x]}\ncontainer: {env: {A: base, B: base}, pass_env: [TOKEN]}\nbatches:\n  a: {gpus: 0, timeout: 1m, run: [\"true\"]}\n  b: {gpus: 1, timeout: 2m, run: [\"true\"], env: {B: batch}, fast_env: {F: \"1\"}}\n  c: {gpus: 2, timeout: 1m, run: [\"true\"]}\nlayers:\n  \"2\": {batches: [a, b], fast: true}\n";
    Manifest::parse(text, std::path::Path::new("cibox.yaml")).unwrap()
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn host() -> HostFacts {
    HostFacts {
        host: "h".into(),
        uid: 1000,
        gid: 1000,
        run_id: "0123456789abcdef".into(),
        pass_env: BTreeMap::from([("TOKEN".to_string(), "secret".to_string())]),
        mounts: HostMounts::default(),
        policy_digest: None,
        caches: None,
        devices: Default::default(),
    }
}

fn request(names_: &[&str], layer: Option<&str>) -> RunRequest {
    RunRequest {
        names: names(names_),
        layer: layer.map(str::to_string),
        image: Some(IMAGE.into()),
        source: "/src/p".into(),
        reports: "/tmp/r".into(),
        scope: "local-me".into(),
        ..RunRequest::default()
    }
}

#[test]
fn a_run_whose_cache_writes_stay_private_tells_its_slurm_nodes() {
    let mut r = request(&["a"], None);
    r.private_caches = Some("pull_request_target".into());
    let p = plan(manifest(), r, &host()).unwrap();
    let job = crate::run::slurm::node::NodeJob::of(&p, 0, 1);
    let sent: crate::run::slurm::node::NodeJob =
        serde_json::from_str(&serde_json::to_string(&job).unwrap()).unwrap();
    assert_eq!(sent.private_caches.as_deref(), Some("pull_request_target"));
    assert_eq!(sent.pull_request, None);
    // A pull request's run: the node keeps its writes in that scope, or private.
    let mut r = request(&["a"], None);
    r.pull_request = Some(7);
    let p = plan(manifest(), r, &host()).unwrap();
    let job = crate::run::slurm::node::NodeJob::of(&p, 0, 1);
    let sent: crate::run::slurm::node::NodeJob =
        serde_json::from_str(&serde_json::to_string(&job).unwrap()).unwrap();
    assert_eq!(sent.pull_request, Some(7));
    assert_eq!(sent.private_caches, None);
}

#[test]
fn each_task_of_a_slurm_job_runs_under_an_id_of_its_own() {
    let role = |rank| NodeRole {
        run_id: "0123456789abcdef".into(),
        rank,
        nodes: 2,
        ..NodeRole::default()
    };
    let (a, b) = (role(0).task_run_id("b"), role(1).task_run_id("b"));
    assert!(crate::lockdir::runs::is_run_id(&a) && crate::lockdir::runs::is_run_id(&b));
    assert_ne!(a, b);
    assert_ne!(a, role(0).task_run_id("c"));
    assert_eq!(a, role(0).task_run_id("b"), "the same task, the same ID");
}

#[test]
fn names_with_a_layer_run_only_those_names_in_its_mode() {
    let m = manifest();
    assert_eq!(
        select(&m, &names(&["b"]), Some("2")).unwrap(),
        (names(&["b"]), true)
    );
    assert_eq!(
        select(&m, &[], Some("2")).unwrap(),
        (names(&["a", "b"]), true)
    );
    assert_eq!(
        select(&m, &names(&["c", "a", "c"]), None).unwrap(),
        (names(&["c", "a"]), false)
    );
    let err = select(&m, &names(&["c"]), Some("2"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("batch `c` is not in layer `2` (its batches: a, b)"),
        "{err}"
    );
    assert!(select(&m, &[], None).is_err());
    let err = select(&m, &names(&["bb"]), None).unwrap_err().to_string();
    assert_eq!(err, "unknown batch `bb`; did you mean `b`?");
}

#[test]
fn a_plan_resolves_each_batch() {
    let p = plan(manifest(), request(&[], Some("2")), &host()).unwrap();
    assert!(p.fast, "the layer's fast mode");
    assert_eq!(p.wait, manifest().gpu.wait.0);
    let b = &p.batches[1];
    assert_eq!((b.name.as_str(), b.gpus), ("b", 1));
    assert_eq!(b.timeout.to_string(), "2m");
    assert_eq!(b.dir, PathBuf::from("/tmp/r/b"));
    assert_eq!(b.container.name, "cibox-p-local-me-b-01234567");
    // The record gets the manifest's variables, batch over base, fast ones on top,
    // and never a host value.
    assert_eq!(
        b.container.manifest_env,
        BTreeMap::from([
            ("A".to_string(), "base".to_string()),
            ("B".to_string(), "batch".to_string()),
            ("F".to_string(), "1".to_string()),
        ])
    );
    let body = b
        .container
        .body(&crate::gpu::vendor::Handover::default(), &[], true);
    let env = body.env.unwrap();
    assert!(env.contains(&"TOKEN=secret".to_string()), "{env:?}");
    assert!(env.contains(&"CIBOX_FAST=1".to_string()), "{env:?}");
    assert_eq!(b.container.user(), "1000:1000");
    assert_eq!(
        body.user.as_deref(),
        Some("0:0"),
        "the keeper, not the batch"
    );
    let forced = RunRequest {
        fast: Some(false),
        wait: Some(Duration::from_secs(7)),
        ..request(&["b"], Some("2"))
    };
    let p = plan(manifest(), forced, &host()).unwrap();
    assert!(!p.fast);
    let root = HostFacts {
        uid: 0,
        gid: 0,
        ..host()
    };
    let as_root = plan(manifest(), request(&["a"], None), &root).unwrap();
    // A batch never runs as host root.
    assert_eq!(as_root.batches[0].container.user(), "65534:65534");
    assert_eq!(p.wait, Duration::from_secs(7));
    assert!(!p.batches[0].container.manifest_env.contains_key("F"));
}

#[test]
fn a_parallel_run_starts_the_widest_then_the_longest_and_a_part_holds_its_share() {
    let text = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1h, run: [x], gpus: 0}\nbatches:\n  short: {est_time: 1m}\n  long: {est_time: 30m}\n  mid: {est_time: 10m, gpus: 2}\n  unknown: {}\nlayers:\n  l: {batches: all, fail_fast: true}\n";
    let m = Manifest::parse(text, std::path::Path::new("cibox.yaml")).unwrap();
    let order = |parallel: bool, partition: Option<&str>| {
        let r = RunRequest {
            parallel,
            partition: partition.map(|p| p.parse().unwrap()),
            ..request(&[], Some("l"))
        };
        let p = plan(m.clone(), r, &host()).unwrap();
        assert!(p.fail_fast, "the layer's fail_fast");
        p.batches.iter().map(|b| b.name.clone()).collect::<Vec<_>>()
    };
    assert_eq!(order(false, None), ["short", "long", "mid", "unknown"]);
    // `unknown` is expected to take the mean of the others: 13m 40s. The widest
    // first (`mid` holds two GPUs), then the longest.
    assert_eq!(order(true, None), ["mid", "long", "unknown", "short"]);
    // Work: long 1800, mid 1200 (two GPUs), unknown 820, short 60 GPU-seconds.
    assert_eq!(order(false, Some("1/2")), ["short", "long"]);
    assert_eq!(order(false, Some("2/2")), ["mid", "unknown"]);
    assert_eq!(order(true, Some("1/2")), ["long", "short"]);
    let p = plan(
        m.clone(),
        RunRequest {
            partition: Some("2/2".parse().unwrap()),
            retries: Some(3),
            ..request(&[], Some("l"))
        },
        &host(),
    )
    .unwrap();
    assert_eq!(
        p.partition.map(|(s, n)| (s.to_string(), n)),
        Some(("2/2".into(), 4))
    );
    assert!(p.batches.iter().all(|b| b.retries.count == 3));
}

#[test]
fn a_batch_run_as_part_of_a_layer_takes_that_layers_image_and_no_other() {
    let text = "version: 1\nproject: p\nimages:\n  default: {locks: [x], id: \"sha256:0000000000000000000000000000000000000000000000000000000000000000\", install: [\"pip install -e .\"]}\n  slime-test: {locks: [y], id: \"sha256:1111111111111111111111111111111111111111111111111111111111111111\", install: [\"pip install --no-deps -e .\"]}\nbatches:\n  a: {gpus: 0, timeout: 1m, run: [\"true\"]}\n  b: {gpus: 0, timeout: 1m, run: [\"true\"], install: [\"make\"]}\nlayers:\n  megatron: {batches: [a, b]}\n  image: {batches: [a, b], image: slime-test}\n";
    let m = Manifest::parse(text, std::path::Path::new("cibox.yaml")).unwrap();
    let run = |layer: Option<&str>| {
        let mut r = request(&["a", "b"], layer);
        r.image = None;
        plan(m.clone(), r, &host()).unwrap()
    };
    let megatron = run(Some("megatron"));
    assert_eq!(megatron.images.keys().collect::<Vec<_>>(), ["default"]);
    assert_eq!(megatron.batches[0].image_name, "default");
    let image = run(Some("image"));
    assert_eq!(image.images.keys().collect::<Vec<_>>(), ["slime-test"]);
    // Each image installs the source its own way; a batch's own install wins.
    let script = |p: &RunPlan, i: usize| p.batches[i].container.steps()[2].clone();
    assert!(script(&megatron, 0).contains("cibox install: pip install -e ."));
    assert!(script(&image, 0).contains("cibox install: pip install --no-deps -e ."));
    assert!(script(&image, 1).contains("cibox install: make"));
    assert!(!script(&image, 1).contains("pip install"));
}

#[test]
fn the_image_comes_from_the_request_else_the_manifest_and_must_be_an_id() {
    let no_image = RunRequest {
        image: None,
        ..request(&["a"], None)
    };
    assert!(matches!(
        plan(manifest(), no_image, &host()),
        Err(PlanError::NoImage)
    ));
    let tag = RunRequest {
        image: Some("ubuntu:latest".into()),
        ..request(&["a"], None)
    };
    assert!(matches!(
        plan(manifest(), tag, &host()),
        Err(PlanError::BadImageId(_))
    ));
}

/// A batch of 3 shards is 3 units: each its own container, folder and variables, its
/// GPUs leased apart (`gpus` each), the split dealing one shard to each part.
#[test]
fn a_sharded_batch_is_planned_as_its_shards() {
    let text = "version: 1\nproject: p\nimage: {locks: [x]}\nbatches:\n  a: {gpus: 0, timeout: 1m, run: [\"true\"]}\n  k: {gpus: 2, timeout: 9m, est_time: 9m, shards: 3, run: [\"true\"]}\n";
    let m = Manifest::parse(text, std::path::Path::new("cibox.yaml")).unwrap();
    let p = plan(m.clone(), request(&["k", "a"], None), &host()).unwrap();
    let units: Vec<&str> = p.batches.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(units, ["k[1/3]", "k[2/3]", "k[3/3]", "a"]);
    let second = &p.batches[1];
    assert_eq!(second.gpus, 2);
    assert_eq!(second.expected, Duration::from_secs(180));
    assert_eq!(
        second.shard,
        Some(Shard {
            batch: "k".into(),
            index: 1,
            count: 3
        })
    );
    assert_eq!(second.dir, std::path::Path::new("/tmp/r/k/shard-2"));
    assert!(
        second.container.name.ends_with("-s1"),
        "{}",
        second.container.name
    );
    let env = second.container.env_for_test();
    for want in [
        "CIBOX_SHARD_INDEX=1",
        "CIBOX_SHARD_COUNT=3",
        "BUILDKITE_PARALLEL_JOB=1",
        "BUILDKITE_PARALLEL_JOB_COUNT=3",
        "CIBOX_BATCH=k",
    ] {
        assert!(env.iter().any(|e| e == want), "{want}: {env:?}");
    }
    // An unsharded batch is shard 0 of 1, so a step written for shards runs whole.
    let a = p.batches[3].container.env_for_test();
    assert!(a.iter().any(|e| e == "CIBOX_SHARD_COUNT=1"), "{a:?}");
    assert!(
        !a.iter().any(|e| e.starts_with("BUILDKITE_PARALLEL_JOB")),
        "{a:?}"
    );
    // `--partition K/3` of the batch alone (a Buildkite step with `parallelism: 3`):
    // shard K in part K.
    for k in 1..=3 {
        let mut r = request(&["k"], None);
        r.partition = Some(format!("{k}/3").parse().unwrap());
        let p = plan(m.clone(), r, &host()).unwrap();
        let units: Vec<&str> = p.batches.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(units, [format!("k[{k}/3]")]);
    }
    assert_eq!(check_request(&m, &request(&["k"], None)).unwrap(), ["k"]);
}
