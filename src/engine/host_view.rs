//! Where cibox's own folders are as the engine sees them. On the engine's host they are
//! the host's; when cibox runs in a container of that engine (a CI runner in a
//! container with the engine's socket), a path of cibox's reaches the engine only
//! through one of that container's mounts, at the mount's source on the host, and a
//! path in the container's own files not at all. cibox finds its container from the
//! kernel's record of its mounts and asks the engine for that container's mounts. A
//! container the engine does not know is not one of its own (the engine may run in the
//! same container as cibox): paths are then taken as the engine's.

use std::path::{Path, PathBuf};

use super::Engine;

/// Where this process runs, as the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostView {
    /// On the engine's host: cibox's paths are the host's.
    Host,
    /// In container `id` of this engine: `mounts` (inside → host, longest first) are
    /// how its paths reach the host.
    Container {
        id: String,
        mounts: Vec<(PathBuf, PathBuf)>,
    },
}

impl HostView {
    /// `path` (as cibox sees it) as the engine's host sees it.
    pub fn to_host(&self, path: &Path) -> Result<PathBuf, String> {
        match self {
            HostView::Host => Ok(path.to_path_buf()),
            HostView::Container { id, mounts } => mounts
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
        HostView::Container { id, mounts }
    }
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
        assert!(HostView::Host.to_host(Path::new("/x")).is_ok());
    }
}
