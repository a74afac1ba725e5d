//! What a run knows of artifacts before it starts (see [`crate::artifact`]): its key
//! (which CI run it is, and at what trust), and every artifact its batches `needs`,
//! checked (a refusal is exit 2, nothing made).

use indexmap::IndexMap;

use crate::artifact::{ArtifactError, Key, Verified};
use crate::plan::RunPlan;

/// The artifact key of a run in this job (see [`Key`]): its CI run (GitHub's run,
/// Buildkite's build; `local` outside CI), untrusted when it may run code nobody merged
/// (`untrusted`, a workflow event other than a push, a schedule or a release, a
/// Buildkite pull request's build).
pub fn key(untrusted: bool) -> Key {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let run = match (var("GITHUB_RUN_ID"), var("BUILDKITE_BUILD_ID")) {
        (Some(id), _) if crate::github::active() => format!(
            "github:{}:{id}",
            var("GITHUB_REPOSITORY").unwrap_or_default()
        ),
        (_, Some(id)) if crate::buildkite::active() => format!("buildkite:{id}"),
        _ => "local".to_string(),
    };
    let pr_build =
        crate::buildkite::active() && var("BUILDKITE_PULL_REQUEST").is_some_and(|v| v != "false");
    Key::new(
        run,
        untrusted || crate::github::untrusted_event().is_some() || pr_build,
    )
}

/// Every artifact the run's batches need, checked, by producer.
pub fn check_needs(plan: &RunPlan) -> crate::error::Result<IndexMap<String, Verified>> {
    let mut verified = IndexMap::new();
    for b in &plan.batches {
        for producer in &b.needs {
            if plan.batches.iter().any(|x| &x.name == producer) {
                return Err(ArtifactError::SameRun {
                    consumer: b.name.clone(),
                    producer: producer.clone(),
                }
                .into());
            }
            if verified.contains_key(producer) {
                continue;
            }
            let v = crate::artifact::verify(
                &plan.reports,
                producer,
                &format!("batch {}", b.name),
                &plan.artifacts.key,
                None,
            )?;
            verified.insert(producer.clone(), v);
        }
    }
    Ok(verified)
}

/// Artifacts pass through the reports folder of the host that runs the layers; a
/// Slurm job's batch runs on another node: refused there (exit 2) rather than lost.
pub fn refuse_under_slurm(
    m: &crate::manifest::Manifest,
    names: &[String],
) -> Result<(), ArtifactError> {
    let uses = names.iter().find(|n| {
        m.batches
            .get(*n)
            .is_some_and(|b| !b.outputs.is_empty() || !b.needs.is_empty())
    });
    match uses {
        Some(batch) => Err(ArtifactError::UnderSlurm {
            batch: batch.clone(),
        }),
        None => Ok(()),
    }
}
