//! The GPU probe's two backends, nvidia-smi (the shell fixture) and NVML (the cdylib
//! double), on the same states: they must agree, and each failure fails closed with
//! one line naming the backend, exit 5, and no lease.

use std::process::Stdio;

use crate::common::*;

/// Runs `args` on `h` through `backend`.
fn on(h: &GpuHost, backend: Backend, args: &[&str]) -> Run {
    let mut cmd = h.cmd(args);
    backend.apply(&mut cmd);
    run(&mut cmd)
}

fn restore(h: &GpuHost) {
    h.smi.set("mode", "ok");
    h.smi.set(
        "gpus.csv",
        &format!("0, {}, 0, 81559, 0\n1, {}, 0, 81559, 0\n", uuid(0), uuid(1)),
    );
    h.smi.set("apps.csv", "");
}

#[test]
fn both_backends_read_the_same_gpus() {
    let h = GpuHost::new(3);
    h.smi.set(
        "gpus.csv",
        &format!(
            "0, {}, 0, 81559, 0\n1, {}, 1024, 81559, 37\n2, {}, 300, 81559, 0\n",
            uuid(0),
            uuid(1),
            uuid(2)
        ),
    );
    h.smi.set(
        "apps.csv",
        &format!("{}, 4242, 1000\n{}, 4343, 20\n", uuid(1), uuid(1)),
    );
    let status = |b| {
        let r = on(&h, b, &["gpu", "status", "--json"]);
        r.ok();
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        (v["gpus"].clone(), v["probe"].as_str().unwrap().to_string())
    };
    let (smi, smi_name) = status(Backend::NvidiaSmi);
    let (nvml, nvml_name) = status(Backend::Nvml);
    assert_eq!(smi, nvml, "the backends disagree");
    assert_eq!(smi[1]["processes"], serde_json::json!([4242, 4343]));
    assert_eq!(smi[2]["verdict"], "busy: 300 MiB used > 256 MiB");
    assert!(smi_name.starts_with("nvidia-smi ("), "{smi_name}");
    assert!(
        nvml_name.starts_with("NVML 12.550.54.15 (") && nvml_name.ends_with("driver 550.54.15"),
        "{nvml_name}"
    );
}

#[test]
fn both_backends_fail_closed_on_the_same_states() {
    // (file, contents, what the nvidia-smi backend says, what the NVML one says)
    let states = [
        (
            "gpus.csv",
            format!("0, {}, [N/A], 81559, 0\n", uuid(0)),
            "memory.used is `[N/A]`",
            "nvmlDeviceGetMemoryInfo: ",
        ),
        (
            "gpus.csv",
            format!("0, {}, 0, 81559, [Not Supported]\n", uuid(0)),
            "utilization.gpu is `[Not Supported]`",
            "nvmlDeviceGetUtilizationRates: ",
        ),
        (
            "gpus.csv",
            "0, GPU-zzzz, 0, 81559, 0\n".to_string(),
            "is not a GPU UUID",
            "is not a GPU UUID",
        ),
        (
            "gpus.csv",
            format!("0, {}, 0, 81559, 0\n1, {}, 0, 81559, 0\n", uuid(0), uuid(0)),
            "appears twice",
            "is also GPU 0's",
        ),
        (
            "apps.csv",
            format!("{}, 12, [N/A]\n", uuid(0)),
            "used_memory is `[N/A]`",
            "uses an amount of memory NVML cannot give",
        ),
        (
            "mode",
            "fail".to_string(),
            "couldn't communicate with the NVIDIA driver",
            "nvmlInit_v2: NVIDIA driver is not loaded",
        ),
        (
            "mode",
            "mismatch".to_string(),
            "Driver/library version mismatch",
            "nvmlInit_v2: RM detects a driver/library version mismatch",
        ),
        (
            "mode",
            "lost".to_string(),
            "GPU is lost",
            "nvmlDeviceGetHandleByIndex: device fell off the bus",
        ),
        (
            "mode",
            "hang".to_string(),
            "did not answer within 2s",
            "nvmlInit did not answer within 2s",
        ),
    ];
    for (file, contents, smi_says, nvml_says) in states {
        let h = GpuHost::new(2);
        h.smi.set(file, &contents);
        for (backend, says, names) in [
            (Backend::NvidiaSmi, smi_says, "nvidia-smi"),
            (Backend::Nvml, nvml_says, "NVML ("),
        ] {
            for args in [
                &["gpu", "status"][..],
                &["gpu", "exec", "--count", "1", "--", "true"],
            ] {
                let r = on(&h, backend, args);
                r.fails_with(5, says).fails_with(5, names);
            }
        }
        restore(&h);
        assert!(h.leased().is_empty(), "no lease kept after `{smi_says}`");
        assert_eq!(h.queued(), 0, "no ticket kept after `{smi_says}`");
    }
}

#[test]
fn a_library_that_is_not_a_working_nvml_fails_closed() {
    let h = GpuHost::new(2);
    let not_a_library = h.work.path().join("libnvidia-ml.so.1");
    std::fs::write(&not_a_library, "not an ELF file").unwrap();
    // A FIFO would block the loader's open for ever.
    let fifo = h.work.path().join("fifo.so");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let cases = [
        ("/nonexistent/libnvidia-ml.so.1", "loading the library"),
        (fifo.to_str().unwrap(), "is not a plain file"),
        (not_a_library.to_str().unwrap(), "loading the library"),
        // A real shared object without NVML's entry points.
        ("libc.so.6", "this library is not NVML"),
    ];
    for (lib, says) in cases {
        for args in [
            &["gpu", "status"][..],
            &["gpu", "exec", "--count", "1", "--", "true"],
        ] {
            // Named by CIBOX_NVML_LIB, a library must load: no fallback to nvidia-smi,
            // even with gpu.probe left at auto.
            let mut cmd = h.cmd(args);
            cmd.env_remove("CIBOX_NVIDIA_SMI")
                .env_remove("CIBOX_GPU_PROBE")
                .env("CIBOX_NVML_LIB", lib);
            run(&mut cmd)
                .fails_with(5, &format!("GPU probe: NVML ({lib})"))
                .fails_with(5, says);
        }
    }
    assert!(h.leased().is_empty());
    assert_eq!(h.queued(), 0);
}

#[test]
fn auto_falls_back_to_nvidia_smi_only_when_the_default_nvml_cannot_load() {
    // This machine has no NVIDIA driver, so libnvidia-ml.so.1 cannot be loaded.
    let h = GpuHost::new(2);
    let bin = h.work.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(FakeSmi::program(), bin.join("nvidia-smi")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let mut cmd = h.cmd(&["gpu", "status"]);
    cmd.env_remove("CIBOX_NVIDIA_SMI").env("PATH", &path);
    let r = run(&mut cmd);
    r.ok();
    assert!(
        r.stdout
            .starts_with("probe: nvidia-smi (nvidia-smi); NVML not loaded: libnvidia-ml.so.1"),
        "{}",
        r.stdout
    );
    // Chosen explicitly, NVML never falls back.
    let mut cmd = h.cmd(&["gpu", "exec", "--count", "1", "--", "true"]);
    cmd.env_remove("CIBOX_NVIDIA_SMI")
        .env("PATH", &path)
        .env("CIBOX_GPU_PROBE", "nvml");
    run(&mut cmd).fails_with(
        5,
        "GPU probe: NVML (libnvidia-ml.so.1): loading the library",
    );
    // Neither backend: the one line says both.
    let mut cmd = h.cmd(&["gpu", "status"]);
    cmd.env_remove("CIBOX_NVIDIA_SMI");
    run(&mut cmd).fails_with(5, "and NVML was not loaded");
    // A bad choice is a usage error.
    let mut cmd = h.cmd(&["gpu", "status"]);
    cmd.env("CIBOX_GPU_PROBE", "nvml-please");
    run(&mut cmd).fails_with(2, "CIBOX_GPU_PROBE");
}

#[test]
fn a_gpu_that_disappears_while_a_waiter_probes_fails_closed() {
    for backend in Backend::BOTH {
        // GPU 1 runs a process cibox does not know, so a request for both waits and
        // probes again; then GPU 1 falls off the bus.
        let h = GpuHost::new(2);
        h.smi.set("apps.csv", &format!("{}, 4242, 100\n", uuid(1)));
        let mut cmd = h.cmd(&["gpu", "exec", "--count", "2", "--wait", "30s", "--", "true"]);
        backend.apply(&mut cmd);
        let waiter = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(
            wait_until(10, || h.queued() == 1),
            "{backend:?}: the waiter queues"
        );
        // Let it probe at least once with both GPUs there.
        std::thread::sleep(std::time::Duration::from_millis(300));
        h.smi.set("apps.csv", "");
        h.smi
            .set("gpus.csv", &format!("0, {}, 0, 81559, 0\n", uuid(0)));
        let out = waiter.wait_with_output().unwrap();
        let r = Run::from(out);
        r.fails_with(
            5,
            &format!(
                "GPU 1 ({}) was there at an earlier probe and is gone now",
                uuid(1)
            ),
        );
        restore(&h);
        assert!(h.leased().is_empty(), "{backend:?}: no lease kept");
        assert_eq!(h.queued(), 0, "{backend:?}: no ticket kept");
    }
}

#[test]
fn nvml_is_initialised_once_per_process_however_often_it_probes() {
    // A waiter keeps its NVML handle: its probes are driver calls, not new sessions.
    let h = GpuHost::new(1);
    h.smi.set("apps.csv", &format!("{}, 4242, 100\n", uuid(0)));
    h.smi.set("calls.log", "");
    let mut cmd = h.cmd(&["gpu", "exec", "--count", "1", "--wait", "3s", "--", "true"]);
    Backend::Nvml.apply(&mut cmd);
    run(&mut cmd).fails_with(4, "busy outside cibox");
    let calls = std::fs::read_to_string(h.smi.state.path().join("calls.log")).unwrap();
    let inits = calls.lines().filter(|l| *l == "nvml init").count();
    let probes = calls.lines().filter(|l| *l == "nvml count").count();
    assert_eq!(inits, 1, "{calls}");
    assert!(
        probes >= 2,
        "the waiter probed again while it waited:\n{calls}"
    );
}
