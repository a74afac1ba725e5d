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
use crate::units::Span;

/// Runs batches of a manifest (which `changed run` extends with its own); with `--json`
/// the run's outcome is printed on stdout.
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
        ..RunRequest::default()
    };
    plan::check_request(&m, &request)?;
    if let Some(w) = &opts.wait {
        let wait = w.parse::<Span>().map_err(CommandError::BadWait)?;
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
    let run = launch::run(m, &policy, request, ctx.json)?;
    if ctx.json {
        console::json(&run.to_json());
    }
    Ok(run.exit_code())
}
