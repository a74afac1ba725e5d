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
