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
        for (i, name) in ["davinci_manager", "devmm_svm", "hisi_hdc"]
            .iter()
            .enumerate()
        {
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
        write(
            "usr/local/bin/npu-smi",
            "#!/bin/sh\necho npu-smi of the host\n",
        );
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

/// An Intel or Moore Threads host without hardware: the tool double's state folder, a
/// sysfs and device files of its own (mknod; these tests run as root), a lock dir.
pub struct OtherHost {
    pub kind: Other,
    pub n: usize,
    pub state: tempfile::TempDir,
    pub sysfs: tempfile::TempDir,
    pub dev: tempfile::TempDir,
    pub locks: tempfile::TempDir,
    pub work: tempfile::TempDir,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Other {
    Intel,
    MooreThreads,
}

/// The group that owns the fake device files (`render`'s stand-in).
pub const OTHER_GID: u32 = 4444;
/// The character major of the fake `/dev/mtgpu.N`.
pub const MTT_MAJOR: u64 = 4002;

impl OtherHost {
    pub fn new(kind: Other, n: usize) -> OtherHost {
        let h = OtherHost {
            kind,
            n,
            state: tempfile::tempdir().unwrap(),
            sysfs: tempfile::tempdir().unwrap(),
            dev: tempfile::tempdir().unwrap(),
            locks: tempfile::tempdir().unwrap(),
            work: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir(h.work.path().join(".git")).unwrap();
        h.set_idle();
        let node = |rel: String, major: u64, minor: u64| {
            let p = h.dev.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            nix::sys::stat::mknod(
                &p,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o660),
                nix::sys::stat::makedev(major, minor),
            )
            .unwrap_or_else(|e| panic!("mknod {} (these tests run as root): {e}", p.display()));
            std::os::unix::fs::chown(&p, Some(0), Some(OTHER_GID)).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o660)).unwrap();
        };
        for i in 0..n {
            match kind {
                Other::Intel => {
                    let sys = h.sysfs.path();
                    let pci = sys.join(format!("devices/pci0000:00/{}", Self::pci(i)));
                    std::fs::create_dir_all(&pci).unwrap();
                    // Numbered against the tool's order: only sysfs tells them apart.
                    let (card, render) = ((n - 1 - i) as u64, (128 + n - 1 - i) as u64);
                    for (name, minor) in [
                        (format!("card{card}"), card),
                        (format!("renderD{render}"), render),
                    ] {
                        let entry = sys.join(format!("class/drm/{name}"));
                        std::fs::create_dir_all(&entry).unwrap();
                        std::fs::write(entry.join("dev"), format!("226:{minor}\n")).unwrap();
                        std::os::unix::fs::symlink(&pci, entry.join("device")).unwrap();
                        node(format!("dri/{name}"), 226, minor);
                    }
                }
                Other::MooreThreads => node(format!("mtgpu.{i}"), MTT_MAJOR, i as u64),
            }
        }
        h
    }

    fn pci(i: usize) -> String {
        format!("0000:{:02x}:00.0", 0x29 + i * 0x10)
    }

    /// Unit `i`'s identity.
    pub fn id(&self, i: usize) -> String {
        match self.kind {
            Other::Intel => format!("XPU-{}", Self::pci(i)),
            Other::MooreThreads => format!("MTT-2b1a0c3d-6f5e-4a7b-8c9d-{i:012x}"),
        }
    }

    /// Unit `i`'s device files as the container sees them (sorted).
    pub fn nodes(&self, i: usize) -> Vec<String> {
        match self.kind {
            Other::Intel => vec![
                format!("card{}", self.n - 1 - i),
                format!("renderD{}", 128 + self.n - 1 - i),
            ],
            Other::MooreThreads => vec![format!("mtgpu.{i}")],
        }
    }

    /// Every unit idle; `busy` ones with 4096 MiB in use.
    pub fn set_busy(&self, busy: &[usize]) {
        let mem = |i: usize| if busy.contains(&i) { 4096 } else { 0 };
        let lines: String = (0..self.n)
            .map(|i| match self.kind {
                Other::Intel => format!("{i}, {}, {}, 0\n", Self::pci(i), mem(i)),
                Other::MooreThreads => {
                    format!("{i}, GPU-{}, {}, 81920, 0\n", &self.id(i)[4..], mem(i))
                }
            })
            .collect();
        self.set("gpus.csv", &lines);
    }

    pub fn set_idle(&self) {
        self.set_busy(&[]);
        self.set("apps.csv", "");
    }

    pub fn set(&self, file: &str, contents: &str) {
        std::fs::write(self.state.path().join(file), contents).unwrap();
    }

    /// The variable that names the units to a command.
    pub fn visibility(&self) -> &'static str {
        match self.kind {
            Other::Intel => "ZE_AFFINITY_MASK",
            Other::MooreThreads => "MUSA_VISIBLE_DEVICES",
        }
    }

    pub fn apply(&self, cmd: &mut Command) {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let (knob, tool, state) = match self.kind {
            Other::Intel => ("CIBOX_XPU_SMI", "xpu-smi", "CIBOX_FAKE_XPU_STATE"),
            Other::MooreThreads => ("CIBOX_MTHREADS_GMI", "mthreads-gmi", "CIBOX_FAKE_MTT_STATE"),
        };
        cmd.env(knob, fixtures.join(tool))
            .env_remove("CIBOX_NVIDIA_SMI")
            .env_remove("CIBOX_ROCM_SMI")
            .env(state, self.state.path())
            .env("CIBOX_SYSFS_ROOT", self.sysfs.path())
            .env("CIBOX_DEV_ROOT", self.dev.path())
            .env("CIBOX_GPU_LOCK_DIR", self.locks.path())
            .env("CIBOX_PROBE_TIMEOUT", "5s");
    }

    pub fn run(&self, args: &[&str]) -> Run {
        let mut c = cibox(self.work.path());
        self.apply(&mut c);
        c.args(args);
        run(&mut c)
    }
}
