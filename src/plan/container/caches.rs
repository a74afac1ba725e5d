//! A batch's caches in the engine's terms: each an overlay volume over the cache's
//! current generation, and, for a run the host does not trust, a holder container whose
//! memory-backed volumes are the private layers the overlays write into.
//!
//! Why a holder: an overlay's upper folder must exist on the engine's host when the
//! batch's container starts, and must be bounded. A volume of the batch's own
//! container would do, but the engine mounts a container's volumes in no set order. The
//! holder is locked down like a batch (no network, no capability, a read-only root), runs
//! nothing but the keeper, and goes with the batch.

use bollard::models::{ContainerCreateBody, HostConfig, Mount};

use crate::plan::container::ContainerPlan;
use crate::plan::container::script::KEEPER;

/// What the holder may use: it runs the batch's image (a pull request's, it may be) as
/// root, and needs only a shell that waits. The pages of the private layers are the
/// batch's: charged to the batch's memory, which writes them.
const HOLDER_MEMORY: i64 = 32 << 20;
const HOLDER_NANO_CPUS: i64 = 100_000_000;

/// Where the holder keeps cache `name`'s private layer.
pub fn private_dir(name: &str) -> String {
    format!("/private/{name}")
}

impl ContainerPlan {
    /// The holder's name: the batch's, marked.
    pub fn holder_name(&self) -> String {
        format!("{}-caches", self.name)
    }

    /// The holder of private layers of `size` bytes each for `caches`.
    pub fn holder_body(&self, caches: &[String], size: u64) -> ContainerCreateBody {
        let mounts = caches
            .iter()
            .map(|name| self.tmpfs_volume(&private_dir(name), size, "0755", ""))
            .collect();
        ContainerCreateBody {
            image: Some(self.image.clone()),
            user: Some("0:0".into()),
            entrypoint: Some(vec!["/bin/sh".into(), "-c".into()]),
            cmd: Some(vec![KEEPER.into()]),
            open_stdin: Some(true),
            working_dir: Some("/".into()),
            labels: Some(self.labels.clone()),
            host_config: Some(HostConfig {
                mounts: Some(mounts),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                readonly_rootfs: Some(true),
                init: Some(true),
                pids_limit: Some(16),
                memory: Some(HOLDER_MEMORY),
                memory_swap: Some(HOLDER_MEMORY),
                nano_cpus: Some(HOLDER_NANO_CPUS),
                network_mode: Some("none".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// An overlay of a cache at `target`: `lower` read-only beneath, writes into `upper`
/// (`work` is the overlay's own). `userxattr`: the layer is read back by cibox, which
/// needs the overlay's marks where an unprivileged process can read them. `nosuid` and
/// `nodev`, as the batch's other writable folders: a cache holds what batches wrote.
pub fn overlay_mount(target: &str, lower: &str, upper: &str, work: &str, userxattr: bool) -> Mount {
    let mut o = format!("lowerdir={lower},upperdir={upper},workdir={work},nosuid,nodev");
    if userxattr {
        o.push_str(",userxattr");
    }
    crate::plan::container::body::local_volume(target, "overlay", o)
}
