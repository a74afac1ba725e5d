//! The run's snapshots of the source: for each user that two or more batches of the
//! run run as, the source shipped once into a volume (see
//! [`crate::plan::container::snapshot`]). Each of those batches gets it in `/work` as
//! an overlay over the snapshot, its writes in a tmpfs of its own (see
//! [`crate::run::work_layer`]); where the host cannot do that (cibox is not root, the
//! engine does not see cibox's mounts), the batch copies the snapshot into its own
//! memory-backed `/work`. A batch alone in its user gets the source through the archive
//! API, as before. Made before the first batch starts, removed once the last has ended
//! (a dead run's are swept).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::engine::ContainerEngine;
use crate::plan::RunPlan;
use crate::plan::container::snapshot::SNAPSHOT_PATH;
use crate::run::source::SourceSet;
use crate::run::work_layer::{self, RunLayers, WorkLayer};

/// How a batch gets the source into `/work`.
#[derive(Debug)]
pub enum Work<'a> {
    /// An overlay over the run's snapshot (at `lower` on the engine's host; in
    /// `volume`, where one holds it), its writes into `layer`.
    Overlay {
        volume: Option<&'a str>,
        lower: &'a str,
        layer: WorkLayer,
    },
    /// `layer`, the source written into it by cibox (in `took`), for a batch alone in
    /// its user: an overlay whose lower layer is empty.
    Filled {
        layer: WorkLayer,
        took: std::time::Duration,
    },
    /// The run's snapshot `volume`, copied into `/work` by the batch itself.
    Copy { volume: &'a str },
    /// Its own copy, through the engine's archive API.
    Upload,
}

/// A run's snapshot of the source for one user.
#[derive(Debug)]
struct Snapshot {
    /// The engine's volume that holds it, if one does (else it lies on this host).
    volume: Option<String>,
    /// Where the engine's host keeps it, when an overlay can be laid over it.
    lower: Option<String>,
}

/// The run's snapshot volumes, by the uid:gid their batches run as.
#[derive(Debug, Default)]
pub struct Snapshots {
    volumes: HashMap<(u32, u32), Snapshot>,
    /// The run's upper layers' folder; `None`, or the overlays refused, when its
    /// batches copy the snapshot instead (see [`Snapshots::refuse_overlays`]).
    layers: Option<RunLayers>,
    refused: Mutex<Option<String>>,
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
        let shared = by_user.values().any(|n| *n > 1);
        // Where cibox may mount on the engine's host: the run's folder of layers.
        let layers = if engine.on_this_host() {
            RunLayers::open(std::path::Path::new(work_layer::BASE), &plan.run_id)
        } else {
            Err(std::io::Error::other(
                "the engine is not reached through a socket of this host",
            ))
        };
        match layers {
            Ok(l) => snapshots.layers = Some(l),
            Err(e) if shared => snapshots.refuse_overlays(
                format!("no upper layers under {} ({e})", work_layer::BASE),
                said,
            ),
            Err(_) => {}
        }
        for b in &plan.batches {
            if by_user.get(&b.user).copied().unwrap_or(0) < 2
                || snapshots.volumes.contains_key(&b.user)
            {
                continue;
            }
            if let Some(s) = snapshots.on_host(b.user, source, said) {
                snapshots.volumes.insert(b.user, s);
                continue;
            }
            if let Some(s) = snapshots.in_volume(engine, b, source, said) {
                snapshots.volumes.insert(b.user, s);
            }
        }
        snapshots
    }

    /// The snapshot for `user` written once by cibox into a tmpfs of this host, the
    /// lower layer of its batches' overlays: no archive through the engine, no volume
    /// to fill and empty. `None` where the run has no folder of layers, or it failed
    /// (said).
    fn on_host(
        &self,
        user: (u32, u32),
        source: &SourceSet,
        said: &mut dyn FnMut(String),
    ) -> Option<Snapshot> {
        let layers = self.layers.as_ref()?;
        let began = std::time::Instant::now();
        match layers.lower(
            user.0,
            user.1,
            source.archive(user.0, user.1),
            work_layer::MAX_LOWER,
        ) {
            Ok(at) => {
                said(format!(
                    "the source ({} files and folders) written once by cibox into a tmpfs of this host ({at}) in {}, beneath /work of the batches running as {}:{}",
                    source.count(),
                    crate::units::human(began.elapsed()),
                    user.0,
                    user.1
                ));
                Some(Snapshot {
                    volume: None,
                    lower: Some(at),
                })
            }
            Err(e) => {
                said(format!(
                    "could not write the source once into a tmpfs of this host ({e}); it ships into a volume of the engine"
                ));
                None
            }
        }
    }

    /// The snapshot for `b`'s user shipped once into a volume of the engine, lower
    /// layer of the overlays where the run has a folder of layers (else copied by each
    /// batch). `None` where it cannot be made (said): its batches get their own copies.
    fn in_volume(
        &self,
        engine: &dyn ContainerEngine,
        b: &crate::plan::BatchPlan,
        source: &SourceSet,
        said: &mut dyn FnMut(String),
    ) -> Option<Snapshot> {
        let (volume, labels) = b.container.snapshot_volume();
        let made = engine.create_volume(&volume, labels).and_then(|lower| {
            let (name, body) = b.container.snapshot_filler(&volume);
            let filler = engine.create_container(&name, body)?;
            let copied = engine.upload(&filler, SNAPSHOT_PATH, source.archive(b.user.0, b.user.1));
            let removed = engine.remove_container(&filler);
            copied.and(removed).map(|()| lower)
        });
        let lower = match made {
            Ok(lower) => lower,
            Err(e) => {
                let _ = engine.remove_volume(&volume);
                said(format!(
                    "could not ship the source once for the run ({e}); each batch gets its own copy"
                ));
                return None;
            }
        };
        said(format!(
            "the source ({} files and folders) shipped once into volume {volume}, for the batches running as {}:{}",
            source.count(),
            b.user.0,
            b.user.1
        ));
        let lower = if self.layers.is_none() {
            None
        } else if work_layer::plain_path(&lower) {
            Some(lower)
        } else {
            said(format!(
                "the engine keeps the snapshot for {}:{} at {lower:?}, which an overlay cannot name: its batches copy it into /work",
                b.user.0, b.user.1
            ));
            None
        };
        Some(Snapshot {
            volume: Some(volume),
            lower,
        })
    }

    /// From now on the run's batches copy the snapshot into `/work`: the overlays
    /// cannot be had, for `why` (said once).
    pub fn refuse_overlays(&self, why: String, said: &mut dyn FnMut(String)) {
        let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        if refused.is_none() {
            said(format!(
                "batches get a copy of the source in /work, not an overlay: {why}"
            ));
            *refused = Some(why);
        }
    }

    /// How a batch running as `user` gets `source` in a `/work` of `size` bytes. An
    /// upper layer that cannot be mounted refuses the overlays for the run.
    pub fn work(
        &self,
        user: (u32, u32),
        size: u64,
        source: &SourceSet,
        said: &mut dyn FnMut(String),
    ) -> Work<'_> {
        let refused = self
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        let layers = self.layers.as_ref().filter(|_| !refused);
        let Some(s) = self.volumes.get(&user) else {
            return match layers {
                Some(layers) => Self::filled(layers, user, size, source, said),
                None => Work::Upload,
            };
        };
        let copy = match &s.volume {
            Some(volume) => Work::Copy { volume },
            None => Work::Upload,
        };
        let (Some(layers), Some(lower)) = (layers, &s.lower) else {
            return copy;
        };
        match layers.layer(size, user.0, user.1) {
            Ok(layer) => Work::Overlay {
                volume: s.volume.as_deref(),
                lower,
                layer,
            },
            Err(e) => {
                self.refuse_overlays(format!("cannot mount an upper layer ({e})"), said);
                copy
            }
        }
    }

    /// An upper layer holding `source`, written by cibox: no archive through the
    /// engine. One that cannot be made is said, and the batch gets the source through
    /// the engine.
    fn filled<'a>(
        layers: &RunLayers,
        user: (u32, u32),
        size: u64,
        source: &SourceSet,
        said: &mut dyn FnMut(String),
    ) -> Work<'a> {
        let began = std::time::Instant::now();
        let filled = layers.layer(size, user.0, user.1).and_then(|layer| {
            layer.fill(source.archive(user.0, user.1))?;
            Ok(layer)
        });
        match filled {
            Ok(layer) => Work::Filled {
                layer,
                took: began.elapsed(),
            },
            Err(e) => {
                said(format!(
                    "could not write the source into a batch's upper layer ({e}): it goes through the engine"
                ));
                Work::Upload
            }
        }
    }

    /// Removes the volumes; one a batch's container still holds (it could not be
    /// removed) stays for a later sweep. The run's folder of upper layers goes when
    /// dropped.
    pub fn remove(&self, engine: &dyn ContainerEngine) {
        for volume in self.volumes.values().filter_map(|s| s.volume.as_ref()) {
            let _ = engine.remove_volume(volume);
        }
    }
}
