//! Where cibox's own folders are as the engine sees them. On the engine's host they are
//! the host's; when cibox runs in a container of that engine (a CI runner in a
//! container with the engine's socket), a path of cibox's reaches the engine only
//! through one of that container's mounts, at the mount's source on the host, and a
//! path in the container's own files not at all. cibox finds its container from the
//! kernel's record of its mounts and asks the engine for that container's mounts. A
//! container the engine does not know is not one of its own (the engine may run in the
//! same container as cibox): paths are then taken as the engine's.
//!
//! A host path is the host's to resolve: a folder above a runner container's bind,
//! on the host, that another user may change could be swapped for a link after cibox
//! mapped the path, and the engine would mount what the link leads to. cibox in its
//! container sees none of those folders, so it asks the engine's host itself
//! ([`Engine::host_folders`]): a helper container of the runner's own image, with the
//! host's `/` bound read-only, runs this cibox (copied in) to judge each host path
//! there, by ownership and links, as cibox judges paths on its own host.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Engine;

/// Where this process runs, as the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostView {
    /// On the engine's host: cibox's paths are the host's.
    Host,
    /// In container `id` of this engine, made from `image`: `mounts` (inside → host,
    /// longest first) are how its paths reach the host.
    Container {
        id: String,
        image: Option<String>,
        mounts: Vec<(PathBuf, PathBuf)>,
    },
}

impl HostView {
    /// `path` (as cibox sees it) as the engine's host sees it.
    pub fn to_host(&self, path: &Path) -> Result<PathBuf, String> {
        match self {
            HostView::Host => Ok(path.to_path_buf()),
            HostView::Container { id, mounts, .. } => mounts
                .iter()
                .find_map(|(inside, host)| {
                    path.strip_prefix(inside).ok().map(|rest| {
                        if rest.as_os_str().is_empty() {
                            host.clone()
                        } else {
                            host.join(rest)
                        }
                    })
                })
                .ok_or_else(|| {
                    format!(
                        "{} lies in the files of cibox's own container ({}), which the engine cannot reach: put it on a mount of that container",
                        path.display(),
                        &id[..12.min(id.len())]
                    )
                }),
        }
    }

    pub fn is_host(&self) -> bool {
        matches!(self, HostView::Host)
    }
}

impl Engine {
    /// Where cibox runs, as this engine sees it.
    pub fn host_view(&self) -> HostView {
        let Some(id) = own_container_id() else {
            return HostView::Host;
        };
        let Ok(details) = self.rt.block_on(self.docker.inspect_container(&id, None)) else {
            return HostView::Host;
        };
        let mut mounts: Vec<(PathBuf, PathBuf)> = details
            .mounts
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| {
                Some((
                    PathBuf::from(m.destination.filter(|d| !d.is_empty())?),
                    PathBuf::from(m.source.filter(|s| !s.is_empty())?),
                ))
            })
            .collect();
        // The deepest mount decides: `/data/shared` before `/data`.
        mounts.sort_by_key(|(inside, _)| std::cmp::Reverse(inside.components().count()));
        HostView::Container {
            id,
            image: details.image.filter(|i| !i.is_empty()),
            mounts,
        }
    }

    /// How each of `paths` (folders or files on the engine's host) stands there, as
    /// the helper sees it: resolved, its device and inode, and whether someone other
    /// than root and this user could change it or a folder on the way to it. On the
    /// engine's host cibox sees them itself; in a container, the helper (see the
    /// module's word) does. `Err` says why they could not be checked.
    pub fn host_folders(
        &self,
        view: &HostView,
        paths: &[PathBuf],
    ) -> Result<Vec<HostFolder>, String> {
        let me = nix::unistd::geteuid().as_raw();
        let image = match view {
            HostView::Host => return Ok(judge_folders(me, paths)),
            HostView::Container { image, .. } => image.clone().ok_or_else(|| {
                "the engine does not say which image cibox's own container was made from"
                    .to_string()
            })?,
        };
        let exe = std::fs::read("/proc/self/exe")
            .map_err(|e| format!("cannot read this cibox to copy into the helper: {e}"))?;
        let mut archive = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(exe.len() as u64);
        header.set_mode(0o755);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        archive
            .append_data(
                &mut header,
                HELPER_EXE.trim_start_matches('/'),
                exe.as_slice(),
            )
            .and_then(|()| archive.finish())
            .map_err(|e| format!("cannot pack this cibox for the helper: {e}"))?;
        let archive = archive
            .into_inner()
            .map_err(|e| format!("cannot pack this cibox for the helper: {e}"))?;
        let mut cmd = vec![
            "__host-folders".to_string(),
            "--me".to_string(),
            me.to_string(),
            "--".to_string(),
        ];
        for p in paths {
            cmd.push(
                p.to_str()
                    .ok_or_else(|| format!("{} is not valid UTF-8", p.display()))?
                    .to_string(),
            );
        }
        let body = bollard::models::ContainerCreateBody {
            image: Some(image),
            user: Some("0:0".into()),
            entrypoint: Some(vec![HELPER_EXE.into()]),
            cmd: Some(cmd),
            working_dir: Some("/".into()),
            env: Some(vec![]),
            labels: Some(std::collections::HashMap::from([(
                "org.cibox.helper".to_string(),
                "host-folders".to_string(),
            )])),
            host_config: Some(bollard::models::HostConfig {
                binds: Some(vec![format!("/:{HELPER_HOST_ROOT}:ro")]),
                // Host uids as they are: a remapped root would see every file as
                // nobody's.
                userns_mode: Some("host".into()),
                cap_drop: Some(vec!["ALL".into()]),
                cap_add: Some(vec!["SYS_CHROOT".into(), "DAC_READ_SEARCH".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                network_mode: Some("none".into()),
                pids_limit: Some(16),
                memory: Some(256 << 20),
                memory_swap: Some(256 << 20),
                ..Default::default()
            }),
            ..Default::default()
        };
        let name = format!(
            "cibox-host-folders-{}",
            crate::util::random_hex(6).map_err(|e| e.to_string())?
        );
        let id = self
            .create_container(&name, body)
            .map_err(|e| format!("cannot make the helper: {e}"))?;
        let out = self.run_helper(&id, archive);
        let _ = self.remove_container(&id);
        let out = out?;
        let mut folders = Vec::new();
        for line in out.lines().filter(|l| !l.trim().is_empty()) {
            let folder: HostFolder = serde_json::from_str(line)
                .map_err(|e| format!("the helper's answer cannot be read: {e}"))?;
            folders.push(folder);
        }
        if folders.len() != paths.len() || folders.iter().zip(paths).any(|(f, p)| &f.path != p) {
            return Err("the helper did not answer for every path".into());
        }
        Ok(folders)
    }

    /// Copies this cibox into the helper `id`, runs it to its end (at most
    /// [`HELPER_TIMEOUT`]) and returns what it printed.
    fn run_helper(&self, id: &str, archive: Vec<u8>) -> Result<String, String> {
        use futures_util::StreamExt;
        self.upload(id, "/", Box::new(std::io::Cursor::new(archive)))
            .map_err(|e| format!("cannot copy this cibox into the helper: {e}"))?;
        self.start_container(id)
            .map_err(|e| format!("the helper did not start: {e}"))?;
        let code = self.rt.block_on(async {
            let wait = async {
                let mut s = self
                    .docker
                    .wait_container(id, None::<bollard::query_parameters::WaitContainerOptions>);
                match s.next().await {
                    Some(Ok(r)) => Ok(r.status_code),
                    Some(Err(bollard::errors::Error::DockerContainerWaitError {
                        code, ..
                    })) => Ok(code),
                    Some(Err(e)) => Err(format!("waiting for the helper: {e}")),
                    None => Err("waiting for the helper: no answer".to_string()),
                }
            };
            tokio::time::timeout(HELPER_TIMEOUT, wait)
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "the helper did not finish within {}s",
                        HELPER_TIMEOUT.as_secs()
                    ))
                })
        })?;
        let (stdout, stderr) = self.rt.block_on(async {
            let opts = bollard::query_parameters::LogsOptions {
                stdout: true,
                stderr: true,
                ..Default::default()
            };
            let mut s = self.docker.logs(id, Some(opts));
            let (mut out, mut err) = (Vec::new(), Vec::new());
            while let Some(Ok(chunk)) = s.next().await {
                match chunk {
                    bollard::container::LogOutput::StdOut { message } => {
                        out.extend_from_slice(&message)
                    }
                    bollard::container::LogOutput::StdErr { message } => {
                        err.extend_from_slice(&message)
                    }
                    _ => {}
                }
                if out.len() + err.len() > HELPER_OUTPUT_MAX {
                    break;
                }
            }
            (out, err)
        });
        if code != 0 {
            let said = String::from_utf8_lossy(&stderr);
            let last = said
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            return Err(format!(
                "the helper exited with {code}: {}",
                crate::util::escape(last)
            ));
        }
        String::from_utf8(stdout).map_err(|_| "the helper's answer is not UTF-8".to_string())
    }
}

/// Where the helper has this cibox, and the host's `/`.
const HELPER_EXE: &str = "/.cibox-host-folders";
const HELPER_HOST_ROOT: &str = "/.cibox-host";
/// How long the helper may take: it looks at a few folders.
const HELPER_TIMEOUT: Duration = Duration::from_secs(30);
const HELPER_OUTPUT_MAX: usize = 1 << 20;

/// A path on the engine's host, as the helper found it there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostFolder {
    pub path: PathBuf,
    /// The path as the host resolves it (links followed); `None` with `error`.
    pub real: Option<PathBuf>,
    pub dev: u64,
    pub ino: u64,
    /// Why someone other than root and the invoking user could change it, or a folder
    /// on the way to it (see [`crate::ownership::changeable_by_others`]).
    pub changeable: Option<String>,
    /// Why it could not be looked at.
    pub error: Option<String>,
}

/// Each of `paths` as it stands here.
fn judge_folders(me: u32, paths: &[PathBuf]) -> Vec<HostFolder> {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .map(|p| {
            let fail = |e: String| HostFolder {
                path: p.clone(),
                real: None,
                dev: 0,
                ino: 0,
                changeable: None,
                error: Some(e),
            };
            let real = match std::fs::canonicalize(p) {
                Ok(r) => r,
                Err(e) => return fail(e.to_string()),
            };
            let md = match std::fs::metadata(&real) {
                Ok(m) => m,
                Err(e) => return fail(e.to_string()),
            };
            HostFolder {
                path: p.clone(),
                changeable: crate::ownership::changeable_by_others(&real, me),
                real: Some(real),
                dev: md.dev(),
                ino: md.ino(),
                error: None,
            }
        })
        .collect()
}

/// The helper's side (`cibox __host-folders --me UID -- PATH…`, hidden): in the
/// helper container, with the host's `/` bound at [`HELPER_HOST_ROOT`], changes its
/// root to it and prints how each path stands there, one JSON line each.
pub fn report_host_folders(me: u32, paths: &[PathBuf]) -> u8 {
    if let Err(e) = nix::unistd::chroot(HELPER_HOST_ROOT).and_then(|()| nix::unistd::chdir("/")) {
        eprintln!("cannot enter the host's / at {HELPER_HOST_ROOT}: {e}");
        return crate::exit::INFRA;
    }
    for folder in judge_folders(me, paths) {
        match serde_json::to_string(&folder) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("{e}");
                return crate::exit::INFRA;
            }
        }
    }
    crate::exit::SUCCESS
}

/// The ID of the engine container this process runs in.
fn own_container_id() -> Option<String> {
    container_id_in(&std::fs::read_to_string("/proc/self/mountinfo").ok()?)
}

/// The engine binds each container's `hostname`, `hosts` and `resolv.conf` from
/// `…/containers/<ID>/` at `/etc/…`, and the kernel names that file as the root of the
/// mount (`mountinfo`'s fourth field, the fifth being where it is mounted). Only a mount
/// at `/etc/…` itself counts: on the engine's host, while the engine copies files into
/// or out of any container, the same files are bound into that container's root
/// (`…/merged/etc/hostname`) for a moment, and a cibox started then would take itself
/// for that container.
fn container_id_in(mountinfo: &str) -> Option<String> {
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ').skip(3);
        let (root, at) = (fields.next()?, fields.next()?);
        if !matches!(at, "/etc/hostname" | "/etc/hosts" | "/etc/resolv.conf") {
            return None;
        }
        let rest = root.split("/containers/").nth(1)?;
        let id = rest.split('/').next()?;
        (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_container_is_where_its_hostname_file_is_bound() {
        let id = "9520ee56c8f93948266bfcd3bc510e1bcb2cb26d303fc24f5269b155976a3dbf";
        let inside = format!(
            "1021 1003 254:1 /var/lib/docker/containers/{id}/hostname /etc/hostname rw,relatime - ext4 /dev/vda1 rw\n"
        );
        assert_eq!(container_id_in(&inside).as_deref(), Some(id));
        // On the engine's host while the engine copies files into that container.
        let host = format!(
            "26 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
             1400 1399 254:1 /var/lib/docker/containers/{id}/hostname /var/lib/docker/overlay2/0189/merged/etc/hostname rw,relatime - ext4 /dev/vda1 rw\n"
        );
        assert_eq!(container_id_in(&host), None);
    }

    #[test]
    fn paths_reach_the_host_through_the_deepest_mount() {
        let w = HostView::Container {
            id: "a".repeat(64),
            image: None,
            mounts: vec![
                ("/data/shared".into(), "/srv/shared".into()),
                ("/data".into(), "/mnt/data".into()),
                (
                    "/workspace".into(),
                    "/var/lib/docker/volumes/ws/_data".into(),
                ),
            ],
        };
        assert_eq!(
            w.to_host(Path::new("/data/shared/models")).unwrap(),
            Path::new("/srv/shared/models")
        );
        assert_eq!(
            w.to_host(Path::new("/data/x")).unwrap(),
            Path::new("/mnt/data/x")
        );
        assert_eq!(
            w.to_host(Path::new("/workspace")).unwrap(),
            Path::new("/var/lib/docker/volumes/ws/_data")
        );
        let e = w.to_host(Path::new("/opt/cache")).unwrap_err();
        assert!(e.contains("own container"), "{e}");
        // A mount's prefix is whole components: `/datax` is not under `/data`.
        assert!(w.to_host(Path::new("/datax/y")).is_err());
        // On the host itself, a path is the host's as it stands, even one a container
        // could not reach.
        assert_eq!(
            HostView::Host.to_host(Path::new("/opt/cache")).unwrap(),
            Path::new("/opt/cache")
        );
    }
}
