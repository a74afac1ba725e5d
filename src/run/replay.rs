//! Replaying a recorded batch (`cibox reproduce RESULT.json`): on the recorded commit,
//! in a temporary worktree, with the recorded image, fast mode and GPU count; what the
//! replay will do ([`Replay::plan_lines`]), and the recorded and replayed outcomes side by
//! side ([`side_by_side`]).

use std::path::{Path, PathBuf};

use crate::changed::NotATestFile;
use crate::console::{self, Table};
use crate::engine::Engine;
use crate::error::{Error, ErrorKind, Result};
use crate::exit::Failure;
use crate::git::GitError;
use crate::git::text as git;
use crate::host::HostPolicy;
use crate::image::{ImageError, ImageId};
use crate::manifest::Manifest;
use crate::plan::RunRequest;
use crate::report::RunRecord;
use crate::run::launch::{self, Whereabouts};

/// What keeps `reproduce` from replaying a record.
#[derive(Debug, thiserror::Error)]
pub enum ReproduceError {
    #[error("temporary folder: {0}")]
    TempDir(#[source] std::io::Error),
    #[error("git worktree add: {0}")]
    WorktreeAdd(#[source] GitError),
    #[error("current folder: {0}")]
    CurrentFolder(#[source] std::io::Error),
    #[error("reproduce runs inside the project's git repository; cd into it")]
    NotInRepository,
    #[error(
        "{}: the run recorded no commit (its source was not a git checkout), so it cannot be replayed",
        .result.display()
    )]
    NoCommit { result: PathBuf },
    #[error(
        "commit {sha} is not in {}; fetch it first: {}",
        .repo.display(),
        match .remote {
            Some(r) => format!("git fetch {r} {sha}"),
            None => "this repository has no remote: add the one the run came from (git remote add NAME URL) and fetch the commit from it (git fetch NAME COMMIT)".to_string(),
        }
    )]
    CommitMissing {
        sha: String,
        repo: PathBuf,
        /// The remote to fetch from: `origin` when there is one, else the first.
        remote: Option<String>,
    },
    /// The batch ran a test file through `changed.run`, which the manifest at the
    /// recorded commit lacks.
    #[error(
        "batch {batch} ran test file {file} through changed.run, which {} at {sha} lacks",
        .manifest.display()
    )]
    NoChangedRun {
        batch: String,
        file: String,
        manifest: PathBuf,
        sha: String,
    },
    /// The record names a test file `changed` itself would not list.
    #[error("{}: {why}", .result.display())]
    NotATestFile {
        result: PathBuf,
        #[source]
        why: NotATestFile,
    },
    /// The manifest is not in the recorded commit: the run used one never committed.
    #[error(
        "{} is not in commit {sha}: the run's manifest was not committed{}; commit it and run again, or run the batch by hand (cibox batch run)",
        .manifest.display(),
        if *.dirty { " (the record says the source had uncommitted changes)" } else { "" }
    )]
    ManifestNotCommitted {
        manifest: PathBuf,
        sha: String,
        dirty: bool,
    },
    #[error("batch {batch} is not in {} at {sha}", .manifest.display())]
    NoSuchBatch {
        batch: String,
        manifest: PathBuf,
        sha: String,
    },
}

impl ErrorKind for ReproduceError {
    fn failure(&self) -> Failure {
        match self {
            ReproduceError::TempDir(_) | ReproduceError::WorktreeAdd(_) => Failure::Infra,
            ReproduceError::CurrentFolder(_)
            | ReproduceError::NotInRepository
            | ReproduceError::NoCommit { .. }
            | ReproduceError::CommitMissing { .. }
            | ReproduceError::NoChangedRun { .. }
            | ReproduceError::NotATestFile { .. }
            | ReproduceError::NoSuchBatch { .. }
            | ReproduceError::ManifestNotCommitted { .. } => Failure::Usage,
        }
    }
}

/// Removes the temporary worktree however the replay ends.
pub struct Worktree {
    repo: PathBuf,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Worktree {
    /// A detached worktree of `repo` at `sha`, in a temporary folder.
    fn add(repo: &Path, sha: &str) -> Result<Worktree> {
        let dir = tempfile::tempdir().map_err(ReproduceError::TempDir)?;
        let path = dir.path().join("src");
        git(
            repo,
            &[
                "worktree",
                "add",
                "--detach",
                &path.display().to_string(),
                sha,
            ],
        )
        .map_err(ReproduceError::WorktreeAdd)?;
        Ok(Worktree {
            repo: repo.to_path_buf(),
            path,
            _dir: dir,
        })
    }
}

impl Drop for Worktree {
    fn drop(&mut self) {
        let _ = git(
            &self.repo,
            &[
                "worktree",
                "remove",
                "--force",
                &self.path.display().to_string(),
            ],
        );
    }
}

/// A recorded batch to replay, and where it came from.
pub struct Replay {
    /// The record's file.
    result: PathBuf,
    pub record: RunRecord,
    /// The recorded commit.
    pub sha: String,
    pub image: ImageId,
    /// Where the manifest sits in the repository, to find it in the worktree.
    pub manifest_rel: PathBuf,
    repo: PathBuf,
}

impl Replay {
    /// The record at `result`, checked replayable here: run inside its repository,
    /// which holds its commit; its image present in the local engine. `manifest` (the
    /// one the command finds, if any) says where the manifest sits in the repository.
    pub fn read(result: &Path, manifest: impl FnOnce() -> Option<Manifest>) -> Result<Replay> {
        let record = RunRecord::read(result)?;
        let cwd = std::env::current_dir().map_err(ReproduceError::CurrentFolder)?;
        let repo = git(&cwd, &["rev-parse", "--show-toplevel"])
            .map(PathBuf::from)
            .map_err(|_| ReproduceError::NotInRepository)?;
        let Some(sha) = record.source.sha.clone() else {
            return Err(ReproduceError::NoCommit {
                result: result.to_path_buf(),
            }
            .into());
        };
        if git(&repo, &["cat-file", "-e", &format!("{sha}^{{commit}}")]).is_err() {
            let remotes = git(&repo, &["remote"]).unwrap_or_default();
            let remote = fetch_remote(&remotes);
            return Err(ReproduceError::CommitMissing { sha, repo, remote }.into());
        }
        let image = ImageId::parse(&record.image).map_err(ImageError::NotAnId)?;
        let manifest_rel = manifest()
            .and_then(|m| m.path.canonicalize().ok())
            .and_then(|p| p.strip_prefix(&repo).ok().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from(crate::manifest::FILE_NAME));
        let engine = Engine::connect()?;
        if engine.inspect(image.as_str())?.is_none() {
            return Err(image_gone(&image, &sha, &record));
        }
        Ok(Replay {
            result: result.to_path_buf(),
            record,
            sha,
            image,
            manifest_rel,
            repo,
        })
    }

    /// The recorded commit, checked out in a temporary worktree.
    pub fn checkout(&self) -> Result<Worktree> {
        Worktree::add(&self.repo, &self.sha)
    }

    /// The run of the recorded batch from `worktree`, as part of its layer again (the
    /// layer decided its image, and so its install).
    pub fn request(&self, worktree: &Worktree) -> Result<RunRequest> {
        let record = &self.record;
        let reports = PathBuf::from("cibox-reproduce").join(&record.run);
        let mut request = RunRequest {
            names: vec![record.batch.clone()],
            layer: record.layer.clone(),
            fast: Some(record.fast),
            image: Some(self.image.to_string()),
            // A record may be anyone's: a replay never writes a cache through.
            private_caches: Some(crate::plan::run_plan::REPLAY.into()),
            ..RunRequest::default()
        };
        launch::locate(
            &mut request,
            Whereabouts {
                source: Some(worktree.path.clone()),
                reports: Some(reports),
                scope: Some(format!("repro-{}", &record.run[..8.min(record.run.len())])),
            },
        )?;
        Ok(request)
    }
    /// The manifest at the recorded commit, holding the recorded batch (a batch
    /// `changed run` made is made again from that commit's `changed.run`).
    pub fn manifest(
        &self,
        worktree: &Worktree,
        policy: impl FnOnce() -> Result<HostPolicy>,
    ) -> Result<Manifest> {
        let (record, sha) = (&self.record, self.sha.as_str());
        // Not in the commit (never committed), or absent from the checkout of it.
        let in_commit = format!("{sha}:{}", self.manifest_rel.display());
        if git(&worktree.repo, &["cat-file", "-e", &in_commit]).is_err()
            || !worktree.path.join(&self.manifest_rel).exists()
        {
            return Err(ReproduceError::ManifestNotCommitted {
                manifest: self.manifest_rel.clone(),
                sha: sha.to_string(),
                dirty: record.source.dirty == Some(true),
            }
            .into());
        }
        let mut m = Manifest::load(&worktree.path.join(&self.manifest_rel))?;
        crate::host::gpu::settle(&policy()?, &mut m.gpu)?;
        if let Some(file) = &record.changed_file
            && !m.batches.contains_key(&record.batch)
        {
            let (Some(cfg), Some(template)) = (
                m.changed.as_ref(),
                m.changed.as_ref().and_then(|c| c.run.as_ref()),
            ) else {
                return Err(ReproduceError::NoChangedRun {
                    batch: record.batch.clone(),
                    file: file.clone(),
                    manifest: self.manifest_rel.clone(),
                    sha: sha.to_string(),
                }
                .into());
            };
            crate::changed::check_test_file(cfg, file).map_err(|why| {
                ReproduceError::NotATestFile {
                    result: self.result.clone(),
                    why,
                }
            })?;
            launch::check_test_file_in(&worktree.path, file)?;
            let batch = template.batch_for(file, record.gpu_count);
            m.batches.insert(record.batch.clone(), batch);
        }
        match m.batches.get(&record.batch) {
            None => {
                return Err(ReproduceError::NoSuchBatch {
                    batch: record.batch.clone(),
                    manifest: self.manifest_rel.clone(),
                    sha: sha.to_string(),
                }
                .into());
            }
            Some(b) if b.gpus != record.gpu_count => console::warn(format!(
                "batch {} asks for {} at {sha}, the record says {}; replaying with the manifest's",
                record.batch,
                crate::util::count(b.gpus, "GPU"),
                record.gpu_count
            )),
            Some(_) => {}
        }
        Ok(m)
    }

    /// What the replay will do, one line each.
    pub fn plan_lines(&self) -> Vec<String> {
        plan_lines(&self.record, &self.sha, &self.image, &self.manifest_rel)
    }

    /// What the replay will do, as `--json` prints it.
    pub fn plan_json(&self) -> serde_json::Value {
        plan_json(&self.record, &self.sha, &self.image, &self.manifest_rel)
    }
}

/// The remote to fetch a missing commit from: `origin` when there is one, else the
/// first `git remote` lists.
fn fetch_remote(remotes: &str) -> Option<String> {
    let remotes: Vec<&str> = remotes
        .lines()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .collect();
    remotes
        .iter()
        .find(|r| **r == "origin")
        .or(remotes.first())
        .map(|r| crate::util::escape(r).into_owned())
}

/// Where the replay's hardware differs from the recorded (nothing when the record is
/// older than `hardware`).
pub fn hardware_differences(
    recorded: &RunRecord,
    replayed: &RunRecord,
) -> Vec<(&'static str, String, String)> {
    match (&recorded.hardware, &replayed.hardware) {
        (Some(a), Some(b)) => a.differences(b),
        _ => Vec::new(),
    }
}

/// The refusal when the image the run used is not in the local engine, with how to get
/// it back.
fn image_gone(image: &ImageId, sha: &str, record: &RunRecord) -> Error {
    Error::from(ImageError::Refused {
        message: format!("{image}, which the run used, is not present in the local engine"),
        details: vec![
            "restore it from its backup: cibox image load --from BACKUP.tar (written by cibox image save)".into(),
            format!("or rebuild it from the recipe at {sha} (nix run .#image-NAME, or cibox image build); a rebuild must pass cibox image verify against lockset {}", record.lockset),
        ],
    })
}

/// What the replay will do, one line each.
pub fn plan_lines(
    record: &RunRecord,
    sha: &str,
    image: &ImageId,
    manifest_rel: &Path,
) -> Vec<String> {
    let mut lines = vec![
        format!(
            "batch:    {} (run {}, recorded {})",
            record.batch,
            record.run,
            record.status.as_str()
        ),
        format!(
            "source:   {sha}{} in a temporary worktree",
            if record.source.dirty == Some(true) {
                " (the recorded tree had uncommitted changes; they are not replayed)"
            } else {
                ""
            }
        ),
        format!(
            "image:    {image}{}",
            match (&record.layer, record.image_name.as_str()) {
                (Some(layer), name) if !name.is_empty() => format!(" (`{name}`, of layer {layer})"),
                (Some(layer), _) => format!(" (of layer {layer})"),
                (None, "") => String::new(),
                (None, name) => format!(" (`{name}`)"),
            }
        ),
        format!("fast:     {}", record.fast),
        format!("gpus:     {}", record.gpu_count),
        format!("manifest: {}", manifest_rel.display()),
    ];
    if let Some(hw) = &record.hardware {
        let said: Vec<String> = hw
            .aspects()
            .into_iter()
            .map(|(what, text)| format!("{what} {}", crate::util::escape(&text)))
            .collect();
        lines.push(format!("recorded on: {}", said.join("; ")));
    }
    lines
}

/// What the replay will do, as `--json` prints it.
pub fn plan_json(
    record: &RunRecord,
    sha: &str,
    image: &ImageId,
    manifest_rel: &Path,
) -> serde_json::Value {
    serde_json::json!({
        "batch": record.batch,
        "run": record.run,
        "recorded_status": record.status,
        "commit": sha,
        "dirty": record.source.dirty,
        "image": image,
        "image_name": record.image_name,
        "layer": record.layer,
        "fast": record.fast,
        "gpus": record.gpu_count,
        "manifest": manifest_rel,
        "recorded_hardware": record.hardware,
    })
}

/// The recorded and replayed outcomes side by side, and the failing tests of either.
pub fn side_by_side(recorded: &RunRecord, replayed: &RunRecord) -> String {
    let mut out = String::from("\n");
    let mut t = Table::new(&["", "RECORDED", "REPLAYED"]);
    let row = |name: &str, a: String, b: String| vec![name.to_string(), a, b];
    t.row(row(
        "status",
        recorded.status.as_str().into(),
        replayed.status.as_str().into(),
    ));
    t.row(row(
        "exit code",
        recorded.exit_code.to_string(),
        replayed.exit_code.to_string(),
    ));
    let counts = |r: &RunRecord| {
        format!(
            "{} total, {} failed, {} errors, {} skipped",
            r.tests.total, r.tests.failed, r.tests.errors, r.tests.skipped
        )
    };
    t.row(row("tests", counts(recorded), counts(replayed)));
    t.row(row("host", recorded.host.clone(), replayed.host.clone()));
    t.row(row(
        "gpus",
        recorded.gpus.len().to_string(),
        replayed.gpus.len().to_string(),
    ));
    // What each ran on, side by side, a differing row marked.
    let aspects = |r: &RunRecord| r.hardware.as_ref().map(|h| h.aspects());
    if let Some(replayed_hw) = aspects(replayed) {
        let recorded_hw = aspects(recorded);
        for (i, (what, now)) in replayed_hw.into_iter().enumerate() {
            let then = recorded_hw
                .as_ref()
                .map_or_else(|| "not recorded".to_string(), |a| a[i].1.clone());
            let mark = if recorded_hw.is_some() && then != now {
                " (differs)"
            } else {
                ""
            };
            t.row(row(what, then, format!("{now}{mark}")));
        }
    }
    out.push_str(&t.render());
    let both: std::collections::BTreeSet<&String> = recorded
        .failed_tests
        .iter()
        .chain(&replayed.failed_tests)
        .collect();
    if !both.is_empty() {
        out.push('\n');
        let mut t = Table::new(&["FAILING TEST", "RECORDED", "REPLAYED"]);
        for name in both {
            let mark = |r: &RunRecord| {
                if r.failed_tests.contains(name) {
                    "failed"
                } else {
                    "-"
                }
            };
            t.row(vec![
                name.clone(),
                mark(recorded).into(),
                mark(replayed).into(),
            ]);
        }
        out.push_str(&t.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::reporter::sample;

    #[test]
    fn a_missing_commit_is_fetched_from_origin_else_the_first_remote() {
        assert_eq!(
            fetch_remote("upstream\norigin\n").as_deref(),
            Some("origin")
        );
        assert_eq!(
            fetch_remote("upstream\nfork\n").as_deref(),
            Some("upstream")
        );
        assert_eq!(fetch_remote("\n"), None);
    }

    #[test]
    fn the_plan_says_what_the_replay_will_do() {
        let mut record = sample::run().batches.swap_remove(1).record;
        record.source.dirty = Some(true);
        record.layer = Some("2".into());
        let image = ImageId::parse(&format!("sha256:{}", "a".repeat(64))).unwrap();
        let lines = plan_lines(&record, "0123abc", &image, Path::new("ci/cibox.yaml"));
        insta::assert_snapshot!("plan_lines", lines.join("\n"));
        let json = plan_json(&record, "0123abc", &image, Path::new("ci/cibox.yaml"));
        assert_eq!(json["commit"], "0123abc");
        assert_eq!(json["manifest"], "ci/cibox.yaml");
    }

    #[test]
    fn the_outcomes_side_by_side_mark_what_differs() {
        let run = sample::run();
        let recorded = &run.batches[1].record;
        let mut replayed = recorded.clone();
        replayed.status = crate::report::outcome::Status::Passed;
        replayed.exit_code = 0;
        replayed.failed_tests.clear();
        replayed.host = "other-host".into();
        if let Some(hw) = &mut replayed.hardware {
            hw.kernel = "6.8.0-replayed".into();
        }
        insta::assert_snapshot!("side_by_side", side_by_side(recorded, &replayed));
        assert!(
            replayed.hardware.is_none() || hardware_differences(recorded, &replayed).len() == 1
        );
    }
}
