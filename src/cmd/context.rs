//! What every command may need: the global flags, the manifest (found and loaded when
//! asked for), the host policy.

use std::path::PathBuf;

use super::error::CommandError;
use crate::error::Result;
use crate::host::HostPolicy;
use crate::manifest::{self, GpuConfig, Manifest};

pub use crate::manifest::no_manifest;

/// What every command may need: the global flags and a lazily found manifest.
pub struct Context {
    pub manifest_path: Option<PathBuf>,
    pub json: bool,
    /// The host policy, loaded once for the command (issue 48: `batch run` loaded it
    /// twice, once for the manifest's GPU settings and once for the run).
    pub(super) policy: std::cell::OnceCell<HostPolicy>,
}

impl Context {
    /// Finds (unless given) and loads the manifest, with the GPU facts the host policy
    /// pins laid over its own.
    pub fn manifest(&self) -> Result<Manifest> {
        let mut m = self.manifest_as_written()?;
        crate::host::gpu::settle(&self.host_policy()?, &mut m.gpu)?;
        Ok(m)
    }

    /// [`Context::manifest`] with the test lists its project's code prints (`collect:`)
    /// read, each in a disposable container of its image, from `source` (default: the
    /// checkout around the manifest), in image `image` when one is asked for.
    pub fn manifest_collected(
        &self,
        source: Option<&std::path::Path>,
        image: Option<&str>,
    ) -> Result<Manifest> {
        let m = self.manifest()?;
        if m.collectors.is_empty() {
            return Ok(m);
        }
        let source = match source {
            Some(s) => s.to_path_buf(),
            None => crate::git::checkout_above(&m.dir)
                .unwrap_or(&m.dir)
                .to_path_buf(),
        };
        let source = std::fs::canonicalize(&source).unwrap_or(source);
        let env_image = std::env::var("CIBOX_IMAGE").ok().filter(|s| !s.is_empty());
        let req = crate::run::collect::CollectRequest {
            source: &source,
            image: image.or(env_image.as_deref()),
        };
        crate::run::collect::collect(m, &req)
    }

    /// The manifest a render sees: printed at build time (a pipeline to upload), with
    /// the test lists the project's code prints collected; written to be committed,
    /// without them.
    pub fn manifest_to_render(&self, printed: bool) -> Result<Manifest> {
        match printed {
            true => self.manifest_collected(None, None),
            false => self.manifest(),
        }
    }

    /// The manifest as its file says, whatever the host policy pins.
    pub fn manifest_as_written(&self) -> Result<Manifest> {
        let path = match &self.manifest_path {
            Some(p) => p.clone(),
            None => {
                let cwd = std::env::current_dir().map_err(CommandError::CurrentFolder)?;
                manifest::find(&cwd)?
            }
        };
        Ok(Manifest::load(&path)?)
    }

    /// The host policy in force (none is the locked-down default).
    pub fn host_policy(&self) -> Result<HostPolicy> {
        if let Some(p) = self.policy.get() {
            return Ok(p.clone());
        }
        let p = HostPolicy::load()?;
        Ok(self.policy.get_or_init(|| p).clone())
    }

    /// The GPU settings without a manifest: the defaults with the `CIBOX_GPU_*`
    /// overrides, under the host policy.
    pub fn gpu_without_manifest(&self) -> Result<GpuConfig> {
        let mut gpu = GpuConfig::from_env()?;
        crate::host::gpu::settle(&self.host_policy()?, &mut gpu)?;
        Ok(gpu)
    }
}
