//! `cibox init`: a start for a project: a commented `cibox.yaml` from what is found in
//! it (test files, lock files), an image recipe stub, and workflow templates for the
//! patterns the README recommends (CPU on every pull request, GPU on the
//! approved-commit pattern, a scheduled cache warm-up), which render and lint clean.
//! It never overwrites a file: what exists is left as it is, and said. It writes nothing
//! through a link: a folder it writes into that is one (a checkout's committed `.github`
//! leading outside it) is refused before anything is written, and what it writes is made
//! name by name in folders held open, never following one ([`crate::nofollow`]).

use std::path::{Path, PathBuf};

use super::context::Context;
use crate::console;
use crate::error::{ErrorKind, Result};
use crate::exit::{self, Failure};
use crate::nofollow::Folder;

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("cannot read the current folder: {0}")]
    CurrentFolder(#[source] std::io::Error),
    #[error(
        "{}: {what}; cibox init writes nothing through a link or in place of a folder, and wrote nothing",
        .path.display()
    )]
    Link { path: PathBuf, what: String },
    #[error("writing {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ErrorKind for InitError {
    fn failure(&self) -> Failure {
        match self {
            InitError::CurrentFolder(_) | InitError::Link { .. } => Failure::Usage,
            InitError::Write { .. } => Failure::Infra,
        }
    }
}

/// Lock files cibox recognises, as the ecosystems name them.
const LOCK_FILES: [&str; 14] = [
    "requirements.txt",
    "requirements-dev.txt",
    "requirements-test.txt",
    "constraints.txt",
    "poetry.lock",
    "uv.lock",
    "Pipfile.lock",
    "pyproject.toml",
    "setup.py",
    "environment.yml",
    "package-lock.json",
    "Cargo.lock",
    "go.sum",
    "flake.lock",
];

/// The image recipe stub, relative to the project.
const RECIPE: &str = ".cibox/images/default.Dockerfile";

/// What was found in the project.
struct Found {
    project: String,
    locks: Vec<String>,
    /// How the unit tests run, and the glob of their files, when pytest files exist.
    pytest: Option<String>,
}

pub fn init(_ctx: &Context) -> Result<u8> {
    let cwd = std::env::current_dir().map_err(InitError::CurrentFolder)?;
    let root = crate::git::text(&cwd, &["rev-parse", "--show-toplevel"])
        .ok()
        .map(PathBuf::from)
        .unwrap_or(cwd);
    let found = look(&root);
    let files: [(&str, String); 5] = [
        ("cibox.yaml", manifest(&found)),
        (RECIPE, recipe(&found)),
        (
            ".github/workflows/cibox-cpu.yml.j2",
            CPU_TEMPLATE.to_string(),
        ),
        (
            ".github/workflows/cibox-gpu.yml.j2",
            GPU_TEMPLATE.to_string(),
        ),
        (
            ".github/workflows/cibox-warm-up.yml.j2",
            WARM_UP_TEMPLATE.to_string(),
        ),
    ];
    // Every folder on the way first: a link among them writes nothing at all.
    for (rel, _) in &files {
        no_link_on_the_way(&root, Path::new(rel))?;
    }
    let folder = Folder::open(&root).map_err(|source| InitError::Write {
        path: root.clone(),
        source: crate::nofollow::said_of_links(source),
    })?;
    let mut wrote = 0;
    for (rel, text) in &files {
        let path = root.join(rel);
        if std::fs::symlink_metadata(&path).is_ok() {
            console::info(format!("{rel} exists: left as it is"));
            continue;
        }
        write_new(&folder, Path::new(rel), &path, text)?;
        console::info(format!("wrote {rel}"));
        wrote += 1;
    }
    if wrote > 0 {
        console::info(
            "next: read cibox.yaml's comments, then `cibox batch list`, `cibox image build`, `cibox workflow render` and `cibox workflow lint`",
        );
    }
    Ok(exit::SUCCESS)
}

/// Refuses a folder on the way to `rel` (below `root`) that is a link, or not a folder.
fn no_link_on_the_way(root: &Path, rel: &Path) -> Result<()> {
    let mut at = PathBuf::new();
    for part in rel.parent().into_iter().flat_map(Path::components) {
        at.push(part);
        let what = match std::fs::symlink_metadata(root.join(&at)) {
            Err(_) => return Ok(()), // not there: made by init, below nothing else
            Ok(md) if md.is_dir() => continue,
            Ok(md) if md.file_type().is_symlink() => {
                let target = std::fs::read_link(root.join(&at)).unwrap_or_default();
                format!(
                    "a symbolic link (to {}) where init writes in a folder",
                    crate::util::escape(&target.to_string_lossy())
                )
            }
            Ok(_) => "not a folder, where init writes in one".to_string(),
        };
        return Err(InitError::Link { path: at, what }.into());
    }
    Ok(())
}

/// Writes `text` as the new file `rel` of `root` (never over one, `shown` in errors),
/// making its folders, each name made or opened in the folder before it, no link
/// followed.
fn write_new(root: &Folder, rel: &Path, shown: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let io = |source| InitError::Write {
        path: shown.to_path_buf(),
        source: crate::nofollow::said_of_links(source),
    };
    // (Init's own names: plain, UTF-8.)
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let folder = match rel.parent() {
        Some(parent) => root.make_path(parent, 0o777).map_err(io)?,
        None => root.try_clone().map_err(io)?,
    };
    folder
        .create_new(name, 0o666)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io)?;
    Ok(())
}

/// What the project holds: its name, lock files, pytest files.
fn look(root: &Path) -> Found {
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
    let project = if project.trim_matches('-').is_empty() {
        "my-project".to_string()
    } else {
        project.trim_matches('-').to_string()
    };
    let locks = LOCK_FILES
        .iter()
        .filter(|f| root.join(f).is_file())
        .map(|f| f.to_string())
        .collect();
    let pytest = ["tests", "test"].iter().find_map(|dir| {
        let has = walk_finds(&root.join(dir), 4, &|n| {
            (n.starts_with("test_") && n.ends_with(".py")) || n.ends_with("_test.py")
        });
        has.then(|| format!("{dir}/**/test_*.py"))
    });
    Found {
        project,
        locks,
        pytest,
    }
}

/// Whether a file whose name `wanted` accepts is in `dir`, at most `depth` deep.
fn walk_finds(dir: &Path, depth: usize, wanted: &dyn Fn(&str) -> bool) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        match e.file_type() {
            Ok(t) if t.is_dir() => depth > 0 && walk_finds(&e.path(), depth - 1, wanted),
            Ok(t) if t.is_file() => wanted(&name),
            _ => false,
        }
    })
}

/// The commented manifest.
fn manifest(f: &Found) -> String {
    let mut locks: Vec<String> = f.locks.iter().map(|l| format!("{l:?}")).collect();
    locks.push(format!("{RECIPE:?}"));
    let (unit_run, tests, patterns) = match &f.pytest {
        Some(glob) => (
            "[\"python3 -m pytest -q -p no:cacheprovider --junitxml=$CIBOX_REPORTS/junit.xml\"]"
                .to_string(),
            format!("\n    tests: [{glob:?}]"),
            format!("\n  patterns: [{glob:?}]"),
        ),
        None => (
            "[\"echo 'say how the tests run: batches.unit.run in cibox.yaml' >&2; exit 1\"]"
                .to_string(),
            String::new(),
            "\n  patterns: [\"tests/**\"]".to_string(),
        ),
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
  unit:
    description: the unit tests, CPU only
    gpus: 0
    run: {unit_run}{tests}
  gpu-smoke:
    description: one leased GPU is there and works
    gpus: 1
    timeout: 10m
    verdict: exit-code
    run: ["nvidia-smi -L"]

layers:
  # The CPU layer runs on every pull request (.github/workflows/cibox-cpu.yml.j2).
  cpu: {{batches: [unit]}}
  # GPU layers run when a maintainer puts their label on a pull request (the
  # approved-commit pattern, cibox-gpu.yml.j2), and every night on the base branch
  # (cibox-warm-up.yml.j2), which is what fills the host's caches.
  gpu: {{batches: [gpu-smoke], meta: {{label: run-gpu-ci}}}}

changed:
  # What `cibox changed` maps a pull request's diff to.{patterns}

workflows:
  dir: .github/workflows
"#,
        project = f.project,
        locks = locks.join(", "),
    )
}

/// The image recipe stub: the base is the project's to choose, pinned by digest.
fn recipe(f: &Found) -> String {
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
# Choose a base and pin it by digest (cibox never pulls by tag), e.g.:
#   docker pull python:3.12-slim && docker image inspect --format '{{{{index .RepoDigests 0}}}}' python:3.12-slim
FROM replace-me-with-a-base@sha256:0000000000000000000000000000000000000000000000000000000000000000
{copies}# Install what the lock files pin, e.g.:
# RUN pip install --no-cache-dir -r /deps/requirements.txt
"#
    )
}

/// CPU layer on every pull request, on a hosted runner.
const CPU_TEMPLATE: &str = r#"<# Written by `cibox init`. The CPU layer on every pull request, on a hosted runner:
   cibox built at a pinned commit, the image fetched by digest and verified against this
   checkout's lock files. Repository variables: CIBOX_REPO (cibox's git URL), CIBOX_REV
   (a commit), CIBOX_IMAGE_REF (REPOSITORY@sha256:…, from `cibox image push`). #>
name: << project >> CPU
on:
  pull_request:
  push:
    branches: [main]
permissions:
  contents: read
jobs:
  cpu:
    runs-on: ubuntu-latest
    timeout-minutes: << layers.cpu.max_timeout_minutes + 20 >>
    steps:
      - uses: actions/checkout@v4
        with:
          persist-credentials: false
      - name: Install cibox at a pinned commit
        env:
          CIBOX_REPO: ${{ vars.CIBOX_REPO }}
          CIBOX_REV: ${{ vars.CIBOX_REV }}
        run: cargo install --locked --git "$CIBOX_REPO" --rev "$CIBOX_REV" cibox
      - name: Fetch the image by digest and verify it against the lock files
        env:
          CIBOX_IMAGE_REF: ${{ vars.CIBOX_IMAGE_REF }}
        run: |
          id=$(cibox image fetch "$CIBOX_IMAGE_REF")
          echo "CIBOX_IMAGE=$id" >> "$GITHUB_ENV"
      - name: Run the CPU layer (<< layers.cpu.batches | join(", ") >>)
        run: cibox layer run cpu
      - name: Keep the reports (result.json is what cibox reproduce replays)
        if: always()
        uses: actions/upload-artifact@v4
        with:
          name: cibox-reports-${{ github.job }}
          path: cibox-reports/
          if-no-files-found: ignore
"#;

/// GPU layers on the approved-commit pattern, on self-hosted GPU runners.
const GPU_TEMPLATE: &str = r#"<# Written by `cibox init`. GPU layers, the approved-commit pattern: a maintainer reads
   the pull request and puts the layer's label on it; the job runs the commit the label
   was put on, never a later push. The workflow is the base branch's, the code the pull
   request's, held in by the host policy and the locked-down container. The image is
   the one the repository variable CIBOX_IMAGE_ID names (a qualified `sha256:` ID). #>
name: << project >> GPU
on:
  pull_request_target:
    types: [labeled]
permissions:
  contents: read
jobs:
<% for name, layer in layers | items %>
<% if layer.meta.label is defined %>
  << name >>:
    if: github.event.label.name == << layer.meta.label | ghstr >>
    runs-on: [self-hosted, gpu]
    timeout-minutes: << layer.max_timeout_minutes + 60 + 15 >>
    strategy:
      fail-fast: false
      matrix:
        batch: << layer.batches | tojson >>
    steps:
      - uses: actions/checkout@v4
        with:
          ref: ${{ github.event.pull_request.head.sha }}
          persist-credentials: false
      - name: Run ${{ matrix.batch }} (<< layer.max_gpus >> GPUs at most)
        env:
          CIBOX_IMAGE: ${{ vars.CIBOX_IMAGE_ID }}
        run: cibox batch run "${{ matrix.batch }}" --layer << name | shell >> --wait 1h --source .
      - name: Keep the reports (result.json is what cibox reproduce replays)
        if: always()
        uses: actions/upload-artifact@v4
        with:
          name: cibox-reports-${{ github.job }}-${{ strategy.job-index }}
          path: cibox-reports/
          if-no-files-found: ignore
<% endif %>
<% endfor %>
"#;

/// A nightly run of the GPU layers on the base branch: the runs whose cache writes a
/// trusted host keeps.
const WARM_UP_TEMPLATE: &str = r#"<# Written by `cibox init`. Every night, and by hand: the GPU layers on the base branch.
   A scheduled run is one whose cache writes a host with `caches.trusted: true` keeps
   (README: caches a pull request cannot poison), so pull requests start warm. #>
name: << project >> warm-up
on:
  schedule:
    - cron: "17 3 * * *"
  workflow_dispatch:
permissions:
  contents: read
jobs:
<% for name, layer in layers | items %>
<% if layer.meta.label is defined %>
  << name >>:
    runs-on: [self-hosted, gpu]
    timeout-minutes: << layer.batch_list | sum(attribute="timeout_minutes") + 120 + 15 >>
    steps:
      - uses: actions/checkout@v4
        with:
          persist-credentials: false
      - name: Run layer << name >>
        env:
          CIBOX_IMAGE: ${{ vars.CIBOX_IMAGE_ID }}
        run: cibox layer run << name | shell >> --wait 2h --source .
      - name: Keep the reports
        if: always()
        uses: actions/upload-artifact@v4
        with:
          name: cibox-reports-${{ github.job }}
          path: cibox-reports/
          if-no-files-found: ignore
<% endif %>
<% endfor %>
"#;
