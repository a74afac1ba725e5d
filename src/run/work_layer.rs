//! A batch's `/work` without a copy of the source: an overlay whose read-only lower
//! layer is the run's snapshot of the source (a volume of the engine, filled once per
//! run, see [`crate::run::execute`]) and whose upper layer, where everything the batch
//! writes goes, lies on a tmpfs of `container.disk` bytes that cibox mounts on the host
//! for that batch alone ([`WorkLayer`]).
//!
//! The engine mounts the overlay itself (an anonymous `local` volume of type
//! `overlay`, gone with the container) when the container starts. cibox then unmounts
//! its tmpfs and removes its folder at once ([`WorkLayer::release`]): the overlay keeps
//! the tmpfs alive for as long as it is mounted, and the engine unmounts it when the
//! container stops. So from the batch's start on nothing of it is on the host, and the
//! memory goes with the container, whoever removes it (cibox, its watchdog, a sweep).
//!
//! What a cibox killed between the mount and the start leaves is a folder of the run
//! under [`BASE`] holding a small tmpfs: [`sweep`] unmounts and removes the folders of
//! runs whose lock ([`RunLayers`], held for the run's life) is free.
//!
//! Only root can mount; and the engine must see cibox's folders (the same host, the
//! same mounts: not a rootless engine in a namespace of its own). Where it cannot, the
//! run says why once and its batches copy the snapshot into a memory-backed `/work`
//! instead (see `snapshot`).

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::lockdir::runs::is_run_id;

/// Where the runs' upper layers are mounted, a folder of each run's.
pub const BASE: &str = "/run/cibox/work";

/// The most of the host's memory a run's copy of the source (one per user its batches
/// share) may take: far above a GPU project's source (vLLM's is about 100 MiB), far
/// below what hurts a runner. A bigger source goes into the engine's volume, on disk.
pub const MAX_LOWER: u64 = 1 << 30;

/// The file a run holds locked while it lives (in its folder under [`BASE`]).
const LOCK: &str = ".lock";

/// The run's folder of upper layers, held (locked) for its life; removed when dropped.
#[derive(Debug)]
pub struct RunLayers {
    dir: PathBuf,
    _lock: File,
    next: AtomicU32,
}

impl RunLayers {
    /// Makes run `run`'s folder under `base` and takes its lock. Fails where cibox may
    /// not (not root), or where `base` is not a folder of root's that only root may
    /// enter (so nobody else can place anything in it).
    pub fn open(base: &Path, run: &str) -> std::io::Result<RunLayers> {
        if !nix::unistd::geteuid().is_root() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "cibox is not root: only root may mount the upper layers",
            ));
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(base)?;
        let md = std::fs::symlink_metadata(base)?;
        if !md.is_dir() || md.uid() != 0 || md.mode() & 0o077 != 0 {
            return Err(std::io::Error::other(format!(
                "{} is not a folder of root's that only root may enter (mode {:o}, owner {})",
                base.display(),
                md.mode() & 0o7777,
                md.uid()
            )));
        }
        let dir = base.join(run);
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let lock = File::create(dir.join(LOCK))?;
        lock.try_lock()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        // A sweep that found the folder before its lock existed may have removed it:
        // then this lock is no one's, and the run does without layers.
        let ours = lock.metadata()?;
        let named = std::fs::symlink_metadata(dir.join(LOCK))?;
        if (ours.dev(), ours.ino()) != (named.dev(), named.ino()) {
            return Err(std::io::Error::other(format!(
                "{} was removed as it was made",
                dir.display()
            )));
        }
        Ok(RunLayers {
            dir,
            _lock: lock,
            next: AtomicU32::new(0),
        })
    }

    /// A folder `name` of the run's, with a tmpfs (`nosuid`, `nodev`, `opts`) mounted on
    /// it: unmounted and removed when the layer is dropped.
    fn tmpfs(&self, name: &str, opts: &str) -> std::io::Result<WorkLayer> {
        let at = self.dir.join(name);
        std::fs::DirBuilder::new().mode(0o700).create(&at)?;
        let layer = WorkLayer { at };
        mount(
            Some("tmpfs"),
            &layer.at,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(opts),
        )?;
        Ok(layer)
    }

    /// Mounts a fresh upper layer of `size` bytes for a batch running as `uid`:`gid`.
    pub fn layer(&self, size: u64, uid: u32, gid: u32) -> std::io::Result<WorkLayer> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // Not executable-free: the batch runs what it builds in /work, as before.
        let layer = self.tmpfs(&n.to_string(), &format!("size={size},mode=0700"))?;
        // Made only inside the tmpfs: an engine that does not see it finds no `upper`
        // and refuses the overlay (it never writes to a folder of the host's disk).
        let upper = layer.upper();
        std::fs::DirBuilder::new().mode(0o755).create(&upper)?;
        std::os::unix::fs::chown(&upper, Some(uid), Some(gid))?;
        std::fs::set_permissions(&upper, std::fs::Permissions::from_mode(0o755))?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(layer.work())?;
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(layer.lower())?;
        Ok(layer)
    }
}

impl RunLayers {
    /// Mounts a tmpfs holding the tar `archive` (the source, owned by `uid`:`gid`),
    /// written by cibox before any container sees it: the lower layer of the overlays
    /// of the batches running as that user, for the run's life. Where it lies.
    /// At most `max_bytes` of it: a bigger source fails here, and its batches take the
    /// engine's volume instead (the host's memory is not the pull request's to fill).
    pub fn lower(
        &self,
        uid: u32,
        gid: u32,
        archive: impl std::io::Read,
        max_bytes: u64,
    ) -> std::io::Result<String> {
        let layer = self.tmpfs(
            &format!("lower-{uid}-{gid}"),
            &format!("mode=0755,size={max_bytes}"),
        )?;
        unpack(archive, &layer.at)?;
        // Held until the run's folder goes (see `Drop`).
        let at = layer.at.to_string_lossy().into_owned();
        std::mem::forget(layer);
        Ok(at)
    }
}

impl Drop for RunLayers {
    fn drop(&mut self) {
        // Each batch's layer is gone already (released or dropped); the lower layers
        // go now (an overlay of a container left behind keeps its own).
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if e.file_name() != LOCK {
                    unmount_and_remove(&e.path());
                }
            }
        }
        let _ = std::fs::remove_file(self.dir.join(LOCK));
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One batch's upper layer: a tmpfs mounted on the host until the batch's container
/// has started ([`WorkLayer::release`]; dropped, it is released too).
#[derive(Debug)]
pub struct WorkLayer {
    at: PathBuf,
}

impl WorkLayer {
    /// The overlay's upper folder, as the engine's host sees it.
    pub fn upper(&self) -> PathBuf {
        self.at.join("upper")
    }

    /// The overlay's work folder (its own, on the same tmpfs).
    pub fn work(&self) -> PathBuf {
        self.at.join("work")
    }

    /// An empty folder, the lower layer of an overlay whose upper one holds it all.
    pub fn lower(&self) -> PathBuf {
        self.at.join("lower")
    }

    /// Writes the tar `archive` (the source, owned by the batch's user) into the upper
    /// folder, before any container sees it: only cibox writes there, and no entry is
    /// written through a link or outside the folder (the tar reader's own checks).
    pub fn fill(&self, archive: impl std::io::Read) -> std::io::Result<()> {
        unpack(archive, &self.upper())
    }

    /// Unmounts the tmpfs from the host and removes its folder: once the container
    /// has started, its overlay holds the tmpfs, which goes when the overlay does.
    pub fn release(self) {}
}

impl Drop for WorkLayer {
    fn drop(&mut self) {
        unmount_and_remove(&self.at);
    }
}

/// Writes the tar `archive` into `dst` as its headers say (owners, modes, times), never
/// outside it nor through a link (the tar reader's own checks).
fn unpack(archive: impl std::io::Read, dst: &Path) -> std::io::Result<()> {
    let mut archive = tar::Archive::new(archive);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(false);
    archive.set_unpack_xattrs(false);
    archive.unpack(dst)
}

/// Detaches whatever is mounted at `at` (nothing, once a mount failed) and removes
/// the folder, if empty.
fn unmount_and_remove(at: &Path) {
    let _ = umount2(at, MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(at);
}

/// Removes what dead runs left under `base`: the upper layers a killed cibox had
/// mounted and not yet handed to a container. A run whose lock is held lives, and is
/// left alone. The names of the runs swept.
pub fn sweep(base: &Path) -> Vec<String> {
    let mut swept = Vec::new();
    let Ok(entries) = std::fs::read_dir(base) else {
        return swept;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_run_id(&name) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = entry.path();
        // Its lock free is a dead run; held until its folder is gone, so a run starting
        // under the same name cannot take it meanwhile. A folder without a lock is a run
        // killed before it made one, or one making it now: only an old one is dead.
        let _held = match File::open(dir.join(LOCK)) {
            Ok(lock) if lock.try_lock().is_err() => continue,
            Ok(lock) => Some(lock),
            Err(_) if !older_than(&dir, LOCKLESS_GRACE) => continue,
            Err(_) => None,
        };
        if let Ok(layers) = std::fs::read_dir(&dir) {
            for layer in layers.flatten() {
                if layer.file_name() != LOCK {
                    unmount_and_remove(&layer.path());
                }
            }
        }
        let _ = std::fs::remove_file(dir.join(LOCK));
        if std::fs::remove_dir(&dir).is_ok() {
            swept.push(name);
        }
    }
    swept
}

/// How old a run's folder without a lock must be to be a dead run's: one starting now
/// makes its lock a moment after its folder.
const LOCKLESS_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

fn older_than(path: &Path, age: std::time::Duration) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|e| e > age)
}

/// Whether `path` can go into an overlay's options as it is: the engine's `o` is split
/// on commas, the overlay's lower folders on colons.
pub fn plain_path(path: &str) -> bool {
    path.starts_with('/')
        && path
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"/._-".contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_absolute_path_goes_into_an_overlays_options() {
        assert!(plain_path(
            "/var/lib/docker/volumes/cibox-p-s.source-0123-1-1/_data"
        ));
        assert!(!plain_path("relative/_data"));
        assert!(!plain_path("/a,upperdir=/etc"));
        assert!(!plain_path("/a:/b"));
        assert!(!plain_path("/a b"));
    }

    /// Whether something is mounted at `at` (as this process sees the mounts).
    fn mounted(at: &Path) -> bool {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let at = at.to_string_lossy();
        mounts
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(at.as_ref()))
    }

    /// A base folder only root may enter (tests run as root: they mount tmpfs).
    fn base() -> tempfile::TempDir {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts tmpfs: run it as root (as CI does)"
        );
        let base = tempfile::tempdir().unwrap();
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        base
    }

    #[test]
    fn an_upper_layer_is_bounded_and_gone_once_released() {
        let base = base();
        let layers = RunLayers::open(base.path(), "0123456789abcdef").unwrap();
        let layer = layers.layer(1 << 20, 4242, 4343).unwrap();
        let at = layer.at.clone();
        assert!(mounted(&at));
        let md = std::fs::metadata(layer.upper()).unwrap();
        assert_eq!(
            (md.uid(), md.gid(), md.mode() & 0o7777),
            (4242, 4343, 0o755)
        );
        // Past its size, a write fails.
        let big = vec![0u8; 2 << 20];
        let wrote = std::fs::write(layer.upper().join("big"), &big);
        assert_eq!(
            wrote.map_err(|e| e.raw_os_error()),
            Err(Some(nix::libc::ENOSPC))
        );
        layer.release();
        assert!(!mounted(&at) && !at.exists());
        drop(layers);
        assert_eq!(std::fs::read_dir(base.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_sweep_removes_a_dead_runs_layers_and_leaves_a_live_ones() {
        let base = base();
        let live = RunLayers::open(base.path(), "00000000000000aa").unwrap();
        let live_layer = live.layer(1 << 20, 0, 0).unwrap();
        // A run killed between its mount and its container's start: a layer still
        // mounted, its lock free (nobody holds the file).
        let dead = base.path().join("00000000000000bb");
        let left_at = dead.join("0");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&left_at)
            .unwrap();
        File::create(dead.join(LOCK)).unwrap();
        mount(
            Some("tmpfs"),
            &left_at,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=1m"),
        )
        .unwrap();
        assert!(mounted(&left_at));
        assert_eq!(sweep(base.path()), vec!["00000000000000bb".to_string()]);
        assert!(!mounted(&left_at) && !left_at.exists());
        assert!(mounted(&live_layer.at), "a live run's layer was swept");
        // A run's folder without its lock yet (a run making it now) is left alone; once
        // old, it was a run killed before its lock, and goes.
        let young = base.path().join("00000000000000ee");
        std::fs::create_dir(&young).unwrap();
        assert!(sweep(base.path()).is_empty());
        assert!(young.exists());
        File::open(&young)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(120))
            .unwrap();
        assert_eq!(sweep(base.path()), vec!["00000000000000ee".to_string()]);
        // Not a run's folder: left alone.
        std::fs::create_dir(base.path().join("not-a-run")).unwrap();
        assert!(sweep(base.path()).is_empty());
        assert!(base.path().join("not-a-run").exists());
        live_layer.release();
    }

    #[test]
    fn a_source_bigger_than_its_bound_is_refused_and_leaves_no_mount() {
        let base = base();
        let layers = RunLayers::open(base.path(), "00000000000000cd").unwrap();
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(2 << 20);
        h.set_mode(0o644);
        tar.append_data(&mut h, "big", &vec![7u8; 2 << 20][..])
            .unwrap();
        let bytes = tar.into_inner().unwrap();
        assert!(layers.lower(0, 0, &bytes[..], 1 << 20).is_err());
        let at = base.path().join("00000000000000cd/lower-0-0");
        assert!(!mounted(&at), "{}", at.display());
        assert!(!at.exists());
    }

    #[test]
    fn a_lower_layer_holds_the_source_and_goes_with_the_runs_folder() {
        let base = base();
        let layers = RunLayers::open(base.path(), "00000000000000cc").unwrap();
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        h.set_mode(0o644);
        h.set_uid(4242);
        h.set_gid(4343);
        tar.append_data(&mut h, "d/f", &b"abc"[..]).unwrap();
        // A link out, then an entry through it: never written outside.
        let mut l = tar::Header::new_gnu();
        l.set_entry_type(tar::EntryType::Symlink);
        l.set_size(0);
        tar.append_link(&mut l, "out", "/etc").unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        tar.append_data(&mut h, "out/cibox-test-written-through", &b"x"[..])
            .unwrap();
        let bytes = tar.into_inner().unwrap();
        assert!(layers.lower(4242, 4343, &bytes[..], 1 << 20).is_err());
        assert!(!Path::new("/etc/cibox-test-written-through").exists());
        let at = layers
            .lower(4242, 4343, &bytes[..bytes.len() / 3], 1 << 20)
            .map(PathBuf::from);
        // A truncated archive fails too; one made whole holds the file, its owner kept.
        assert!(at.is_err());
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        h.set_mode(0o644);
        h.set_uid(4242);
        h.set_gid(4343);
        tar.append_data(&mut h, "d/f", &b"abc"[..]).unwrap();
        let bytes = tar.into_inner().unwrap();
        let at = PathBuf::from(layers.lower(1, 1, &bytes[..], 1 << 20).unwrap());
        assert!(mounted(&at));
        let md = std::fs::metadata(at.join("d/f")).unwrap();
        assert_eq!((md.uid(), md.gid()), (4242, 4343));
        drop(layers);
        assert!(!mounted(&at) && !at.exists());
        assert_eq!(std::fs::read_dir(base.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_base_others_may_enter_is_refused() {
        let base = base();
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = RunLayers::open(base.path(), "0123456789abcdef").unwrap_err();
        assert!(e.to_string().contains("only root may enter"), "{e}");
    }
}
