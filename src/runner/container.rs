//! The container a batch runs in: name, labels, environment, limits, mounts.
//!
//! Locked down: the invoking uid:gid (never root: 65534:65534 when cibox runs as root),
//! all capabilities dropped, no-new-privileges, an init process, pids/cpu/memory/shm
//! limits (swap adds nothing), network `none` unless the manifest says otherwise, the
//! source read-only at `/src` (its git credentials masked), only `/reports` writable
//! from the host, no engine socket, no host variable but `pass_env`.
//!
//! What a manifest may loosen, each recorded in `result.json`: read-only host mounts,
//! the host's IPC namespace, ulimits, three capabilities given back, and the user
//! (`root` in the container still has no other capability and no-new-privileges).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountBindOptions, MountType,
    MountVolumeOptions, MountVolumeOptionsDriverConfig, ResourcesUlimits,
};

use crate::gpu::pool::PoolGpu;
use crate::image::ImageId;
use crate::manifest::{Batch, ContainerConfig, GpuDriver, Ipc, Manifest, Network};

use crate::labels::*;

/// What names and labels a run's containers, the same for each of its batches.
pub struct Identity<'a> {
    pub project: &'a str,
    pub scope: &'a str,
    pub run_id: &'a str,
    pub host: &'a str,
    pub source: &'a Path,
    pub source_sha: Option<&'a str>,
    pub fast: bool,
    pub uid: u32,
    pub gid: u32,
    /// The host's values of `pass_env`.
    pub pass_env: &'a BTreeMap<String, String>,
    /// The lock dir holding the run's lock.
    pub lock_dir: &'a Path,
}

/// Keeps what a container name allows: `[a-zA-Z0-9_.-]`, others become `_`.
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Quotes a string for `sh` (single quotes, `'` as `'\''`).
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[derive(Debug, Clone)]
pub struct ContainerPlan {
    pub name: String,
    pub gpus: u32,
    image: String,
    labels: HashMap<String, String>,
    env: Vec<String>,
    /// The manifest's variables for this batch (recorded; no host values).
    pub manifest_env: BTreeMap<String, String>,
    script: String,
    binds: Vec<String>,
    /// Who the batch runs as (`uid:gid`); the container's keeper is root.
    user: String,
    uid: u32,
    gid: u32,
    disk: u64,
    reports_size: u64,
    m_cpus: Option<f64>,
    memory: Option<i64>,
    shm: i64,
    pids: i64,
    network: Network,
    driver: GpuDriver,
    /// The batch's `container` block: mounts, IPC, ulimits, capabilities.
    loosened: ContainerConfig,
}

/// The script the container runs: copy the source in (`cp -R`: ownership cannot be
/// kept without CAP_CHOWN, and the copy belongs to the batch user), install it, then the batch's
/// preflight and run steps, stopping at the first that fails.
fn script(m: &Manifest, batch: &Batch) -> String {
    let mut s = String::from(
        "set -e\n\
         if ! [ -d /work ] || ! [ -w /work ]; then echo \"cibox: /work is missing or not writable by uid $(id -u); the image must provide /work (mode 1777)\" >&2; exit 125; fi\n\
         cp -R /src/. /work/\ncd /work\n",
    );
    let steps = m
        .source
        .install
        .iter()
        .map(|c| ("install", c))
        .chain(batch.preflight.iter().map(|c| ("preflight", c)))
        .chain(batch.run.iter().map(|c| ("run", c)));
    for (phase, cmd) in steps {
        s.push_str(&format!(
            "echo {} >&2\n",
            sh_quote(&format!("cibox {phase}: {cmd}"))
        ));
        s.push_str(cmd);
        // A step's status is its last command's, even where `set -e` looks away (the
        // left of `&&` or `||`, after `!`): `false && echo ok` fails the step.
        s.push_str(
            "\n__cibox_status=$?; [ \"$__cibox_status\" -eq 0 ] || exit \"$__cibox_status\"\n",
        );
    }
    s
}

/// The container's first process: waits on its standard input (kept open by the
/// engine), ignoring the signals a batch or a stop could send; needs nothing but `sh`.
const KEEPER: &str = "trap '' TERM INT HUP; while read -r _; do :; done";

impl ContainerPlan {
    /// What runs the batch: its script, in `sh`, as [`ContainerPlan::user`].
    pub fn steps(&self) -> Vec<String> {
        vec!["/bin/sh".into(), "-c".into(), self.script.clone()]
    }

    /// The size of `/reports`, and so the most that is copied out of it.
    pub fn reports_size(&self) -> u64 {
        self.reports_size
    }

    /// What the container allows beyond the locked-down default, for the record.
    pub fn loosened(&self) -> serde_json::Value {
        self.loosened.loosenings()
    }

    /// Who the batch runs as, `uid:gid`.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The memory limit as the manifest writes it (`none` without one).
    pub fn memory_text(&self) -> String {
        self.memory.map_or("none".to_string(), |m| {
            crate::units::Size(m as u64).to_string()
        })
    }

    /// `user` is who the batch runs as (the invoker, or what its `container.user` says).
    pub fn new(
        m: &Manifest,
        batch_name: &str,
        batch: &Batch,
        id: &Identity<'_>,
        user: (u32, u32),
        image: &ImageId,
    ) -> ContainerPlan {
        let c = &batch.container;
        let name = format!(
            "cibox-{}-{}-{}-{}",
            sanitize(id.project),
            sanitize(id.scope),
            sanitize(batch_name),
            &id.run_id[..8.min(id.run_id.len())]
        );
        let manifest_env = super::plan::manifest_env(batch, id.fast);
        let mut env: BTreeMap<String, String> = manifest_env.clone();
        // Only what this batch's `pass_env` names (each batch may name its own).
        env.extend(
            id.pass_env
                .iter()
                .filter(|(k, _)| c.pass_env.contains(k))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        env.insert("HOME".into(), "/tmp".into());
        env.insert("CIBOX_REPORTS".into(), "/reports".into());
        env.insert("CIBOX_BATCH".into(), batch_name.into());
        env.insert("CIBOX_FAST".into(), if id.fast { "1" } else { "0" }.into());
        if batch.gpus == 0 {
            // CPU batches see no GPU, whatever the runtime's defaults.
            env.insert("NVIDIA_VISIBLE_DEVICES".into(), "void".into());
            env.insert("CUDA_VISIBLE_DEVICES".into(), String::new());
        } else {
            env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
        }
        let labels = HashMap::from([
            (LABEL_OWNER.to_string(), "cibox".to_string()),
            (LABEL_PROJECT.to_string(), id.project.to_string()),
            (LABEL_SCOPE.to_string(), id.scope.to_string()),
            (LABEL_RUN.to_string(), id.run_id.to_string()),
            (LABEL_BATCH.to_string(), batch_name.to_string()),
            (
                LABEL_SOURCE.to_string(),
                id.source_sha.unwrap_or("none").to_string(),
            ),
            (LABEL_GPUS.to_string(), String::new()),
            (LABEL_HOST.to_string(), id.host.to_string()),
            (
                LABEL_LOCK_DIR.to_string(),
                id.lock_dir.display().to_string(),
            ),
        ]);
        ContainerPlan {
            name,
            gpus: batch.gpus,
            image: image.to_string(),
            labels,
            env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
            manifest_env,
            script: script(m, batch),
            binds: vec![format!("{}:/src:ro", id.source.display())],
            user: format!("{}:{}", user.0, user.1),
            uid: user.0,
            gid: user.1,
            disk: c.disk.0,
            reports_size: c.reports_size.0,
            m_cpus: c.cpus,
            memory: c.memory.map(|s| s.0 as i64),
            shm: c.shm.0 as i64,
            pids: i64::from(c.pids),
            network: c.network,
            driver: c.gpu_driver,
            loosened: c.clone(),
        }
    }

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
            env.push(format!("CUDA_VISIBLE_DEVICES={}", uuids.join(",")));
        }
        let device_requests = (!gpus.is_empty()).then(|| {
            vec![match self.driver {
                GpuDriver::Nvidia => DeviceRequest {
                    driver: Some("nvidia".into()),
                    device_ids: Some(uuids.clone()),
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
        });
        let network = match self.network {
            Network::None => "none",
            Network::Bridge => "bridge",
            Network::Host => "host",
        };
        let (uid, gid) = (self.uid, self.gid);
        // Memory-backed and sized: what a batch can grow is bounded (and charged to its
        // memory limit), and owned by the batch whatever the image's folders say.
        let tmpfs = |size: u64, exec: &str| {
            format!("rw,{exec},nosuid,nodev,size={size},uid={uid},gid={gid},mode=1777")
        };
        // `/reports` is a volume, not a plain tmpfs: the engine's archive API sees
        // volumes (not tmpfs mounts), so cibox can copy it out while the container
        // lives; anonymous, it goes with the container.
        let reports = Mount {
            typ: Some(MountType::VOLUME),
            target: Some("/reports".into()),
            volume_options: Some(MountVolumeOptions {
                no_copy: Some(true),
                driver_config: Some(MountVolumeOptionsDriverConfig {
                    name: Some("local".into()),
                    options: Some(HashMap::from([
                        ("type".to_string(), "tmpfs".to_string()),
                        ("device".to_string(), "tmpfs".to_string()),
                        (
                            "o".to_string(),
                            format!(
                                "size={},uid={uid},gid={gid},mode=0700,nosuid,nodev,noexec",
                                self.reports_size
                            ),
                        ),
                    ])),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut mounts = vec![reports];
        // Read-only all the way down where the engine can (API 1.44+); before that a
        // read-only bind leaves the mounts below it writable, so only the folder itself
        // is bound (and a run refuses sources holding mounts: they would be missing).
        mounts.extend(self.loosened.mounts.iter().map(|m| Mount {
            typ: Some(MountType::BIND),
            source: Some(super::mounts::engine_source(m).display().to_string()),
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
        }));
        let ulimits: Vec<ResourcesUlimits> = self
            .loosened
            .ulimits
            .iter()
            .map(|(name, l)| ResourcesUlimits {
                name: Some(name.clone()),
                soft: Some(l.soft),
                hard: Some(l.hard),
            })
            .collect();
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
            host_config: Some(HostConfig {
                binds: Some(self.binds.iter().chain(masks).cloned().collect()),
                mounts: Some(mounts),
                tmpfs: Some(HashMap::from([
                    ("/work".to_string(), tmpfs(self.disk, "exec")),
                    ("/tmp".to_string(), tmpfs(self.disk, "exec")),
                ])),
                cap_drop: Some(vec!["ALL".into()]),
                cap_add: (!self.loosened.cap_add.is_empty()).then(|| {
                    self.loosened
                        .cap_add
                        .iter()
                        .map(|c| format!("CAP_{c}"))
                        .collect()
                }),
                ipc_mode: Some(
                    match self.loosened.ipc {
                        Ipc::Private => "private",
                        Ipc::Host => "host",
                    }
                    .into(),
                ),
                ulimits: (!ulimits.is_empty()).then_some(ulimits),
                security_opt: Some(vec!["no-new-privileges".into()]),
                init: Some(true),
                pids_limit: Some(self.pids),
                nano_cpus: self.m_cpus.map(|c| (c * 1e9) as i64),
                memory: self.memory,
                // Swap adds nothing: memory+swap equals memory.
                memory_swap: self.memory,
                shm_size: Some(self.shm),
                network_mode: Some(network.into()),
                device_requests,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_quotes() {
        assert_eq!(sanitize("local-jo hn/x"), "local-jo_hn_x");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }
}
