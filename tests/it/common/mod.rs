//! Shared test harness: run the cibox binary, make projects, build throwaway images on
//! the real engine. Engine-backed tests fail (never skip) when no engine answers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_cibox");

/// A finished cibox run.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn from(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Asserts the exit code and that stderr is exactly one `cibox: error:` line
    /// (plus indented detail lines) with no panic or backtrace.
    pub fn fails_with(&self, code: i32, needle: &str) -> &Run {
        assert_eq!(
            self.code, code,
            "exit code; stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        let errors: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| l.starts_with("cibox: error:"))
            .collect();
        assert_eq!(
            errors.len(),
            1,
            "exactly one error line expected:\n{}",
            self.stderr
        );
        assert!(
            errors[0].contains(needle),
            "error line lacks `{needle}`:\n{}",
            self.stderr
        );
        assert!(
            !self.stderr.contains("panicked") && !self.stderr.contains("RUST_BACKTRACE"),
            "{}",
            self.stderr
        );
        self
    }

    /// stdout's lines with runs of whitespace folded to one space (table rows).
    pub fn rows(&self) -> Vec<String> {
        self.stdout
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    }

    pub fn ok(&self) -> &Run {
        assert_eq!(
            self.code, 0,
            "stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }
}

/// A cibox invocation with a clean environment: no inherited CIBOX_* variables.
pub fn cibox(dir: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("CIBOX_") || k == "DOCKER_HOST" {
            c.env_remove(k);
        }
    }
    c.env("CIBOX_LOG", "info");
    c.stdin(Stdio::null());
    c
}

pub fn run(cmd: &mut Command) -> Run {
    Run::from(cmd.output().expect("run cibox"))
}

/// A scratch project folder (deleted on drop) with a `.git` marker so manifest search
/// stops inside it.
pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    pub fn new(manifest: &str) -> Project {
        let dir = tempfile::tempdir().expect("tempdir");
        // A source batches can read: as root, cibox runs them as nobody.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.path().join(".git")).unwrap();
        std::fs::write(dir.path().join("cibox.yaml"), manifest).unwrap();
        Project { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, rel: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let p = self.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, contents).unwrap();
        p
    }

    pub fn cibox(&self, args: &[&str]) -> Run {
        run(cibox(self.path()).args(args))
    }
}

/// A manifest with the given lock patterns and a Dockerfile recipe.
pub fn manifest_with_locks(locks: &[&str]) -> String {
    let list = locks
        .iter()
        .map(|l| format!("{l:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "version: 1\nproject: t\nimage:\n  locks: [{list}]\n  dockerfile: image/Dockerfile\nbatches:\n  unit:\n    gpus: 0\n    timeout: 1m\n    run: [\"true\"]\n"
    )
}

/// Panics with instructions when no Docker engine answers: engine tests never skip.
pub fn require_engine() {
    let ok = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "this test needs a running Docker engine and the docker CLI; run `bash .ci/run` (installs docker.io and starts dockerd) or start dockerd yourself"
    );
}

/// A unique string per call, so images built by parallel tests never share an ID.
pub fn nonce() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{}-{}-{t}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Image builds and image removals of all test processes exclude each other. The
/// classic builder's cache lookup reads other images, and Docker 20.10 fails a build
/// ("unable to find image", "failed to get digest") when one of them is removed by a
/// parallel test meanwhile. Builds share the lock; a removal takes it alone.
pub struct ImageStoreLock(#[allow(dead_code)] std::fs::File);

pub fn image_store_lock(exclusive: bool) -> ImageStoreLock {
    let path = std::env::temp_dir().join("cibox-tests-image-store.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if exclusive { f.lock() } else { f.lock_shared() }.expect("lock the image store");
    ImageStoreLock(f)
}

/// The local registry `.ci/run` starts (Debian's docker-registry on 127.0.0.1:5000).
pub const REGISTRY: &str = "127.0.0.1:5000";

pub fn require_registry() {
    require_engine();
    let ok = std::net::TcpStream::connect_timeout(
        &REGISTRY.parse().unwrap(),
        std::time::Duration::from_secs(2),
    )
    .is_ok();
    assert!(
        ok,
        "this test needs a registry on {REGISTRY}: run `bash .ci/run` (installs Debian's docker-registry and starts it) or `bash .ci/setup-host.sh`"
    );
}

/// Pushes a local image to the test registry under a fresh name and returns its
/// pinned reference (`REPO@sha256:…`).
pub fn push_to_registry(id: &str) -> String {
    require_registry();
    let repo = format!("{REGISTRY}/cibox-test/{}", nonce().to_lowercase());
    let tagged = format!("{repo}:push");
    let ok = |args: &[&str]| {
        let out = Command::new("docker").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    ok(&["tag", id, &tagged]);
    ok(&["push", &tagged]);
    let digests = ok(&[
        "inspect",
        "--format",
        "{{range .RepoDigests}}{{.}} {{end}}",
        id,
    ]);
    let pinned = digests
        .split_whitespace()
        .find(|d| d.starts_with(&repo))
        .unwrap_or_else(|| panic!("no digest of {repo} in {digests}"))
        .to_string();
    ok(&["rmi", &tagged]);
    pinned
}

/// `docker image rm -f ID`, not during any test's build; whether it succeeded.
pub fn remove_image(id: &str) -> bool {
    let _store = image_store_lock(true);
    Command::new("docker")
        .args(["image", "rm", "-f", id])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Removes the image when dropped.
pub struct ImageGuard(pub String);

impl Drop for ImageGuard {
    fn drop(&mut self) {
        remove_image(&self.0);
    }
}

/// Builds a one-file image FROM scratch with the engine's own CLI (not cibox), with the
/// given labels. Returns its full ID.
pub fn docker_build(labels: &[(&str, &str)]) -> ImageGuard {
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(ctx.path().join("nonce"), nonce()).unwrap();
    std::fs::write(
        ctx.path().join("Dockerfile"),
        "FROM scratch\nCOPY nonce /nonce\n",
    )
    .unwrap();
    docker_build_dir(ctx.path(), labels)
}

/// `docker build` (classic builder, no cache) of a folder with the engine's own CLI.
pub fn docker_build_dir(dir: &Path, labels: &[(&str, &str)]) -> ImageGuard {
    require_engine();
    let _store = image_store_lock(false);
    let mut c = Command::new("docker");
    c.env("DOCKER_BUILDKIT", "0")
        .args(["build", "-q", "--no-cache"]);
    for (k, v) in labels {
        c.arg("--label").arg(format!("{k}={v}"));
    }
    let out = c.arg(dir).output().expect("docker build");
    assert!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout)
        .trim()
        .lines()
        .last()
        .unwrap()
        .to_string();
    assert!(id.starts_with("sha256:"), "{id}");
    ImageGuard(id)
}

/// Whether the engine knows an image.
pub fn image_exists(id: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", id])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

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
}

/// The PIDs of processes whose command line holds all of `words`.
pub fn pids_with(words: &[&str]) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    let line = String::from_utf8_lossy(&c).replace('\0', " ");
                    words.iter().all(|w| line.contains(w))
                })
                .unwrap_or(false)
        })
        .collect()
}

/// The PIDs of live processes whose argument vector is exactly `argv` (a worker found by
/// its host PID, whatever PID namespace it runs in).
pub fn pids_running(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want)
                && pid_alive(*pid)
        })
        .collect()
}

/// Polls `cond` every 10 ms for up to `secs`.
pub fn wait_until(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    cond()
}

pub fn pid_alive(pid: i32) -> bool {
    // kill(pid, 0) through /proc: a zombie counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// A project whose image is busybox FROM scratch (Debian's busybox-static, as the demo),
/// built with `cibox image build`. `batches` is the YAML under `batches:`.
pub struct BusyboxProject {
    pub project: Project,
    pub image: ImageGuard,
}

pub fn busybox_project(batches: &str, extra: &str) -> BusyboxProject {
    require_engine();
    assert!(
        Path::new("/bin/busybox").exists(),
        "this test needs Debian's busybox-static at /bin/busybox: run `bash .ci/run` or apt-get install busybox-static"
    );
    let manifest = format!(
        "version: 1\nproject: bt\nimage:\n  locks: [\"image/Dockerfile\", \"image/nonce\"]\n  dockerfile: image/Dockerfile\ncontainer:\n  memory: 256m\n  pids: 128\n{extra}batches:\n{batches}"
    );
    let p = Project::new(&manifest);
    // The nonce comes first so no two tests share a build-cache step: the classic
    // builder reuses another build's intermediate image for an identical `COPY`, and
    // when that test removes its image the engine removes the shared parent too, in
    // the middle of this build ("failed to get digest …").
    let nonce = nonce();
    p.write(
        "image/Dockerfile",
        format!(
            "FROM scratch\nLABEL org.cibox.test.nonce={nonce}\nCOPY rootfs/ /\nENV PATH=/bin\n"
        ),
    );
    p.write("image/nonce", &nonce);
    let root = p.path().join("image/rootfs");
    for d in ["bin", "tmp", "work", "src", "reports"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    for d in ["tmp", "work"] {
        std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(0o1777)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    let applets = Command::new("/bin/busybox").arg("--list").output().unwrap();
    for a in String::from_utf8_lossy(&applets.stdout).lines() {
        if a != "busybox" {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(a)).unwrap();
        }
    }
    let r = {
        let _store = image_store_lock(false);
        p.cibox(&["image", "build"])
    };
    r.ok();
    let image = ImageGuard(r.stdout.trim().to_string());
    BusyboxProject { project: p, image }
}

impl BusyboxProject {
    /// `cibox batch run ARGS --image ID --source <project> --reports <project>/reports`.
    /// (Flags given in `args` replace the defaults.)
    pub fn batch_cmd(&self, args: &[&str]) -> Command {
        let mut c = cibox(self.project.path());
        c.args(args);
        let defaults = [
            ("--image", self.image.0.clone()),
            ("--source", self.project.path().display().to_string()),
            ("--reports", self.reports().display().to_string()),
            ("--scope", self.scope()),
        ];
        for (flag, value) in defaults {
            if !args.contains(&flag) {
                c.arg(flag).arg(value);
            }
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Run {
        run(&mut self.batch_cmd(args))
    }

    pub fn reports(&self) -> PathBuf {
        self.project.path().join("reports")
    }

    /// A scope of its own per project, so parallel tests never sweep each other.
    pub fn scope(&self) -> String {
        format!("test-{}", &self.image.0[7..19])
    }

    pub fn result(&self, batch: &str) -> serde_json::Value {
        let text = std::fs::read_to_string(self.reports().join(batch).join("result.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// Starts `cibox ARGS` (as [`BusyboxProject::batch_cmd`]) in the background, quiet.
    pub fn spawn(&self, args: &[&str]) -> std::process::Child {
        self.batch_cmd(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// `docker inspect --format FORMAT CONTAINER`, trimmed.
    pub fn inspect(container: &str, format: &str) -> String {
        let out = Command::new("docker")
            .args(["inspect", "--format", format, container])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Containers of this test's scope, running or not.
    pub fn containers(&self) -> Vec<String> {
        let out = Command::new("docker")
            .args(["ps", "-a", "--format", "{{.Names}}", "--filter"])
            .arg(format!("label=org.cibox.scope={}", self.scope()))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// A run step that writes one passing JUnit case.
pub const JUNIT_OK: &str = "echo '<testsuite><testcase classname=\"t\" name=\"ok\"/></testsuite>' > $CIBOX_REPORTS/junit.xml";

/// Runs git in `dir` with a fixed identity; panics with its stderr on failure.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
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

/// A folder for host data a batch mounts (models, datasets): under `/srv`, since cibox
/// refuses mounts from `/tmp` (everyone's temporary files and session sockets).
pub fn data_dir() -> tempfile::TempDir {
    let base = Path::new("/srv/cibox-tests");
    std::fs::create_dir_all(base).expect("/srv/cibox-tests (tests run as root in CI)");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("data-")
        .tempdir_in(base)
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A copy of `examples/<name>` in a fresh temporary folder (`cp -a`), with the rootfs
/// its image builds from made by `<rootfs_script>` (relative to the copy). Returns the
/// folder (kept alive by the caller) and the copy's path.
pub fn copy_example(name: &str, rootfs_script: &str) -> (tempfile::TempDir, PathBuf) {
    let example = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join(name);
    let status = Command::new("cp")
        .arg("-a")
        .arg(&example)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success(), "cp -a {}", example.display());
    let made = Command::new("sh")
        .arg(copy.join(rootfs_script))
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{rootfs_script}: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    (work, copy)
}
