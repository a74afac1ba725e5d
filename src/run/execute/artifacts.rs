//! A batch's artifacts in a run (see [`crate::artifact`]; checked before anything
//! starts by [`crate::run::artifacts`]): each mounted read-only at `/artifacts/<producer>` of its consumer; a producer's `outputs`
//! taken out of its container while it lives, when it exited 0, and kept only when it
//! passed.

use bollard::models::{ContainerCreateBody, Mount};

use crate::artifact::{self, Listing, OutputSpec, Taken};
use crate::plan::BatchPlan;
use crate::report::outcome::{ContainerEnd, Status};
use crate::run::copy::StopWhen;
use crate::run::execute::Execution;

impl Execution<'_> {
    /// Adds to `body` the read-only mounts of the artifacts `b` needs, where the
    /// engine finds them.
    pub(super) fn mount_artifacts(&self, b: &BatchPlan, body: &mut ContainerCreateBody) {
        let mounts: Vec<Mount> = b
            .needs
            .iter()
            .filter_map(|p| self.artifacts.get(p))
            .map(|v| {
                let source = match &self.plan.artifacts.host_reports {
                    Some(host) => match v.files.strip_prefix(&self.plan.reports) {
                        Ok(rel) => host.join(rel),
                        Err(_) => v.files.clone(),
                    },
                    None => v.files.clone(),
                };
                crate::plan::container::read_only_bind(
                    &source.to_string_lossy(),
                    &format!("{}/{}", artifact::MOUNT_ROOT, v.producer),
                    false,
                )
            })
            .collect();
        if !mounts.is_empty()
            && let Some(hc) = body.host_config.as_mut()
        {
            hc.mounts.get_or_insert_with(Vec::new).extend(mounts);
        }
    }

    /// How the batch ended once its outputs are taken (when it exited 0 and has
    /// some): refused, it failed, with the reason.
    pub(super) fn outputs_taken(&self, b: &BatchPlan, id: &str, end: ContainerEnd) -> ContainerEnd {
        if b.outputs.is_empty() || !matches!(end, ContainerEnd::Exited(0)) {
            return end;
        }
        match self.take_outputs(b, id) {
            Some(message) => ContainerEnd::Stopped {
                status: Status::Failed,
                message,
                exit: Some(0),
            },
            None => end,
        }
    }

    /// Takes `b`'s outputs out of its container `id` (which lives) into the store; why
    /// they were refused, when they were (the batch then fails, and the store keeps
    /// nothing of it).
    pub(super) fn take_outputs(&self, b: &BatchPlan, id: &str) -> Option<String> {
        let listing = Listing {
            schema: 1,
            project: self.plan.manifest.project.clone(),
            batch: b.name.clone(),
            key: self.plan.artifacts.key.clone(),
            outputs: b.outputs.clone(),
            folders: Vec::new(),
            files: Vec::new(),
        };
        let mut taken = Taken {
            max: self.plan.artifacts.max_bytes,
            bytes: 0,
            entries: 0,
        };
        let stop = StopWhen::now();
        let made = artifact::produce(&self.reports, listing, |files, listing| {
            for pattern in &b.outputs {
                let spec = OutputSpec::parse(pattern)?;
                let archive = self
                    .engine
                    .download(id, &spec.dir, Box::new(move || stop.reason()));
                artifact::take(archive, &spec, files, listing, &mut taken, &|| {
                    stop.reason()
                })?;
            }
            Ok(())
        });
        match made {
            Ok(digest) => {
                self.said(format!(
                    "batch {}: artifact of {} bytes kept for later layers ({} listing {digest})",
                    b.name,
                    taken.bytes,
                    artifact::STORE
                ));
                None
            }
            Err(why) => Some(format!("cibox: {why}")),
        }
    }

    /// Removes `b`'s artifact (an earlier run's, or one it did not earn), saying why
    /// it could not be removed when it could not.
    pub(super) fn forget_outputs(&self, b: &BatchPlan) {
        if b.outputs.is_empty() {
            return;
        }
        if let Err(e) = artifact::forget(&self.reports, &b.name) {
            crate::console::warn(format!(
                "batch {}: its earlier artifact in {}/{} could not be removed: {e}",
                b.name,
                self.plan.reports.display(),
                artifact::STORE
            ));
        }
    }
}
