//! Scratch projects: [`Project`] (a temporary folder with a `.git` marker and a
//! `cibox.yaml`), [`manifest_with_locks`], [`BusyboxProject`] (a project whose image,
//! busybox FROM scratch, is built with `cibox image build`, with helpers to run and
//! inspect its batches in a scope of its own), [`JUNIT_OK`], [`data_dir`] (host data
//! under `/srv`, not `/tmp`) and [`copy_example`].
//!
//! A [`BusyboxProject`] builds under the shared image-store lock and removes its image
//! when dropped (see [`super::engine`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::cli::{Run, cibox, nonce, run};
use super::engine::{ImageGuard, image_store_lock, require_engine};
use super::policy::HostPolicyFile;

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

/// A project whose image is busybox FROM scratch (Debian's busybox-static, as the demo),
/// built with `cibox image build`. `batches` is the YAML under `batches:`.
pub struct BusyboxProject {
    pub project: Project,
    pub image: ImageGuard,
    /// The host policy its runs are under (`CIBOX_HOST_POLICY`); none by default.
    pub policy: Option<HostPolicyFile>,
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
    busybox_rootfs(&p.path().join("image/rootfs"));
    let r = {
        let _store = image_store_lock(false);
        p.cibox(&["image", "build"])
    };
    r.ok();
    let image = ImageGuard(r.stdout.trim().to_string());
    BusyboxProject {
        project: p,
        image,
        policy: None,
    }
}

/// A root file system at `root` with Debian's busybox-static and its applets in `/bin`,
/// and the folders a batch needs (`/tmp` and `/work` sticky, as in a rootfs).
pub fn busybox_rootfs(root: &Path) {
    assert!(
        Path::new("/bin/busybox").exists(),
        "this test needs Debian's busybox-static at /bin/busybox: run `bash .ci/run` or apt-get install busybox-static"
    );
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
}

impl BusyboxProject {
    /// Its runs are under a host policy that says `text`.
    pub fn with_policy(mut self, text: &str) -> BusyboxProject {
        self.policy = Some(HostPolicyFile::new(text));
        self
    }

    /// `cibox batch run ARGS --image ID --source <project> --reports <project>/reports`.
    /// (Flags given in `args` replace the defaults.)
    pub fn batch_cmd(&self, args: &[&str]) -> Command {
        let mut c = cibox(self.project.path());
        if let Some(policy) = &self.policy {
            c.env("CIBOX_HOST_POLICY", policy.path());
        }
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

    /// `cibox ARGS` in the project, under its policy, without the run flags.
    pub fn batch_cmd_bare(&self, args: &[&str]) -> Command {
        let mut c = cibox(self.project.path());
        if let Some(policy) = &self.policy {
            c.env("CIBOX_HOST_POLICY", policy.path());
        }
        c.args(args);
        c
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
    // The examples' busybox images are byte for byte the same (a reproducible build
    // gives them one ID): a nonce makes this copy's image its own, so no other test's
    // cleanup removes it while this one runs.
    let rootfs = copy.join(rootfs_script).with_file_name("rootfs");
    std::fs::write(rootfs.join(".test-nonce"), nonce()).unwrap();
    (work, copy)
}
