//! An Ascend host without hardware: [`AscendHost`], the npu-smi double's state folder
//! (`tests/fixtures/npu-smi`), device files of its own made with mknod (these tests run
//! as root), the driver's user space in a folder of its own, and a private lock dir.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::cli::{Run, cibox, run};

/// The group that owns the fake Ascend device files, as `HwHiAiUser` owns the real ones.
pub const ASCEND_GID: u32 = 4343;
/// The character major of the fake `/dev/davinci*` (the driver's is given at load time).
pub const ASCEND_MAJOR: u64 = 4001;

pub struct AscendHost {
    pub n: usize,
    pub state: tempfile::TempDir,
    pub dev: tempfile::TempDir,
    /// The host's root as the hand-over reads it (`usr/local/Ascend/driver/…`).
    pub root: tempfile::TempDir,
    pub locks: tempfile::TempDir,
    pub work: tempfile::TempDir,
}

impl AscendHost {
    /// `n` idle, healthy 910B3 chips; chip `i`'s NPU ID (and `/dev/davinci<i>`) is `i`.
    pub fn new(n: usize) -> AscendHost {
        let h = AscendHost {
            n,
            state: tempfile::tempdir().unwrap(),
            dev: tempfile::tempdir().unwrap(),
            root: tempfile::tempdir().unwrap(),
            locks: tempfile::tempdir().unwrap(),
            work: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir(h.work.path().join(".git")).unwrap();
        h.set_npus(&vec!["OK"; n]);
        h.set("apps.csv", "");
        let node = |name: String, minor: u64| {
            let p = h.dev.path().join(name);
            nix::sys::stat::mknod(
                &p,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o660),
                nix::sys::stat::makedev(ASCEND_MAJOR, minor),
            )
            .unwrap_or_else(|e| panic!("mknod {} (these tests run as root): {e}", p.display()));
            std::os::unix::fs::chown(&p, Some(0), Some(ASCEND_GID)).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o660)).unwrap();
        };
        for i in 0..n {
            node(format!("davinci{i}"), i as u64);
        }
        for (i, name) in ["davinci_manager", "devmm_svm", "hisi_hdc"].iter().enumerate() {
            node(name.to_string(), 200 + i as u64);
        }
        let write = |rel: &str, text: &str| {
            let p = h.root.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        write("usr/local/Ascend/driver/lib64/libascend_hal.so", "hal\n");
        write("usr/local/Ascend/driver/version.info", "Version=24.1.0\n");
        write("usr/local/bin/npu-smi", "#!/bin/sh\necho npu-smi of the host\n");
        h
    }

    /// Chip `i`'s identity.
    pub fn id(i: usize) -> String {
        format!("NPU-0000:{:02x}:00.0", 0xc1 - i * 0x10)
    }

    /// Each chip's health, idle.
    pub fn set_npus(&self, health: &[&str]) {
        let npus: String = health
            .iter()
            .enumerate()
            .map(|(i, h)| {
                format!(
                    "{i}, {}, 0, 65536, 0, {h}\n",
                    Self::id(i)[4..].to_ascii_uppercase()
                )
            })
            .collect();
        self.set("npus.csv", &npus);
    }

    pub fn set(&self, file: &str, contents: &str) {
        std::fs::write(self.state.path().join(file), contents).unwrap();
    }

    pub fn program() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/npu-smi")
    }

    /// Points `cmd` at this host: the npu-smi double, its device files and driver, and
    /// its lock dir.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("CIBOX_NPU_SMI", Self::program())
            .env_remove("CIBOX_NVIDIA_SMI")
            .env_remove("CIBOX_ROCM_SMI")
            .env("CIBOX_FAKE_NPU_STATE", self.state.path())
            .env("CIBOX_DEV_ROOT", self.dev.path())
            .env("CIBOX_ASCEND_ROOT", self.root.path())
            .env("CIBOX_GPU_LOCK_DIR", self.locks.path())
            .env("CIBOX_PROBE_TIMEOUT", "5s");
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = cibox(self.work.path());
        self.apply(&mut c);
        c.args(args);
        c
    }

    pub fn run(&self, args: &[&str]) -> Run {
        run(&mut self.cmd(args))
    }

    /// `gpu status --json`, parsed.
    pub fn status(&self) -> serde_json::Value {
        let r = self.run(&["gpu", "status", "--json"]);
        r.ok();
        serde_json::from_str(&r.stdout).unwrap()
    }
}
