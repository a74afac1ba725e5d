//! The run's snapshots of the source: for each user that two or more batches of the
//! run run as, the source shipped once into a volume (see
//! [`crate::plan::container::snapshot`]) that each of those batches copies into its own
//! `/work`; a batch alone in its user gets the source through the archive API, as
//! before. Made before the first batch starts, removed once the last has ended (a
//! dead run's are swept).

use std::collections::HashMap;

use crate::engine::ContainerEngine;
use crate::plan::RunPlan;
use crate::plan::container::snapshot::SNAPSHOT_PATH;
use crate::run::source::SourceSet;

/// The run's snapshot volumes, by the uid:gid their batches run as.
#[derive(Debug, Default)]
pub struct Snapshots {
    volumes: HashMap<(u32, u32), String>,
}

impl Snapshots {
    /// Ships `source` once for each user shared by two batches or more of `plan`
    /// (never on a Slurm node, which runs one batch). A snapshot that cannot be made
    /// is left out, with why: its batches get the source as a lone batch does.
    pub fn make(
        engine: &dyn ContainerEngine,
        plan: &RunPlan,
        source: &SourceSet,
        said: &mut dyn FnMut(String),
    ) -> Snapshots {
        let mut snapshots = Snapshots::default();
        if plan.node.is_some() {
            return snapshots;
        }
        let mut by_user: HashMap<(u32, u32), usize> = HashMap::new();
        for b in &plan.batches {
            *by_user.entry(b.user).or_default() += 1;
        }
        for b in &plan.batches {
            if by_user.get(&b.user).copied().unwrap_or(0) < 2
                || snapshots.volumes.contains_key(&b.user)
            {
                continue;
            }
            let (volume, labels) = b.container.snapshot_volume();
            let made = engine.create_volume(&volume, labels).and_then(|()| {
                let (name, body) = b.container.snapshot_filler(&volume);
                let filler = engine.create_container(&name, body)?;
                let copied =
                    engine.upload(&filler, SNAPSHOT_PATH, source.archive(b.user.0, b.user.1));
                let removed = engine.remove_container(&filler);
                copied.and(removed)
            });
            match made {
                Ok(()) => {
                    said(format!(
                        "the source ({} files and folders) shipped once into volume {volume}, for the batches running as {}:{}",
                        source.count(),
                        b.user.0,
                        b.user.1
                    ));
                    snapshots.volumes.insert(b.user, volume);
                }
                Err(e) => {
                    let _ = engine.remove_volume(&volume);
                    said(format!(
                        "could not ship the source once for the run ({e}); each batch gets its own copy"
                    ));
                }
            }
        }
        snapshots
    }

    /// The snapshot volume of the batches running as `user`, if there is one.
    pub fn of(&self, user: (u32, u32)) -> Option<&str> {
        self.volumes.get(&user).map(String::as_str)
    }

    /// Removes the volumes; one a batch's container still holds (it could not be
    /// removed) stays for a later sweep.
    pub fn remove(&self, engine: &dyn ContainerEngine) {
        for v in self.volumes.values() {
            let _ = engine.remove_volume(v);
        }
    }
}
