//! The run's snapshot of the source: shipped once per run into a volume of the engine
//! (one per user the batches run as), mounted read-only into each batch's container,
//! whose script copies it into its own `/work` (memory-backed, bounded, the batch's):
//! per batch a copy inside the container, not the engine's archive API again.
//!
//! The volume and the short-lived container that fills it carry the run's labels and
//! a name no batch's container can have (`.source` cannot start a batch name), so a
//! sweep removes them with the rest of a dead run.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType, MountVolumeOptions};

use super::ContainerPlan;
pub use super::script::{FROM_SNAPSHOT, IN_WORK, SNAPSHOT_PATH};
use crate::labels::{LABEL_BATCH, LABEL_GPUS};

impl ContainerPlan {
    /// The name of the run's snapshot volume for this batch's user, and its labels (the
    /// run's, without a batch's).
    pub fn snapshot_volume(&self) -> (String, HashMap<String, String>) {
        let name = format!(
            "{}.source-{}-{}-{}",
            self.run_prefix, self.run8, self.uid, self.gid
        );
        (name, self.run_labels())
    }

    /// The container that fills snapshot `volume` (created, never started; the source
    /// goes in through the archive API) and its name.
    pub fn snapshot_filler(&self, volume: &str) -> (String, ContainerCreateBody) {
        let name = format!("{volume}-fill");
        let body = ContainerCreateBody {
            image: Some(self.image.clone()),
            user: Some("0:0".into()),
            entrypoint: Some(vec!["/bin/sh".into()]),
            cmd: Some(vec!["-c".into(), "exit 0".into()]),
            network_disabled: Some(true),
            labels: Some(self.run_labels()),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                mounts: Some(vec![Mount {
                    typ: Some(MountType::VOLUME),
                    source: Some(volume.to_string()),
                    target: Some(SNAPSHOT_PATH.to_string()),
                    volume_options: Some(MountVolumeOptions {
                        no_copy: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                cap_drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        (name, body)
    }

    /// The run's labels, without what only a batch's container says.
    fn run_labels(&self) -> HashMap<String, String> {
        self.labels
            .iter()
            .filter(|(k, _)| k.as_str() != LABEL_BATCH && k.as_str() != LABEL_GPUS)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Mounts snapshot `volume` read-only at [`SNAPSHOT_PATH`] in a batch's container.
pub fn mount_snapshot(body: &mut ContainerCreateBody, volume: &str) {
    let host_config = body.host_config.get_or_insert_with(HostConfig::default);
    host_config.mounts.get_or_insert_with(Vec::new).push(Mount {
        typ: Some(MountType::VOLUME),
        source: Some(volume.to_string()),
        target: Some(SNAPSHOT_PATH.to_string()),
        read_only: Some(true),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    });
}

/// Makes `/work` of a batch's container an overlay: the run's snapshot at `lower` (a
/// folder of the engine's host) read-only beneath, the batch's writes into `upper`
/// (`work` is the overlay's own), both on a bounded tmpfs of the host's. In place of
/// the memory-backed volume `/work` is otherwise; `nosuid` and `nodev` as that one.
pub fn mount_overlay(body: &mut ContainerCreateBody, lower: &str, upper: &str, work: &str) {
    let host_config = body.host_config.get_or_insert_with(HostConfig::default);
    let mounts = host_config.mounts.get_or_insert_with(Vec::new);
    // Its labels, the batch's, kept.
    let labels = mounts
        .iter()
        .find(|m| m.target.as_deref() == Some("/work"))
        .and_then(|m| m.volume_options.as_ref()?.labels.clone());
    mounts.retain(|m| m.target.as_deref() != Some("/work"));
    let mut overlay = super::caches::overlay_mount("/work", lower, upper, work, false);
    if let Some(o) = overlay.volume_options.as_mut() {
        o.labels = labels;
    }
    mounts.push(overlay);
}
