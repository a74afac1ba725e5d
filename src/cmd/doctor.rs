//! `cibox doctor`: the host's checks ([`crate::doctor`]), shown.

use super::context::Context;
use crate::console;
use crate::doctor::{self, Sources};
use crate::error::Result;
use crate::host::HostPolicy;
use crate::manifest::{GpuConfig, Manifest};

impl Sources for Context {
    fn host_policy(&self) -> Result<HostPolicy> {
        Context::host_policy(self)
    }
    fn manifest(&self) -> Result<Manifest> {
        Context::manifest(self)
    }
    fn manifest_as_written(&self) -> Result<Manifest> {
        Context::manifest_as_written(self)
    }
    fn gpu_without_manifest(&self) -> Result<GpuConfig> {
        Context::gpu_without_manifest(self)
    }
}

/// `cibox doctor`.
pub fn run(ctx: &Context) -> Result<u8> {
    let report = doctor::examine(ctx);
    if ctx.json {
        console::json(&report.to_json());
    } else {
        print!("{}", report.render());
    }
    Ok(report.exit_code)
}
