//! The engine's create request for a batch's container: what the locked-down default
//! and the batch's loosenings become in the engine's terms.

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, DeviceMapping, DeviceRequest, HostConfig, Mount, MountBindOptions,
    MountType, MountVolumeOptions, MountVolumeOptionsDriverConfig, ResourcesUlimits,
};

use crate::gpu::pool::PoolGpu;
use crate::labels::LABEL_GPUS;
use crate::manifest::{GpuDriver, Ipc, Network};
use crate::plan::container::ContainerPlan;
use crate::plan::container::script::KEEPER;

impl ContainerPlan {
    /// The engine's create request, with a device request for exactly `gpus` and
    /// `masks` (read-only binds over files of the source) after the source's bind;
    /// `recursive_read_only` when the engine can make a bind read-only all the way down.
    pub fn body(
        &self,
        gpus: &[PoolGpu],
        masks: &[String],
        recursive_read_only: bool,
    ) -> ContainerCreateBody {
        let mut labels = self.labels.clone();
        let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        labels.insert(LABEL_GPUS.to_string(), uuids.join(","));
        let mut env = self.env.clone();
        if !gpus.is_empty() {
            // The lease's UUIDs, once: nothing else decides which GPUs a batch sees.
            env.retain(|e| !e.starts_with("CUDA_VISIBLE_DEVICES="));
            env.push(format!("CUDA_VISIBLE_DEVICES={}", uuids.join(",")));
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
            host_config: Some(self.host_config(&uuids, masks, recursive_read_only)),
            ..Default::default()
        }
    }

    /// Limits, mounts, capabilities, namespaces and devices.
    fn host_config(
        &self,
        uuids: &[String],
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
            devices: (!self.devices.is_empty()).then(|| {
                self.devices
                    .iter()
                    .map(|d| DeviceMapping {
                        path_on_host: Some(d.display().to_string()),
                        path_in_container: Some(d.display().to_string()),
                        cgroup_permissions: Some("rwm".into()),
                    })
                    .collect()
            }),
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
            device_requests: self.device_requests(uuids),
            ..Default::default()
        }
    }

    /// A request for exactly these GPUs, by UUID, through the batch's GPU driver.
    fn device_requests(&self, uuids: &[String]) -> Option<Vec<DeviceRequest>> {
        (!uuids.is_empty()).then(|| {
            vec![match self.driver {
                GpuDriver::Nvidia => DeviceRequest {
                    driver: Some("nvidia".into()),
                    device_ids: Some(uuids.to_vec()),
                    capabilities: Some(vec![vec!["gpu".into()]]),
                    ..Default::default()
                },
                GpuDriver::Cdi => DeviceRequest {
                    driver: Some("cdi".into()),
                    device_ids: Some(
                        uuids
                            .iter()
                            .map(|u| format!("nvidia.com/gpu={u}"))
                            .collect(),
                    ),
                    ..Default::default()
                },
            }]
        })
    }

    /// A memory-backed volume of `size` bytes at `target`, the batch's, of `mode`.
    /// `/work` and `/reports` are volumes, not plain tmpfs mounts: the engine's archive
    /// API sees volumes (not tmpfs mounts), so cibox can put the source into `/work` and
    /// copy `/reports` out while the container lives; anonymous, they go with it.
    pub(super) fn tmpfs_volume(&self, target: &str, size: u64, mode: &str, extra: &str) -> Mount {
        let (uid, gid) = (self.uid, self.gid);
        local_volume(
            target,
            "tmpfs",
            format!("size={size},uid={uid},gid={gid},mode={mode},nosuid,nodev{extra}"),
        )
    }

    /// The batch's host mounts, by the path the host check resolved. Read-only all the
    /// way down where the engine can (API 1.44+); before that a read-only bind leaves
    /// the mounts below it writable, so only the folder itself is bound (and a run
    /// refuses sources holding mounts: they would be missing).
    fn host_mounts(&self, recursive_read_only: bool) -> impl Iterator<Item = Mount> + '_ {
        self.mounts.iter().map(move |m| Mount {
            typ: Some(MountType::BIND),
            source: Some(m.host_path.display().to_string()),
            target: Some(m.target.clone()),
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
        })
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
