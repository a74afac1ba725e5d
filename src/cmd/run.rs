//! Running a manifest's batches, as `batch run`, `layer run` and `changed run` ask:
//! the request from the flags, then the run.

use super::context::Context;
use super::error::CommandError;
use crate::cli::RunOptions;
use crate::console;
use crate::error::Result;
use crate::manifest::Manifest;
use crate::plan::{self, RunRequest};
use crate::run::launch::{self, Whereabouts};
use crate::timing::{PartitionSpec, Recorded};

/// Runs batches of a manifest (which `changed run` extends with its own); with `--json`
/// the run's outcome is printed on stdout.
/// The part of the run's batches to run: `--partition K/N`, else, in a Buildkite job of
/// a step with `parallelism: N`, the job's part (`BUILDKITE_PARALLEL_JOB` counts from
/// 0, K from 1).
fn partition(opts: &RunOptions) -> Result<Option<PartitionSpec>> {
    let given = opts
        .partition
        .as_deref()
        .map(str::parse::<PartitionSpec>)
        .transpose()?;
    if !crate::buildkite::active() {
        return Ok(given);
    }
    let job = crate::buildkite::parallel_job().map_err(CommandError::BuildkiteParallel)?;
    match (given, job) {
        (Some(p), Some((k, n))) if (p.index, p.count) != (k, n) => {
            console::warn(format!(
                "--partition {p} given; this Buildkite job is part {k}/{n} of its step (BUILDKITE_PARALLEL_JOB): running part {p}, as asked"
            ));
            Ok(Some(p))
        }
        (Some(p), _) => Ok(Some(p)),
        (None, Some((k, n))) => {
            let p = format!("{k}/{n}").parse::<PartitionSpec>()?;
            console::info(format!(
                "running part {p} of the batches: this Buildkite job's of its parallel step (BUILDKITE_PARALLEL_JOB={}, BUILDKITE_PARALLEL_JOB_COUNT={n})",
                k - 1
            ));
            Ok(Some(p))
        }
        (None, None) => Ok(None),
    }
}

pub fn run_manifest(
    ctx: &Context,
    m: Manifest,
    names: &[String],
    layer: Option<&str>,
    opts: &RunOptions,
) -> Result<u8> {
    let policy = ctx.host_policy()?;
    let mut request = RunRequest {
        names: names.to_vec(),
        layer: layer.map(str::to_string),
        fast: if opts.fast {
            Some(true)
        } else if opts.no_fast {
            Some(false)
        } else {
            None
        },
        image: opts
            .image
            .clone()
            .or_else(|| std::env::var("CIBOX_IMAGE").ok().filter(|s| !s.is_empty())),
        image_from: Some(
            if opts.image.is_some() {
                "--image"
            } else {
                "CIBOX_IMAGE"
            }
            .into(),
        ),
        image_ids: m
            .images
            .keys()
            .filter_map(|name| {
                std::env::var(crate::manifest::image_variable(name))
                    .ok()
                    .filter(|s| !s.is_empty())
                    .map(|id| (name.clone(), id))
            })
            .collect(),
        parallel: opts.parallel,
        partition: partition(opts)?,
        recorded: Recorded::read(&opts.timings)?,
        retries: opts.retries,
        fail_fast: opts.fail_fast,
        ..RunRequest::default()
    };
    if let Some(n) = opts.retries
        && i64::from(n) > crate::manifest::MAX_RETRIES
    {
        return Err(CommandError::BadRetries(n).into());
    }
    let names = plan::check_request(&m, &request)?;
    if let (Some(part), true) = (request.partition, names.is_empty()) {
        // A part may be empty (fewer batches than parts): nothing to run is success.
        console::info(format!(
            "partition {part}: no batch falls to this part; nothing to run"
        ));
        if ctx.json {
            console::json(&serde_json::json!({
                "status": "passed",
                "exit_code": 0,
                "partition": part.to_string(),
                "batches": [],
            }));
        }
        return Ok(crate::exit::SUCCESS);
    }
    if let Some(wait) = opts.wait {
        request.wait = Some(wait.0);
    }
    launch::locate(
        &mut request,
        Whereabouts {
            source: opts.source.clone(),
            reports: opts.reports.clone(),
            scope: opts.scope.clone(),
        },
    )?;
    let run = launch::run_checked(m, &policy, request, names, ctx.json)?;
    if ctx.json {
        console::json(&run.to_json());
    }
    Ok(run.exit_code())
}
