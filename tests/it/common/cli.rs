//! Running the cibox binary: [`cibox`] builds a command with a clean environment (no
//! inherited `CIBOX_*` or `DOCKER_HOST`, `CIBOX_LOG=info`, stdin from /dev/null),
//! [`run`] runs it into a [`Run`] whose assertions ([`Run::ok`], [`Run::fails_with`])
//! print both streams on failure. Also [`nonce`], a string unique per call across test
//! processes, and [`git`], git with a fixed identity.

use std::path::Path;
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
    // What this test's builds normalised before (the index of `image::known`), this
    // test's own: nextest runs each test in a process of its own.
    c.env("XDG_CACHE_HOME", test_cache_home());
    for (k, _) in std::env::vars() {
        // Nor the workflow's own GitHub Actions (or Buildkite) context, when the tests run in one: a
        // test that wants it sets it.
        // Nor how the host builds images (its builder, its proxies): a test that
        // wants them sets them.
        let builds = k == "DOCKER_BUILDKIT" || k.to_ascii_uppercase().ends_with("_PROXY");
        // Nor whether this is a CI job (`CI`): a build there has a cache namespace of
        // its own.
        if k.starts_with("CIBOX_")
            || k == "CI"
            || k == "DOCKER_HOST"
            || k.starts_with("GITHUB_")
            || k.starts_with("BUILDKITE")
            || builds
        {
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

/// Runs git in `dir` with a fixed identity; panics with its stderr on failure.
/// Makes a project's folder (its stand-in `.git` removed) a git checkout of one commit,
/// its reports and replays ignored.
pub fn make_checkout(dir: &Path) {
    std::fs::remove_dir_all(dir.join(".git")).unwrap();
    std::fs::write(dir.join(".gitignore"), "reports/\ncibox-reproduce/\n").unwrap();
    git(dir, &["init", "-q"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "recorded"]);
}

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

/// A folder of this test process's for `XDG_CACHE_HOME` (mode 0700, as cibox wants
/// it), under the build's own temporary folder (`target/tmp`), not the host's.
pub fn test_cache_home() -> &'static Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        use std::os::unix::fs::DirBuilderExt;
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("xdg-cache")
            .join(std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .expect("a folder for the test's cache");
        dir
    })
}
