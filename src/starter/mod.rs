//! What `cibox init` writes for a project, from what the project holds: its lock files
//! wherever they are ([`look`]), its test files split by the GPU count each declares
//! (`NUM_GPUS = N` at module level, slime's convention, read as `cibox changed` reads
//! it), and from those a commented manifest, an image recipe and workflow templates
//! ([`text`], [`templates`]), and writing them into the project ([`write`]).
//!
//! The rooms, from the bottom up; each imports only those below it:
//!
//! - [`templates`]: the workflow templates, actions pinned by commit;
//! - [`text`]: the manifest and the image recipe for what was found;
//! - [`write`]: writing them, never over a file, never through a link.

pub mod templates;
pub mod text;
pub mod write;

use std::collections::BTreeMap;
use std::path::Path;

/// The marker a test file declares its GPU count with.
pub const MARKER: &str = "NUM_GPUS";
/// How deep below the project's root files are looked for.
const DEPTH: usize = 6;
/// The most files read for a marker, and the most bytes read of each.
const MAX_TESTS: usize = 5000;
const MAX_TEST_BYTES: u64 = 1 << 20;
/// Folders never looked into: tools' own and anything hidden, wherever they are.
const SKIPPED: [&str; 6] = [
    "node_modules",
    "venv",
    "__pycache__",
    "site-packages",
    "cibox-reports",
    "cibox-reproduce",
];
/// Folders of build output, skipped at the project's root only: a `tests/dist/` is a
/// project's distributed tests (the README's own example), not a build's output.
const SKIPPED_AT_ROOT: [&str; 3] = ["target", "build", "dist"];

/// What the project holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// Its name, made a manifest's `project`.
    pub project: String,
    /// Its lock files, relative to the root, sorted.
    pub locks: Vec<String>,
    /// Its pytest files without a GPU count, or with `NUM_GPUS = 0`.
    pub cpu_tests: Vec<String>,
    /// Its pytest files by the GPU count they declare (one or more).
    pub gpu_tests: BTreeMap<u32, Vec<String>>,
    /// The folder the tests are in (`tests`), when one holds them.
    pub tests_dir: Option<String>,
}

impl Found {
    /// Whether any pytest file was found.
    pub fn has_tests(&self) -> bool {
        !self.cpu_tests.is_empty() || !self.gpu_tests.is_empty()
    }
}

/// Whether `name` is a lock file cibox knows: what pins a Python project's packages
/// (pip's requirements and constraints, uv, Poetry, Pipenv, PDM, pixi, conda's
/// environment files), and other ecosystems' lock files.
pub fn is_lock_file(name: &str, in_requirements_folder: bool) -> bool {
    let lower = name.to_ascii_lowercase();
    let yaml = lower.ends_with(".yml") || lower.ends_with(".yaml");
    let starts = |p: &str| lower.starts_with(p);
    matches!(
        lower.as_str(),
        "uv.lock"
            | "poetry.lock"
            | "pixi.lock"
            | "pipfile.lock"
            | "pdm.lock"
            | "pyproject.toml"
            | "setup.py"
            | "package-lock.json"
            | "cargo.lock"
            | "go.sum"
            | "flake.lock"
    ) || (starts("requirements") && (lower.ends_with(".txt") || lower.ends_with(".lock")))
        || (starts("constraints") && lower.ends_with(".txt"))
        || (in_requirements_folder && lower.ends_with(".txt"))
        || (yaml && (starts("environment") || starts("conda") || lower.contains(".conda.")))
        || lower == "conda-lock.yml"
}

/// What `root` holds.
pub fn look(root: &Path) -> Found {
    let mut found = Found {
        project: project_name(root),
        ..Found::default()
    };
    let mut tests = Vec::new();
    walk(root, Path::new(""), DEPTH, &mut found.locks, &mut tests);
    found.locks.sort();
    tests.sort();
    for rel in tests.into_iter().take(MAX_TESTS) {
        match declared_gpus(&root.join(&rel)) {
            Some(n) if n > 0 => found.gpu_tests.entry(n).or_default().push(rel),
            _ => found.cpu_tests.push(rel),
        }
    }
    let all = found
        .cpu_tests
        .iter()
        .chain(found.gpu_tests.values().flatten());
    found.tests_dir = ["tests", "test"]
        .into_iter()
        .find(|d| all.clone().any(|t| t.starts_with(&format!("{d}/"))))
        .map(str::to_string);
    found
}

/// The GPU count `path` declares, if it does (an expression: its largest number).
fn declared_gpus(path: &Path) -> Option<u32> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_TEST_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    crate::changed::gpus_marker(&text, MARKER).map(|m| m.gpus)
}

/// Lock files and pytest files below `dir` (`rel` from the root), `depth` folders deep
/// at most; links are not followed.
fn walk(dir: &Path, rel: &Path, depth: usize, locks: &mut Vec<String>, tests: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let in_requirements = rel
        .file_name()
        .is_some_and(|n| n.to_string_lossy().eq_ignore_ascii_case("requirements"));
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue; // not UTF-8: no manifest can name it
        };
        let path = rel.join(&name);
        let shown = path.to_string_lossy().into_owned();
        match e.file_type() {
            Ok(t) if t.is_dir() => {
                let skipped = name.starts_with('.')
                    || SKIPPED.contains(&name.as_str())
                    || (rel.as_os_str().is_empty() && SKIPPED_AT_ROOT.contains(&name.as_str()));
                if depth > 0 && !skipped {
                    walk(&e.path(), &path, depth - 1, locks, tests);
                }
            }
            Ok(t) if t.is_file() => {
                if is_lock_file(&name, in_requirements) {
                    locks.push(shown);
                } else if name.ends_with(".py")
                    && (name.starts_with("test_") || name.ends_with("_test.py"))
                {
                    tests.push(shown);
                }
            }
            _ => {}
        }
    }
}

/// The folder's name as a manifest's `project`: lower case, letters, digits, `-`, `_`.
fn project_name(root: &Path) -> String {
    let name = root
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let project: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    match project.trim_matches('-') {
        "" => "my-project".to_string(),
        p => p.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_files_are_known_by_their_ecosystems_names() {
        for name in [
            "requirements.txt",
            "requirements-dev.txt",
            "requirements.lock",
            "requirements_cuda.lock",
            "uv.lock",
            "poetry.lock",
            "pixi.lock",
            "environment.yml",
            "environment-gpu.yaml",
            "conda-env.yml",
            "constraints.txt",
        ] {
            assert!(is_lock_file(name, false), "{name}");
        }
        assert!(is_lock_file("cuda.txt", true));
        for name in ["notes.txt", "cuda.txt", "config.yaml", "uv.toml"] {
            assert!(!is_lock_file(name, false), "{name}");
        }
    }

    #[test]
    fn a_project_is_read_locks_in_subfolders_and_tests_by_gpu_count() {
        let d = tempfile::tempdir().unwrap();
        let w = |rel: &str, text: &str| {
            let p = d.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        w("requirements.lock", "torch==2.9\n");
        w("envs/environment.yml", "name: x\n");
        w("requirements/cuda.txt", "x\n");
        w("node_modules/uv.lock", "");
        w(".venv/poetry.lock", "");
        w("tests/test_cpu.py", "NUM_GPUS = 0\ndef test(): pass\n");
        w("tests/test_plain.py", "def test(): pass\n");
        w("tests/e2e/test_two.py", "NUM_GPUS = 2\n");
        w("tests/e2e/test_other_two.py", "NUM_GPUS: int = 2\n");
        w("tests/test_eight.py", "NUM_GPUS = 4 if SMALL else 8\n");
        w("tests/test_nested.py", "def f():\n    NUM_GPUS = 4\n");
        // Build output at the root is skipped; a `dist` or `build` folder of tests is not.
        w("dist/tests/test_copied.py", "NUM_GPUS = 2\n");
        w("build/lib/test_built.py", "def test(): pass\n");
        w("tests/dist/test_two_gpus.py", "NUM_GPUS = 2\n");
        let f = look(d.path());
        assert_eq!(
            f.locks,
            [
                "envs/environment.yml",
                "requirements.lock",
                "requirements/cuda.txt"
            ]
        );
        assert_eq!(
            f.cpu_tests,
            [
                "tests/test_cpu.py",
                "tests/test_nested.py",
                "tests/test_plain.py"
            ]
        );
        assert_eq!(
            f.gpu_tests[&2],
            [
                "tests/dist/test_two_gpus.py",
                "tests/e2e/test_other_two.py",
                "tests/e2e/test_two.py"
            ]
        );
        assert_eq!(f.gpu_tests[&8], ["tests/test_eight.py"]);
        assert_eq!(f.tests_dir.as_deref(), Some("tests"));
    }
}
