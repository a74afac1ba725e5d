//! The labels cibox puts on its containers (docs/interface.md §6): how a sweep finds a
//! dead run's containers and how a probe learns which GPUs running ones hold. A leaf.

pub const LABEL_OWNER: &str = "org.cibox.owner";
pub const LABEL_PROJECT: &str = "org.cibox.project";
pub const LABEL_SCOPE: &str = "org.cibox.scope";
pub const LABEL_RUN: &str = "org.cibox.run";
pub const LABEL_BATCH: &str = "org.cibox.batch";
pub const LABEL_SOURCE: &str = "org.cibox.source";
pub const LABEL_GPUS: &str = "org.cibox.gpus";
/// The host whose cibox made the container (docs/interface.md §6): only
/// there can a sweep tell whether its run is alive.
pub const LABEL_HOST: &str = "org.cibox.host";
/// The lock dir whose `runs/` holds the run's lock (docs/interface.md §6): a sweep
/// started with another `gpu.lock_dir` still judges the run where it lives.
pub const LABEL_LOCK_DIR: &str = "org.cibox.lockdir";
/// On a batch's own anonymous volumes (`/work`, `/reports`): the name of the container
/// they belong to (docs/interface.md §6), by which cibox finds them when someone else
/// removed that container without its volumes. No other label: they are no run's to
/// sweep.
pub const LABEL_VOLUME_OF: &str = "org.cibox.volume-of";
