//! GPUs without hardware: [`FakeSmi`], the state folder of the fake nvidia-smi
//! (`tests/fixtures/nvidia-smi`) with GPUs whose UUIDs are [`UUIDS`] / [`uuid`];
//! [`GpuHost`], a cibox command wired to a fake nvidia-smi and a private lock dir;
//! [`nvml_double`], the NVML test double built on demand; and [`Backend`], which of
//! the two probe backends a command uses.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::cli::{Run, cibox, run};

/// The fake nvidia-smi and a state folder for it.
pub struct FakeSmi {
    pub state: tempfile::TempDir,
}

pub const UUIDS: [&str; 2] = [
    "GPU-11111111-2222-3333-4444-000000000000",
    "GPU-11111111-2222-3333-4444-000000000001",
];

impl FakeSmi {
    pub fn idle() -> FakeSmi {
        let state = tempfile::tempdir().unwrap();
        let gpus = format!(
            "0, {}, 0, 81559, 0\n1, {}, 3, 81559, 0\n",
            UUIDS[0], UUIDS[1]
        );
        std::fs::write(state.path().join("gpus.csv"), gpus).unwrap();
        std::fs::write(state.path().join("apps.csv"), "").unwrap();
        FakeSmi { state }
    }

    /// `n` idle GPUs with UUIDs `GPU-11111111-2222-3333-4444-0000000000NN`.
    pub fn with_gpus(n: usize) -> FakeSmi {
        let state = tempfile::tempdir().unwrap();
        let gpus: String = (0..n)
            .map(|i| format!("{i}, {}, 0, 81559, 0\n", uuid(i)))
            .collect();
        std::fs::write(state.path().join("gpus.csv"), gpus).unwrap();
        std::fs::write(state.path().join("apps.csv"), "").unwrap();
        FakeSmi { state }
    }

    pub fn set(&self, file: &str, contents: &str) {
        std::fs::write(self.state.path().join(file), contents).unwrap();
    }

    pub fn program() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvidia-smi")
    }

    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("CIBOX_NVIDIA_SMI", Self::program())
            .env("CIBOX_FAKE_SMI_STATE", self.state.path());
    }
}

/// The fake UUID of GPU `i`.
pub fn uuid(i: usize) -> String {
    format!("GPU-11111111-2222-3333-4444-{i:012}")
}

/// A cibox command wired to a fake nvidia-smi and a private lock dir, outside any
/// project (gpu commands work without a manifest).
pub struct GpuHost {
    pub smi: FakeSmi,
    pub locks: tempfile::TempDir,
    pub work: tempfile::TempDir,
}

impl GpuHost {
    pub fn new(n: usize) -> GpuHost {
        let work = tempfile::tempdir().unwrap();
        std::fs::create_dir(work.path().join(".git")).unwrap();
        GpuHost {
            smi: FakeSmi::with_gpus(n),
            locks: tempfile::tempdir().unwrap(),
            work,
        }
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = cibox(self.work.path());
        self.smi.apply(&mut c);
        c.env("CIBOX_GPU_LOCK_DIR", self.locks.path())
            .env("CIBOX_PROBE_TIMEOUT", "2s")
            .args(args);
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

    /// Indices of GPUs currently leased.
    pub fn leased(&self) -> Vec<u64> {
        self.status()["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| !g["lease_holder"].is_null())
            .map(|g| g["index"].as_u64().unwrap())
            .collect()
    }

    /// How many tickets wait in the lease queue.
    pub fn queued(&self) -> usize {
        std::fs::read_dir(self.locks.path().join("queue"))
            .map(|d| {
                d.flatten()
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Waiters in the queue whose ticket names its pool: until then (`gpu exec` probes
    /// after it arrives) the waiters behind read it as the strictest case and wait.
    pub fn queued_with_pool(&self) -> usize {
        let Ok(dir) = std::fs::read_dir(self.locks.path().join("queue")) else {
            return 0;
        };
        dir.flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter(|e| {
                std::fs::read(e.path())
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|v| v["pool"].as_array().map(|p| !p.is_empty()))
                    .unwrap_or(false)
            })
            .count()
    }
}

/// The NVML test double (`tests/nvml-double`), built once for all test processes with
/// plain `rustc` (it has no dependencies), so `cargo nextest run` needs no extra step.
pub fn nvml_double() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nvml-double/src/lib.rs");
    // target/<profile>/deps/it-… → target/nvml-double/
    let exe = std::env::current_exe().expect("test binary path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary lives in target/<profile>/deps");
    let dir = target.join("nvml-double");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libnvml_double.so");
    // Test processes run at once: one builds, the others wait for it.
    let lock = std::fs::File::create(dir.join(".lock")).unwrap();
    lock.lock().unwrap();
    let fresh = |lib: &Path| {
        let built = std::fs::metadata(lib).and_then(|m| m.modified());
        let source = std::fs::metadata(&src).and_then(|m| m.modified());
        matches!((built, source), (Ok(b), Ok(s)) if b >= s)
    };
    if !fresh(&lib) {
        let tmp = dir.join("libnvml_double.so.tmp");
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        let out = Command::new(&rustc)
            .args(["--edition", "2024", "--crate-type", "cdylib", "-O"])
            .args(["--crate-name", "nvml_double"])
            .arg(&src)
            .arg("-o")
            .arg(&tmp)
            .output()
            .unwrap_or_else(|e| panic!("cannot run `{rustc}` to build the NVML double: {e}"));
        assert!(
            out.status.success(),
            "building the NVML double failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &lib).unwrap();
    }
    lib
}

/// Which GPU probe backend a test command uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    NvidiaSmi,
    Nvml,
}

impl Backend {
    pub const BOTH: [Backend; 2] = [Backend::NvidiaSmi, Backend::Nvml];

    /// Points `cmd` (set up by [`FakeSmi::apply`]) at this backend.
    pub fn apply(self, cmd: &mut Command) {
        match self {
            Backend::NvidiaSmi => {
                cmd.env("CIBOX_GPU_PROBE", "nvidia-smi");
            }
            Backend::Nvml => {
                cmd.env_remove("CIBOX_NVIDIA_SMI")
                    .env("CIBOX_GPU_PROBE", "nvml")
                    .env("CIBOX_NVML_LIB", nvml_double());
            }
        }
    }
}

/// The group that owns the fake AMD device files, as `render` owns the real ones.
pub const AMD_RENDER_GID: u32 = 4242;
/// The character major of the fake `/dev/kfd` (a real one's is given at load time).
pub const AMD_KFD_MAJOR: u64 = 4000;

/// An AMD host without hardware: the rocm-smi double's state folder
/// (`tests/fixtures/rocm-smi`), a sysfs of its own (KFD topology, the DRM class, PCI
/// devices) and device files of its own, made with mknod (these tests run as root), and
/// a private lock dir. GPU `i`'s render and card nodes are numbered against the tool's
/// order (renderD(128 + n-1-i), card(n-1-i)) and its KFD node too, so only a hand-over
/// that follows the unique ID through sysfs finds them.
pub struct AmdHost {
    pub n: usize,
    pub state: tempfile::TempDir,
    pub sysfs: tempfile::TempDir,
    pub dev: tempfile::TempDir,
    pub locks: tempfile::TempDir,
    pub work: tempfile::TempDir,
}

impl AmdHost {
    pub fn new(n: usize) -> AmdHost {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let h = AmdHost {
            n,
            state: tempfile::tempdir().unwrap(),
            sysfs: tempfile::tempdir().unwrap(),
            dev: tempfile::tempdir().unwrap(),
            locks: tempfile::tempdir().unwrap(),
            work: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir(h.work.path().join(".git")).unwrap();
        let gpus: String = (0..n)
            .map(|i| format!("{i}, {}, 0, 196592, 0\n", &Self::id(i)[4..]))
            .collect();
        h.set("gpus.csv", &gpus);
        h.set("apps.csv", "");
        let sys = h.sysfs.path();
        let write = |rel: &str, text: &str| {
            let p = sys.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("class/kfd/kfd/dev", &format!("{AMD_KFD_MAJOR}:0\n"));
        write(
            "class/kfd/kfd/topology/nodes/0/properties",
            "cpu_cores_count 64\nsimd_count 0\ndrm_render_minor 0\nunique_id 0\n",
        );
        std::fs::create_dir_all(h.dev.path().join("dri")).unwrap();
        let node = |rel: String, major: u64, minor: u64| {
            let p = h.dev.path().join(rel);
            nix::sys::stat::mknod(
                &p,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o660),
                nix::sys::stat::makedev(major, minor),
            )
            .unwrap_or_else(|e| panic!("mknod {} (these tests run as root): {e}", p.display()));
            std::os::unix::fs::chown(&p, Some(0), Some(AMD_RENDER_GID)).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o660)).unwrap();
        };
        node("kfd".into(), AMD_KFD_MAJOR, 0);
        for i in 0..n {
            let (render, card) = (Self::render_minor_of(n, i), Self::card_of(n, i));
            let pci = sys.join(format!("devices/pci0000:00/{}", Self::pci(i)));
            std::fs::create_dir_all(&pci).unwrap();
            write(
                &format!("class/kfd/kfd/topology/nodes/{}/properties", n - i),
                &format!(
                    "cpu_cores_count 0\nsimd_count 304\ndrm_render_minor {render}\nlocation_id {}\nunique_id {}\n",
                    0x1100 + i * 0x100,
                    u64::from_str_radix(&Self::id(i)[4..], 16).unwrap()
                ),
            );
            for (name, minor) in [
                (format!("renderD{render}"), render),
                (format!("card{card}"), card),
            ] {
                write(&format!("class/drm/{name}/dev"), &format!("226:{minor}\n"));
                symlink(&pci, sys.join(format!("class/drm/{name}/device"))).unwrap();
                node(format!("dri/{name}"), 226, minor);
            }
            // A connector of the card: not a card node.
            let connector = sys.join(format!("class/drm/card{card}-DP-1"));
            std::fs::create_dir_all(&connector).unwrap();
            symlink(
                sys.join(format!("class/drm/card{card}")),
                connector.join("device"),
            )
            .unwrap();
        }
        h
    }

    /// GPU `i`'s identity: `GPU-` and its unique ID.
    pub fn id(i: usize) -> String {
        format!("GPU-{:016x}", 0xa5a5_0000_0000_0000u64 + i as u64 * 0x1111)
    }

    fn pci(i: usize) -> String {
        format!("0000:{:02x}:00.0", 0x11 + i * 0x10)
    }

    fn render_minor_of(n: usize, i: usize) -> u64 {
        (128 + n - 1 - i) as u64
    }

    fn card_of(n: usize, i: usize) -> u64 {
        (n - 1 - i) as u64
    }

    /// GPU `i`'s device files as the container sees them.
    pub fn nodes(&self, i: usize) -> [String; 2] {
        [
            format!("card{}", Self::card_of(self.n, i)),
            format!("renderD{}", Self::render_minor_of(self.n, i)),
        ]
    }

    pub fn set(&self, file: &str, contents: &str) {
        std::fs::write(self.state.path().join(file), contents).unwrap();
    }

    pub fn program() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rocm-smi")
    }

    /// Points `cmd` at this host: the rocm-smi double, its sysfs and device files, and
    /// its lock dir.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("CIBOX_ROCM_SMI", Self::program())
            .env_remove("CIBOX_NVIDIA_SMI")
            .env("CIBOX_FAKE_ROCM_STATE", self.state.path())
            .env("CIBOX_SYSFS_ROOT", self.sysfs.path())
            .env("CIBOX_DEV_ROOT", self.dev.path())
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

/// A MIG host: `whole` GPUs of the fixture's model (`NVIDIA H200`), the first of them in
/// MIG mode with the slices `profiles` names, for both probe backends.
pub struct MigHost {
    pub host: GpuHost,
}

impl MigHost {
    pub fn new(gpus: usize, profiles: &[&str]) -> MigHost {
        let host = GpuHost::new(gpus);
        host.smi.set("gpu_name", "NVIDIA H200");
        let mig = MigHost { host };
        mig.set_slices(0, profiles);
        mig
    }

    /// The UUID of slice `j` of GPU `i`.
    pub fn slice(i: usize, j: usize) -> String {
        format!("MIG-5a5a5a5a-{i:04}-4444-8888-{j:012}")
    }

    /// Puts GPU `i` in MIG mode with slices of `profiles` (none: MIG mode off).
    pub fn set_slices(&self, i: usize, profiles: &[&str]) {
        let path = self.host.smi.state.path().join("mig.csv");
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        let mut lines: Vec<String> = old
            .lines()
            .filter(|l| !l.starts_with(&format!("{i},")))
            .map(str::to_string)
            .collect();
        for (j, p) in profiles.iter().enumerate() {
            let total = p
                .split_once('.')
                .and_then(|(_, m)| m.trim_end_matches("gb").parse::<u64>().ok())
                .unwrap_or(1)
                * 1024;
            lines.push(format!("{i}, {}, {p}, 0, {total}", Self::slice(i, j)));
        }
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        // Replaced whole, so a probe reads the old slices or the new ones.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, path).unwrap();
    }
}
