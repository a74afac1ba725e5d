//! `cibox batch …`.

use serde_json::json;

use super::context::Context;
use crate::cli::{BatchListArgs, RunOptions};
use crate::console;
use crate::engine::Engine;
use crate::error::Result;
use crate::exit;
use crate::lockdir::LockDir;
use crate::plan::{self};
use crate::report::reporter::terminal::print_sweep_notes;
use crate::run::sweep;
use crate::timing::{PartitionSpec, Recorded};

/// `cibox batch list [NAME…] [--layer L] [--partition K/N] [--timings PATH]…`.
pub fn list(ctx: &Context, args: &BatchListArgs) -> Result<u8> {
    let m = ctx.manifest_collected(None, None)?;
    let partition = args
        .partition
        .as_deref()
        .map(str::parse::<PartitionSpec>)
        .transpose()?;
    let recorded = Recorded::read(&args.timings)?;
    let listing =
        plan::listing::list(&m, &args.names, args.layer.as_deref(), partition, &recorded)?;
    if ctx.json {
        console::json(&listing.json());
    } else {
        print!("{}", listing.text());
    }
    Ok(exit::SUCCESS)
}

/// `cibox batch run` and `cibox layer run`.
pub fn run(ctx: &Context, names: &[String], layer: Option<&str>, opts: &RunOptions) -> Result<u8> {
    let m = ctx.manifest_collected(opts.source.as_deref(), opts.image.as_deref())?;
    super::run::run_manifest(ctx, m, names, layer, opts)
}

/// `cibox cleanup [--scope S]`: the containers of dead runs of this host, of scope S
/// or of every scope.
pub fn cleanup(ctx: &Context, scope: Option<&str>) -> Result<u8> {
    // The project narrows what is touched when there is a manifest; without one, every
    // dead run's cibox container goes.
    let (project, gpu) = match ctx.manifest() {
        Ok(m) => (Some(m.project), m.gpu),
        Err(e) if super::context::no_manifest(&e) => (None, ctx.gpu_without_manifest()?),
        Err(e) => return Err(e),
    };
    // Where the runs' locks are: without it no container's run can be judged dead.
    let lock_dir = LockDir::open(&gpu.lock_dir, gpu.allow_network_lock_dir)?;
    let engine = Engine::connect()?;
    let swept = sweep(
        &engine,
        project.as_deref(),
        scope,
        &lock_dir,
        &crate::util::host_name(),
    )?;
    print_sweep_notes(&swept);
    if ctx.json {
        let elsewhere: Vec<_> = swept
            .elsewhere
            .iter()
            .map(|(name, host)| json!({"container": name, "host": host}))
            .collect();
        console::json(&json!({
            "scope": scope,
            "removed": swept.removed.len(),
            "live": swept.live.len(),
            "elsewhere": elsewhere,
        }));
    } else {
        let which = match scope {
            Some(s) => format!("scope {s}"),
            None => "dead runs in every scope".to_string(),
        };
        let mut line = format!("removed {} container(s) of {which}", swept.removed.len());
        if !swept.live.is_empty() {
            line.push_str(&format!(
                "; left {} of runs still alive (they remove their own)",
                swept.live.len()
            ));
        }
        println!("{line}");
    }
    Ok(exit::SUCCESS)
}
