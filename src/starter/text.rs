//! The manifest and the image recipe `cibox init` writes for what it found.

use super::{Found, MARKER};

/// The image recipe, relative to the project.
pub const RECIPE: &str = ".cibox/images/default.Dockerfile";
use crate::image::recipe::PLACEHOLDER_BASE;
/// At most this many test files are listed by name in a batch's `tests`; more are one
/// glob.
const LISTED: usize = 100;
/// pytest as every batch runs it: its JUnit where cibox reads it.
const PYTEST: &str = "python3 -m pytest -q -p no:cacheprovider --junitxml=$CIBOX_REPORTS/junit.xml";

/// `s` for sh: as it is when plain, else in single quotes.
fn sh(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./-+=:,".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `s` as a YAML double-quoted scalar.
fn q(s: &str) -> String {
    serde_json::to_string(s).expect("a string")
}

fn list(items: &[String]) -> String {
    items.iter().map(|s| q(s)).collect::<Vec<_>>().join(", ")
}

/// The name of the batch of tests that declare `n` GPUs.
pub fn gpu_batch(n: u32) -> String {
    format!("gpu-{n}")
}

/// The CPU batch: the files without a GPU count (or `0`), every GPU file left out.
fn unit_batch(f: &Found) -> String {
    let Some(dir) = &f.tests_dir else {
        return "  unit:\n    description: the unit tests, CPU only (none found: say how they run)\n    gpus: 0\n    run: [\"echo 'say how the tests run: batches.unit.run in cibox.yaml' >&2; exit 1\"]\n".into();
    };
    let ignored: String = f
        .gpu_tests
        .values()
        .flatten()
        .map(|t| format!(" --ignore={}", sh(t)))
        .collect();
    let tests = if f.cpu_tests.len() <= LISTED && !f.gpu_tests.is_empty() {
        list(&f.cpu_tests)
    } else {
        q(&format!("{dir}/**/test_*.py"))
    };
    format!(
        "  unit:\n    description: the tests that declare no GPUs ({MARKER} = 0 or none), CPU only\n    gpus: 0\n    run: [{}]\n    tests: [{tests}]\n",
        q(&format!("{PYTEST} {}{ignored}", sh(dir)))
    )
}

/// A batch per GPU count the tests declare; a smoke check of a leased GPU when none do.
fn gpu_batches(f: &Found) -> String {
    if f.gpu_tests.is_empty() {
        return format!(
            "  gpu-smoke:\n    description: a leased GPU reaches the container (write your GPU tests' `{MARKER} = N` to get a batch per count)\n    gpus: 1\n    timeout: 10m\n    verdict: exit-code\n    run: [{}]\n",
            q("test -n \"$CUDA_VISIBLE_DEVICES\" && echo \"leased: $CUDA_VISIBLE_DEVICES\"")
        );
    }
    let mut out = String::new();
    for (n, files) in &f.gpu_tests {
        let args: Vec<String> = files.iter().map(|t| sh(t)).collect();
        out.push_str(&format!(
            "  {}:\n    description: the tests that declare {MARKER} = {n}\n    gpus: {n}\n    run: [{}]\n    tests: [{}]\n",
            gpu_batch(*n),
            q(&format!("{PYTEST} {}", args.join(" "))),
            list(files),
        ));
    }
    out
}

/// The commented manifest.
pub fn manifest(f: &Found) -> String {
    let mut locks = f.locks.clone();
    locks.push(RECIPE.to_string());
    let gpu_names: Vec<String> = if f.gpu_tests.is_empty() {
        vec!["gpu-smoke".into()]
    } else {
        f.gpu_tests.keys().map(|n| gpu_batch(*n)).collect()
    };
    let patterns = match &f.tests_dir {
        Some(dir) => format!("[{}]", q(&format!("{dir}/**/test_*.py"))),
        None => "[\"tests/**\"]".into(),
    };
    let marker = if f.gpu_tests.is_empty() {
        String::new()
    } else {
        format!("\n  gpus_marker: {MARKER}")
    };
    format!(
        r#"# cibox's manifest for {project}, written by `cibox init`: edit it freely. Every key is
# in docs/interface.md §4; `cibox batch list` shows what it makes of it.
version: 1
project: {project}

image:
  # The files that define the image (lock files, its recipe): the image carries their
  # lockset in its labels, and cibox refuses an image whose lockset differs.
  locks: [{locks}]
  dockerfile: {RECIPE}
  # The recipe copies the lock files from the project's root: the build's context.
  context: .
  # Pin the image the batches run in, once built and qualified (`cibox image build`,
  # `cibox image qualify ID --source .`): its full ID, and where other hosts fetch it by
  # digest (`cibox image push ID --to REPOSITORY` prints it). Until then, give --image.
  # id: "sha256:…"
  # ref: "registry.example.com/{project}@sha256:…"

container:
  # Limits of every batch's container; the host's policy may grant more (mounts,
  # network, devices), never the manifest alone.
  memory: 4g
  pids: 1024

defaults:
  timeout: 30m

batches:
{unit}{gpus}
layers:
  # The CPU layer runs on every pull request (.github/workflows/cibox-cpu.yml.j2).
  cpu: {{batches: [unit]}}
  # GPU layers run when a maintainer puts their label on a pull request (the
  # approved-commit pattern, cibox-gpu.yml.j2), and every night on the base branch
  # (cibox-warm-up.yml.j2), which is what fills the host's caches.
  gpu: {{batches: [{gpu_names}], meta: {{label: run-gpu-ci}}}}

changed:
  # What `cibox changed` maps a pull request's diff to.
  patterns: {patterns}{marker}

workflows:
  dir: .github/workflows
"#,
        project = f.project,
        locks = list(&locks),
        unit = unit_batch(f),
        gpus = gpu_batches(f),
        gpu_names = gpu_names.join(", "),
    )
}

/// The image recipe: the base is the project's to choose, pinned by digest; until it is,
/// `cibox image build` says to edit the `FROM` line.
pub fn recipe(f: &Found) -> String {
    let copies: String = f
        .locks
        .iter()
        .map(|l| format!("COPY {l} /deps/{l}\n"))
        .collect();
    format!(
        r#"# The image batches run in, built by `cibox image build` from the project's root. Its
# ID follows from the lock files cibox.yaml lists (this file is one): change one, and
# the image must be built again.
#
# EDIT THE FROM LINE: name your base, pinned by digest (cibox never pulls by tag), e.g.
#   docker pull python:3.12-slim && docker image inspect --format '{{{{index .RepoDigests 0}}}}' python:3.12-slim
# or an image already on this host (`docker images`). Without a registry: a base from a
# root file system, as docs/guide/images.md ("A base without a registry") shows. Until
# then `cibox image build` stops here and says so.
FROM {PLACEHOLDER_BASE}@sha256:0000000000000000000000000000000000000000000000000000000000000000
{copies}# Install what the lock files pin, e.g.:
# RUN pip install --no-cache-dir -r /deps/requirements.txt
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_are_split_into_a_batch_per_declared_gpu_count() {
        let mut f = Found {
            project: "p".into(),
            locks: vec!["uv.lock".into()],
            cpu_tests: vec!["tests/test_a.py".into()],
            tests_dir: Some("tests".into()),
            ..Found::default()
        };
        f.gpu_tests.insert(2, vec!["tests/test_two gpus.py".into()]);
        let m = manifest(&f);
        assert!(
            m.contains(
                "  gpu-2:\n    description: the tests that declare NUM_GPUS = 2\n    gpus: 2\n"
            ),
            "{m}"
        );
        assert!(m.contains("--ignore='tests/test_two gpus.py'"), "{m}");
        assert!(
            m.contains("gpu: {batches: [gpu-2], meta: {label: run-gpu-ci}}"),
            "{m}"
        );
        assert!(m.contains("gpus_marker: NUM_GPUS"), "{m}");
        assert!(
            m.contains("locks: [\"uv.lock\", \".cibox/images/default.Dockerfile\"]"),
            "{m}"
        );
    }
}
