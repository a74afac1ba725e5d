//! `cibox artifact`: a CI job's check of the artifacts it downloaded, and the digest
//! a producer's job hands on; the checks are [`crate::artifact`]'s.

use std::path::PathBuf;

use super::context::Context;
use crate::artifact::{self, ArtifactError};
use crate::console;
use crate::error::Result;

fn reports_folder(reports: Option<PathBuf>) -> PathBuf {
    reports.unwrap_or_else(|| PathBuf::from("cibox-reports"))
}

/// Checks each artifact for a run of this job; exit 2 at the first refused.
pub fn verify(
    ctx: &Context,
    artifacts: &[(String, Option<String>)],
    reports: Option<PathBuf>,
) -> Result<u8> {
    let reports = reports_folder(reports);
    let key = crate::run::artifacts::key(false);
    let mut checked = Vec::new();
    for (batch, digest) in artifacts {
        let v = artifact::verify(&reports, batch, "this job", &key, digest.as_deref())?;
        if !ctx.json {
            console::info(format!(
                "artifact of batch {batch}: {} files, {} bytes, listing {}, {key}: verified",
                v.count, v.bytes, v.digest
            ));
        }
        checked.push(serde_json::json!({
            "batch": batch, "files": v.count, "bytes": v.bytes, "digest": v.digest,
        }));
    }
    if ctx.json {
        console::json(&serde_json::json!({ "artifacts": checked }));
    }
    Ok(crate::exit::SUCCESS)
}

/// Prints the digest of `batch`'s listing on stdout.
pub fn digest(batch: &str, reports: Option<PathBuf>) -> Result<u8> {
    let reports = reports_folder(reports);
    let d = artifact::listing_digest(&reports, batch).map_err(|source| ArtifactError::Io {
        path: reports
            .join(artifact::STORE)
            .join(batch)
            .display()
            .to_string(),
        source,
    })?;
    println!("{d}");
    Ok(crate::exit::SUCCESS)
}
