//! `image qualify`: run the manifest's `qualify` layer on one image and, only when every
//! batch of it passed, write `qualification.json` (docs/interface.md §7) beside the
//! batches' reports. Nothing from an earlier run may pass for this one's: the old record
//! goes before anything runs.

use std::path::PathBuf;

use serde_json::json;

use crate::engine::Engine;
use crate::host::HostPolicy;
use crate::image::ImageId;
use crate::manifest::Manifest;
use crate::plan::RunRequest;
use crate::report::outcome::RunResult;
use crate::run::error::RunError;
use crate::run::launch::{self, Whereabouts};

/// What qualifying an image came to.
pub struct Qualification {
    pub run: RunResult,
    /// The record written, when every batch passed.
    pub record: Option<PathBuf>,
}

impl Qualification {
    /// What `--json` prints: the run's outcome, the image, and the record if written.
    pub fn to_json(&self, image: &ImageId) -> serde_json::Value {
        let mut outcome = self.run.to_json();
        outcome["image"] = json!(image);
        outcome["qualified"] = json!(self.record.is_some());
        outcome["qualification"] = json!(self.record);
        outcome
    }

    /// 0 when qualified, else the run's exit code.
    pub fn exit_code(&self) -> u8 {
        match self.record {
            Some(_) => crate::exit::SUCCESS,
            None => self.run.exit_code(),
        }
    }

    /// Why `image` is not qualified, and which folder the batches ran from: the git
    /// root unless --source said otherwise, which is rarely the manifest's folder in a
    /// subfolder.
    pub fn not_qualified(&self, image: &ImageId) -> String {
        let from = self
            .run
            .batches
            .first()
            .map(|b| {
                format!(
                    " (its batches ran from {}; --source names another folder)",
                    b.record.source.path
                )
            })
            .unwrap_or_default();
        format!("{image} is not qualified: the qualify layer did not pass{from}")
    }
}

/// Runs the `qualify` layer on `image`, with the reports (and the record) in
/// `at.reports`; `json` as for [`launch::run`].
pub fn qualify(
    manifest: Manifest,
    policy: &HostPolicy,
    image: &ImageId,
    at: Whereabouts,
    json: bool,
) -> Result<Qualification, crate::error::Error> {
    if !manifest.layers.contains_key("qualify") {
        return Err(RunError::NoQualifyLayer {
            manifest: manifest.path.clone(),
        }
        .into());
    }
    let reports = at.reports.clone().unwrap_or_default();
    let record_path = reports.join("qualification.json");
    match std::fs::remove_file(&record_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(RunError::StaleRecord {
                path: record_path,
                source,
            }
            .into());
        }
    }
    let mut request = RunRequest {
        layer: Some("qualify".into()),
        image: Some(image.to_string()),
        ..RunRequest::default()
    };
    launch::locate(&mut request, at)?;
    let run = launch::run(manifest, policy, request, json)?;
    if !run.passed() {
        return Ok(Qualification { run, record: None });
    }
    write_record(&run, image, &record_path)?;
    Ok(Qualification {
        run,
        record: Some(record_path),
    })
}

/// `qualification.json`: the image, what its IDs mean on this engine, the lockset and
/// source it was qualified against, and each batch's result.
fn write_record(
    run: &RunResult,
    image: &ImageId,
    path: &std::path::Path,
) -> Result<(), crate::error::Error> {
    let results: Vec<_> = run
        .batches
        .iter()
        .map(|b| {
            let r = &b.record;
            json!({"batch": r.batch, "status": r.status, "tests": r.tests, "duration_s": r.duration_s})
        })
        .collect();
    let first = &run.batches[0].record;
    let semantics = Engine::connect()?.info()?.id_semantics;
    let record = json!({
        "schema": 1,
        "image": image,
        "id_semantics": semantics,
        "lockset": first.lockset,
        "source": first.source,
        "manifest_digest": first.manifest_digest,
        "batches": results,
        "cibox_version": env!("CARGO_PKG_VERSION"),
        "qualified_at": crate::units::rfc3339(std::time::SystemTime::now()),
    });
    let text = serde_json::to_string_pretty(&record).expect("serialises") + "\n";
    // In the reports folder the run held open and found only root or the user can
    // change: by name, so a link planted there is replaced, never followed.
    let folder = path.parent().unwrap_or(std::path::Path::new("."));
    super::batch_dir::reports_folder(folder)?
        .write_replacing("qualification.json", text.as_bytes())
        .map_err(|source| {
            RunError::Record {
                path: path.to_path_buf(),
                source,
            }
            .into()
        })
}
