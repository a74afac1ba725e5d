//! The engine's create request for a batch's container: what the locked-down default
//! and the batch's loosenings become in the engine's terms.

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, DeviceMapping, DeviceRequest, HostConfig, Mount, MountBindOptions,
    MountType, MountVolumeOptions, MountVolumeOptionsDriverConfig, ResourcesUlimits,
};

use crate::gpu::vendor::{self, Handover};
use crate::labels::LABEL_GPUS;
use crate::manifest::{Ipc, Network};
use crate::plan::container::ContainerPlan;
use crate::plan::container::script::KEEPER;

impl ContainerPlan {
    /// The engine's create request, with exactly the leased units `gpus` hands over
    /// (see [`crate::gpu::vendor`]), and `masks` (read-only binds over files of the
    /// source) after the source's bind; `recursive_read_only` when the engine can make
    /// a bind read-only all the way down.
    pub fn body(
        &self,
        gpus: &Handover,
        masks: &[String],
        recursive_read_only: bool,
    ) -> ContainerCreateBody {
        let mut labels = self.labels.clone();
        labels.insert(LABEL_GPUS.to_string(), gpus.ids.join(","));
        let mut env = self.env.clone();
        if !gpus.ids.is_empty() {
            // The lease's units, once: nothing else decides which GPUs a batch sees.
            env.retain(|e| {
                !vendor::VISIBILITY_VARIABLES
                    .iter()
                    .any(|v| e.split_once('=').is_some_and(|(k, _)| k == *v))
            });
            env.extend(gpus.env.iter().map(|(k, v)| format!("{k}={v}")));
        }
        ContainerCreateBody {
            image: Some(self.image.clone()),
            // The container's first process is a keeper that waits, as root (so the
            // batch, another uid without capabilities, cannot signal it): the batch
            // runs beside it (an exec as `user`), and the container outlives the batch
            // until cibox has copied `/reports` out.
            user: Some("0:0".into()),
            env: Some(env),
            entrypoint: Some(vec!["/bin/sh".into(), "-c".into()]),
            cmd: Some(vec![KEEPER.into()]),
            open_stdin: Some(true),
            working_dir: Some("/".into()),
            labels: Some(labels),
            host_config: Some(self.host_config(gpus, masks, recursive_read_only)),
            ..Default::default()
        }
    }

    /// Limits, mounts, capabilities, namespaces and devices.
    fn host_config(
        &self,
        gpus: &Handover,
        masks: &[String],
        recursive_read_only: bool,
    ) -> HostConfig {
        let (uid, gid) = (self.uid, self.gid);
        // Memory-backed and sized: what a batch can grow is bounded (and charged to its
        // memory limit), and owned by the batch whatever the image's folders say.
        let tmpfs = |size: u64, exec: &str| {
            format!("rw,{exec},nosuid,nodev,size={size},uid={uid},gid={gid},mode=1777")
        };
        let mut mounts = vec![
            self.tmpfs_volume("/work", self.disk, "0755", ""),
            self.tmpfs_volume("/reports", self.reports_size, "0700", ",noexec"),
        ];
        mounts.extend(self.host_mounts(recursive_read_only));
        // The GPU driver's files its vendor's runtime binds (Ascend's user space),
        // read-only as the batch's own host mounts are.
        mounts.extend(gpus.mounts.iter().map(|m| {
            read_only_bind(
                &m.host.display().to_string(),
                &m.container,
                recursive_read_only,
            )
        }));
        let ulimits: Vec<ResourcesUlimits> = self
            .ulimits
            .iter()
            .map(|(name, l)| ResourcesUlimits {
                name: Some(name.clone()),
                soft: Some(l.soft),
                hard: Some(l.hard),
            })
            .collect();
        HostConfig {
            binds: Some(self.binds.iter().chain(masks).cloned().collect()),
            mounts: Some(mounts),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_string(),
                tmpfs(self.disk, "exec"),
            )])),
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: (!self.cap_add.is_empty())
                .then(|| self.cap_add.iter().map(|c| format!("CAP_{c}")).collect()),
            ipc_mode: Some(
                match self.ipc {
                    Ipc::Private => "private",
                    Ipc::Host => "host",
                }
                .into(),
            ),
            ulimits: (!ulimits.is_empty()).then_some(ulimits),
            security_opt: Some(
                std::iter::once("no-new-privileges".to_string())
                    .chain(self.seccomp.clone())
                    .collect(),
            ),
            // The batch's own devices, then its GPUs' (a vendor's that go by device
            // file, exactly those of the leased units).
            devices: (!self.devices.is_empty() || !gpus.devices.is_empty()).then(|| {
                self.devices
                    .iter()
                    .map(|d| (d.display().to_string(), d.display().to_string()))
                    .chain(
                        gpus.devices
                            .iter()
                            .map(|d| (d.host.display().to_string(), d.container.clone())),
                    )
                    .map(|(host, container)| DeviceMapping {
                        path_on_host: Some(host),
                        path_in_container: Some(container),
                        cgroup_permissions: Some("rwm".into()),
                    })
                    .collect()
            }),
            group_add: (!gpus.groups.is_empty())
                .then(|| gpus.groups.iter().map(u32::to_string).collect()),
            init: Some(true),
            pids_limit: Some(self.pids),
            nano_cpus: self.m_cpus.map(|c| (c * 1e9) as i64),
            memory: self.memory,
            // Swap adds nothing: memory+swap equals memory.
            memory_swap: self.memory,
            shm_size: Some(self.shm),
            network_mode: Some(
                match self.network {
                    Network::None => "none",
                    Network::Bridge => "bridge",
                    Network::Host => "host",
                }
                .into(),
            ),
            device_requests: (!gpus.requests.is_empty()).then(|| {
                gpus.requests
                    .iter()
                    .map(|r| DeviceRequest {
                        driver: Some(r.driver.clone()),
                        device_ids: Some(r.device_ids.clone()),
                        capabilities: (!r.capabilities.is_empty()).then(|| r.capabilities.clone()),
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        }
    }

    /// A memory-backed volume of `size` bytes at `target`, the batch's, of `mode`.
    /// `/work` and `/reports` are volumes, not plain tmpfs mounts: the engine's archive
    /// API sees volumes (not tmpfs mounts), so cibox can put the source into `/work` and
    /// copy `/reports` out while the container lives; anonymous, they go with it. They
    /// carry the name of the batch's container.
    pub(super) fn tmpfs_volume(&self, target: &str, size: u64, mode: &str, extra: &str) -> Mount {
        let (uid, gid) = (self.uid, self.gid);
        let mut mount = local_volume(
            target,
            "tmpfs",
            format!("size={size},uid={uid},gid={gid},mode={mode},nosuid,nodev{extra}"),
        );
        // Whose they are: a container removed by someone else without its volumes
        // leaves them, and cibox finds them so.
        if let Some(o) = mount.volume_options.as_mut() {
            o.labels = Some(HashMap::from([(
                crate::labels::LABEL_VOLUME_OF.to_string(),
                self.name.clone(),
            )]));
        }
        mount
    }

    /// The batch's host mounts, by the path the host check resolved. Read-only all the
    /// way down where the engine can (API 1.44+); before that a read-only bind leaves
    /// the mounts below it writable, so only the folder itself is bound (and a run
    /// refuses sources holding mounts: they would be missing).
    fn host_mounts(&self, recursive_read_only: bool) -> impl Iterator<Item = Mount> + '_ {
        self.mounts.iter().map(move |m| {
            read_only_bind(
                &m.host_path.display().to_string(),
                &m.target,
                recursive_read_only,
            )
        })
    }
}

/// A read-only bind of `source` at `target`: all the way down where the engine can.
pub fn read_only_bind(source: &str, target: &str, recursive_read_only: bool) -> Mount {
    Mount {
        typ: Some(MountType::BIND),
        source: Some(source.to_string()),
        target: Some(target.to_string()),
        read_only: Some(true),
        bind_options: Some(if recursive_read_only {
            MountBindOptions {
                read_only_force_recursive: Some(true),
                ..Default::default()
            }
        } else {
            MountBindOptions {
                non_recursive: Some(true),
                ..Default::default()
            }
        }),
        ..Default::default()
    }
}

/// An anonymous volume of the engine's `local` driver at `target`: a mount of `kind`
/// (`tmpfs`, `overlay`) with options `o`, made when the container starts and gone with
/// it.
pub(super) fn local_volume(target: &str, kind: &str, o: String) -> Mount {
    Mount {
        typ: Some(MountType::VOLUME),
        target: Some(target.into()),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            driver_config: Some(MountVolumeOptionsDriverConfig {
                name: Some("local".into()),
                options: Some(HashMap::from([
                    ("type".to_string(), kind.to_string()),
                    ("device".to_string(), kind.to_string()),
                    ("o".to_string(), o),
                ])),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
