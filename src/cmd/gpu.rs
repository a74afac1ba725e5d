//! `cibox gpu status`, `cibox gpu exec` and `cibox gpu fake`.

use std::path::PathBuf;

use super::context::Context;
use crate::cli::GpuExecArgs;
use crate::console;
use crate::error::Result;
use crate::exit;
use crate::gpu;
use crate::gpu::probe::HostInstant;
use crate::manifest::GpuConfig;

/// The GPU settings: the manifest's when there is one, else defaults; `CIBOX_*`
/// variables override either. `gpu` commands also serve hosts without a manifest.
pub(crate) fn settings(ctx: &Context) -> Result<GpuConfig> {
    match ctx.manifest() {
        Ok(m) => Ok(m.gpu),
        Err(e) if super::context::no_manifest(&e) && ctx.manifest_path.is_none() => {
            ctx.gpu_without_manifest()
        }
        Err(e) => Err(e),
    }
}

/// `cibox gpu fake`: writes a fake host and prints the variables that turn it on.
pub fn fake(args: &crate::cli::GpuFakeArgs) -> Result<u8> {
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::var_os("XDG_STATE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
            .unwrap_or_else(std::env::temp_dir)
            .join("cibox/fake-gpus"),
    };
    let host = gpu::fake::create(&dir, &args.vendor, args.model.as_deref(), args.count)?;
    let quote = |p: &std::path::Path| format!("'{}'", p.to_string_lossy().replace('\'', "'\\''"));
    println!("export {}={}", gpu::fake::VARIABLE, quote(&host.dir));
    println!(
        "export CIBOX_GPU_LOCK_DIR={}",
        quote(&host.dir.join("locks"))
    );
    eprintln!("cibox: {}", host.describe());
    eprintln!(
        "cibox: `unset {} CIBOX_GPU_LOCK_DIR` turns them off",
        gpu::fake::VARIABLE
    );
    Ok(exit::SUCCESS)
}

/// `cibox gpu status`: one row per GPU, without waiting on any lock.
pub fn status(ctx: &Context) -> Result<u8> {
    // On a login node: the cluster's nodes, from Slurm.
    if let crate::host::Scheduler::Slurm(slurm) = &ctx.host_policy()?.scheduler {
        let nodes = crate::capacity::cluster::Nodes::query(slurm)?;
        if ctx.json {
            console::json(&nodes.to_json());
        } else {
            print!("{}", nodes.render());
        }
        return Ok(exit::SUCCESS);
    }
    let status = crate::capacity::status::gpu_status(&settings(ctx)?)?;
    if ctx.json {
        console::json(&status.to_json());
    } else {
        print!("{}", status.render());
    }
    Ok(exit::SUCCESS)
}

/// `cibox gpu exec`.
pub fn exec(ctx: &Context, args: GpuExecArgs) -> Result<u8> {
    // The pool is resolved by a probe that started after we arrived: the jobs of a CI
    // fan-out that arrive together share one.
    let arrived = HostInstant::now();
    crate::run::gpu_exec::exec(&args, arrived, || settings(ctx))
}
