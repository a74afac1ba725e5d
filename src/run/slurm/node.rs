//! What the submitter tells a node about the batch it runs ([`NodeJob`], one argument
//! of `cibox __slurm-node`), and how the node turns that and its allocation into the
//! same [`RunRequest`] a local run of the batch would make.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::host::{self, HostPolicy};
use crate::manifest::Manifest;
use crate::plan::run_plan::SourceInfo;
use crate::plan::run_plan::{NodeRole, RunPlan, RunRequest};
use crate::run::error::RunError;
use crate::slurm::alloc::{Allocation, Rendezvous};

/// How long a node waits for the GPUs Slurm allocated: Slurm counts them free, so
/// only a batch of this host just ending (its container being removed) or something
/// outside Slurm can hold them; past this the batch fails closed.
pub const NODE_LEASE_WAIT: Duration = Duration::from_secs(10);

/// One batch of a run, as the submitter planned it: what a node needs to plan it again.
/// The source, the reports folder and the manifest are on a file system the nodes
/// share with the submitter, at the same paths.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeJob {
    /// The manifest (absolute), and the digest the submitter read.
    pub manifest: PathBuf,
    pub manifest_digest: String,
    pub run_id: String,
    pub batch: String,
    pub layer: Option<String>,
    pub fast: bool,
    /// Each image the batch may use, by name: the ID the submitter resolved.
    pub images: BTreeMap<String, String>,
    pub source: PathBuf,
    pub source_info: SourceInfo,
    pub reports: PathBuf,
    pub scope: String,
    /// A batch `changed run` made: its test file and GPUs (`changed.run` makes it again).
    pub changed_file: Option<String>,
    pub gpus: u32,
    /// Why the batch's cache writes stay private (the submitter's workflow event).
    #[serde(default)]
    pub private_caches: Option<String>,
    /// The pull request whose cache scope the batch uses (the submitter read it from
    /// its workflow's event).
    #[serde(default)]
    pub pull_request: Option<u64>,
    /// Which attempt at the batch this job is (1-based): the submitter runs a batch
    /// again, as a new job, when its retries say so.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
}

fn first_attempt() -> u32 {
    1
}

impl NodeJob {
    /// The node job of attempt `attempt` at batch `index` of `plan`.
    pub fn of(plan: &RunPlan, index: usize, attempt: u32) -> NodeJob {
        let b = &plan.batches[index];
        NodeJob {
            manifest: plan.manifest.path.clone(),
            manifest_digest: plan.manifest.digest.clone(),
            run_id: plan.run_id.clone(),
            batch: b.name.clone(),
            layer: plan.layer.clone(),
            fast: plan.fast,
            images: plan
                .images
                .iter()
                .map(|(n, id)| (n.clone(), id.to_string()))
                .collect(),
            source: plan.source.clone(),
            source_info: plan.source_info.clone(),
            reports: plan.reports.clone(),
            scope: plan.scope.clone(),
            changed_file: b.changed_file.clone(),
            gpus: b.gpus,
            private_caches: plan.private_caches.clone(),
            pull_request: plan.pull_request,
            attempt,
        }
    }

    /// The manifest the submitter planned with (the node's policy's GPU facts laid
    /// over it), refused when it changed since.
    pub fn manifest(&self, policy: &HostPolicy) -> Result<Manifest, crate::error::Error> {
        let mut m = Manifest::load(&self.manifest)?;
        host::gpu::settle(policy, &mut m.gpu)?;
        if m.digest != self.manifest_digest {
            return Err(RunError::ManifestChanged {
                manifest: self.manifest.clone(),
                then: self.manifest_digest.clone(),
                now: m.digest,
            }
            .into());
        }
        if let Some(file) = &self.changed_file
            && !m.batches.contains_key(&self.batch)
        {
            let template = m
                .changed
                .as_ref()
                .and_then(|c| c.run.as_ref())
                .ok_or_else(|| RunError::NoChangedRun {
                    manifest: self.manifest.clone(),
                    batch: self.batch.clone(),
                })?;
            let batch = template.batch_for(file, self.gpus);
            m.batches.insert(self.batch.clone(), batch);
        }
        Ok(m)
    }

    /// The request of this batch on this node: the submitter's choices, the GPUs and
    /// rank Slurm allocated, and the rendezvous of a batch on several nodes.
    pub fn request(
        &self,
        m: &Manifest,
        alloc: &Allocation,
    ) -> Result<RunRequest, crate::error::Error> {
        let gpus = m.batches.get(&self.batch).map_or(self.gpus, |b| b.gpus);
        let rendezvous = if alloc.nodes > 1 {
            let secret = Rendezvous::from_vars(|n| std::env::var(n).ok())?;
            alloc.rendezvous(gpus, &secret)?
        } else {
            BTreeMap::new()
        };
        Ok(RunRequest {
            names: vec![self.batch.clone()],
            layer: self.layer.clone(),
            fast: Some(self.fast),
            image: None,
            image_ids: self.images.clone(),
            source: self.source.clone(),
            source_info: self.source_info.clone(),
            reports: self.reports.clone(),
            scope: self.scope.clone(),
            wait: Some(NODE_LEASE_WAIT),
            parallel: false,
            node: Some(NodeRole {
                run_id: self.run_id.clone(),
                job_id: alloc.job_id.clone(),
                node: alloc.node.clone(),
                rank: alloc.rank,
                nodes: alloc.nodes,
                gpus: alloc.gpus.clone(),
                gpu_ids: alloc.gpu_ids.clone(),
                rendezvous,
                attempt: self.attempt,
            }),
            // The submitter's word, or the node's own environment's.
            // A pull request's run: the submitter read its number from its event.
            private_caches: match self.pull_request {
                Some(_) => self.private_caches.clone(),
                None => self
                    .private_caches
                    .clone()
                    .or_else(crate::github::untrusted_event),
            },
            pull_request: self.pull_request,
            // The submitter decides whether a batch runs again (a new job, maybe on
            // other nodes): the node runs this one attempt.
            retries: Some(0),
            ..RunRequest::default()
        })
    }
}
