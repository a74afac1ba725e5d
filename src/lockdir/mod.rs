//! The shared lock directory (`gpu.lock_dir`, by default `/run/lock/cibox`): one folder
//! that every cibox on the host uses for GPU leases (`<UUID>.lock`, [`crate::gpu::lease`]),
//! the fair queue (`queue/`, `queue.seq`, [`crate::gpu::queue`]), the decision lock
//! (`select.lock`) and run locks (`runs/`, [`runs`]). This module
//! owns its layout and sharing rules; see docs/interface.md §11.
//!
//! It must be on local disk: `flock` over NFS or SMB is emulated, or not shared between
//! clients at all, so two hosts (or one host after a server hiccup) could both believe
//! they hold the same GPU.
//!
//! Sharing between users of one host: the directory (and its `queue/` and `runs/`) is
//! created with mode 1777 (world-writable, sticky, like /tmp) and every lock file with
//! mode 0666, so any user can open and lock any file while nobody can delete or replace
//! another user's file; `cibox host setup` makes `select.lock` root's alone
//! ([`LockDir::open_select_lock`]). Files are opened without `O_CREAT` first, because Linux's
//! `fs.protected_regular` refuses `O_CREAT` on another user's file in a sticky folder.

pub mod runs;
pub mod setup;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::exit::Failure;
use crate::ownership;

/// File systems whose `flock` cannot be trusted for leases.
const NETWORK_FS: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x517B, "SMB"),
    (0x5346_414F, "AFS"),
    (0x00C3_6400, "Ceph"),
    (0x0102_1997, "9P"),
    (0x6573_5546, "FUSE"),
];

/// Why a lock directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LockDirError {
    #[error(
        "lock dir {dir}: on a network file system ({fs}); flock is not reliable there: put gpu.lock_dir on local disk"
    )]
    Network { dir: String, fs: &'static str },
    #[error("lock dir {dir}: {reason}")]
    Unusable { dir: String, reason: String },
}

impl crate::error::ErrorKind for LockDirError {
    /// A lock dir that cannot be used is configuration (`gpu.lock_dir`), like a bad
    /// pool entry.
    fn failure(&self) -> Failure {
        Failure::Usage
    }
}

/// The nearest folder that exists: the lock dir itself, or the parent it will be made in.
fn existing_ancestor(dir: &Path) -> PathBuf {
    let mut p = dir.to_path_buf();
    while !p.exists() {
        match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => p = parent.to_path_buf(),
            _ => return PathBuf::from("."),
        }
    }
    p
}

/// Names the network file system `path` lives on, if any.
pub fn network_fs(path: &Path) -> Result<Option<&'static str>, std::io::Error> {
    let st = nix::sys::statfs::statfs(path).map_err(std::io::Error::from)?;
    let magic = st.filesystem_type().0 as i64;
    Ok(NETWORK_FS
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, name)| *name))
}

/// What [`check`] found of a usable lock dir.
pub struct Checked {
    /// A short description for reports.
    pub detail: String,
    /// The network file system it is on, where `allow_network_fs` let that pass.
    pub network: Option<&'static str>,
}

/// Checks that `dir` is (or can become) a writable folder, on local disk unless
/// `allow_network_fs` (`gpu.allow_network_lock_dir`, as [`LockDir::open`] takes it).
pub fn check(dir: &Path, allow_network_fs: bool) -> Result<Checked, LockDirError> {
    let shown = dir.display().to_string();
    let unusable = |reason: String| LockDirError::Unusable {
        dir: shown.clone(),
        reason,
    };
    let at = existing_ancestor(dir);
    if !at.is_dir() {
        return Err(unusable(format!("{} is not a directory", at.display())));
    }
    let network = match network_fs(&at) {
        Ok(Some(fs)) if !allow_network_fs => {
            return Err(LockDirError::Network {
                dir: shown.clone(),
                fs,
            });
        }
        Ok(found) => found,
        Err(e) => return Err(unusable(format!("cannot stat its file system: {e}"))),
    };
    let probe = at.join(format!(".cibox-write-check-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(e) => {
            return Err(unusable(format!(
                "{} is not writable ({e}); create it with mode 1777 or run as a user who may write there",
                at.display()
            )));
        }
    }
    let kind = match network {
        Some(fs) => format!(
            "on a network file system ({fs}), allowed by allow_network_lock_dir: flock may not hold there, writable"
        ),
        None => "local, writable".to_string(),
    };
    let detail = if at == dir {
        format!("{shown}: {kind}")
    } else {
        format!(
            "{shown}: does not exist yet; will be created in {} ({kind})",
            at.display()
        )
    };
    Ok(Checked { detail, network })
}

/// The shared lock directory (`gpu.lock_dir`): GPU leases, the queue, run locks.
#[derive(Debug, Clone)]
pub struct LockDir {
    path: PathBuf,
}

fn create_shared_dir(path: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(path) {
        Ok(()) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o1777)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Flags for every file cibox opens in the lock dir, whoever made it: never through a
/// symlink, never blocking on a FIFO, never inherited by a child by accident.
const SAFE_FLAGS: i32 = nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC;

/// Accepts only a regular file: a FIFO, device or socket planted under a lock file's
/// name would block or mislead; and a file of root's only with one name.
fn regular(file: File, path: &Path) -> std::io::Result<File> {
    regular_with(file, path, false)
}

/// [`regular`]; `any_names`: a root file with other names is fine too, for a file cibox
/// neither writes nor reads (`select.lock`: only its lock counts).
fn regular_with(file: File, path: &Path, any_names: bool) -> std::io::Result<File> {
    use std::os::unix::fs::MetadataExt;
    let md = file.metadata()?;
    // A hard link could name a file outside the lock dir; only one owned by root can do
    // harm (cibox, as root, writes holders into lock files), and anyone else's is
    // theirs to spoil. A root file anyone may write already (mode 0666, as `host setup`
    // makes lock files) is no such harm: anyone may link it anywhere, and a second name
    // of it must not stop every lease.
    let shared = md.mode() & 0o777 == 0o666 || any_names;
    if !md.file_type().is_file() || (md.nlink() != 1 && md.uid() == 0 && !shared) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} is not a plain file (a FIFO, device, or a file with other names, {}); remove it",
                path.display(),
                ownership::owner_of(md.uid())
            ),
        ));
    }
    Ok(file)
}

/// Whether a file or folder of `uid`'s in the lock dir is more than somebody's word:
/// anyone may write there, so only root's and the caller's own are.
pub fn vouched_for(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// Whether an open failed because something other than a plain file was put under
/// that name (a symlink, a FIFO, a hard link): never a file cibox made.
pub fn is_planted(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::InvalidData
}

/// Opens a file of the lock dir for reading (a lease's holder, a ticket, a run's
/// record) without following a link or blocking; only a plain file.
pub fn open_read(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(SAFE_FLAGS)
        .open(path)
        .map_err(|e| refused_link(e, path))?;
    regular(file, path)
}

/// `ELOOP` from `O_NOFOLLOW` means a symlink was planted: say so.
fn refused_link(e: std::io::Error, path: &Path) -> std::io::Error {
    if e.raw_os_error() == Some(nix::libc::ELOOP) {
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::symlink_metadata(path)
            .map(|m| format!(", {}", ownership::owner_of(m.uid())))
            .unwrap_or_default();
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is a symbolic link{owner}; remove it", path.display()),
        )
    } else {
        e
    }
}

/// Opens `path` read-write, creating it with mode 0666 when it does not exist; never
/// through a symlink, never a FIFO or another special file ([`open_read`]).
pub fn open_shared_file(path: &Path) -> std::io::Result<File> {
    loop {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(SAFE_FLAGS)
            .open(path)
        {
            Ok(f) => return regular(f, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(refused_link(e, path)),
        }
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(SAFE_FLAGS)
            .mode(0o666)
            .open(path)
        {
            Ok(f) => {
                // The umask may have narrowed the mode; other users must be able to lock.
                f.set_permissions(std::fs::Permissions::from_mode(0o666))?;
                return Ok(f);
            }
            // Someone else created it between our two opens: open theirs. (A dangling
            // symlink also says "exists": the open above then refuses it.)
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
                    return Err(refused_link(
                        std::io::Error::from_raw_os_error(nix::libc::ELOOP),
                        path,
                    ));
                }
                continue;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Opens an existing file of the lock dir read-write, never creating it, never through
/// a symlink, only a plain file.
fn open_existing_shared(path: &Path) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(SAFE_FLAGS)
        .open(path)
        .map_err(|e| refused_link(e, path))?;
    regular(f, path)
}

/// Whether `file` is still the file at `path` (not unlinked or replaced since it was
/// opened): a lock on a file no longer at its path excludes nobody.
pub fn still_at(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// A file as the kernel's lock table names it: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileKey {
    dev: u64,
    ino: u64,
}

impl FileKey {
    pub fn of(md: &std::fs::Metadata) -> FileKey {
        use std::os::unix::fs::MetadataExt;
        FileKey {
            dev: md.dev(),
            ino: md.ino(),
        }
    }

    /// `08:01:1234`, as `/proc/locks` and `/proc/PID/fdinfo` write it.
    fn proc_text(&self) -> String {
        format!(
            "{:02x}:{:02x}:{}",
            nix::sys::stat::major(self.dev),
            nix::sys::stat::minor(self.dev),
            self.ino
        )
    }
}

/// The kernel's table of locks held now (`/proc/locks`), read once: which process took
/// the lock on each file. That process may since have exited and left the lock with a
/// descriptor it passed on (a child, a fork).
pub struct Locks {
    /// Per file, each process that took a lock on it (several for a shared lock).
    taken_by: std::collections::HashMap<String, Vec<u32>>,
}

impl Locks {
    pub fn read() -> Locks {
        let text = std::fs::read_to_string("/proc/locks").unwrap_or_default();
        let mut taken_by = std::collections::HashMap::new();
        for line in text.lines() {
            // `1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF`; a blocked waiter's line
            // has `->` and holds nothing.
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.contains(&"->") {
                continue;
            }
            if let (Some(pid), Some(file)) = (fields.get(4), fields.get(5))
                && let Ok(pid) = pid.parse::<u32>()
            {
                taken_by
                    .entry(file.to_string())
                    .or_insert_with(Vec::new)
                    .push(pid);
            }
        }
        Locks { taken_by }
    }

    /// The process that took the lock held on `file`, if one is held.
    pub fn taken_by(&self, file: FileKey) -> Option<u32> {
        self.takers(file).first().copied()
    }

    /// Every process that took a lock held on `file` (the holders of a shared lock).
    pub fn takers(&self, file: FileKey) -> &[u32] {
        self.taken_by
            .get(&file.proc_text())
            .map_or(&[], Vec::as_slice)
    }
}

/// A process's user and session, as the kernel says; `None` once it has exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub session: u32,
}

pub fn identity(pid: u32) -> Option<Identity> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|u| u.parse::<u32>().ok())?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `PID (COMMAND) STATE PPID PGRP SESSION …`; the command may hold spaces and `)`.
    let after = &stat[stat.rfind(')')? + 1..];
    let session = after.split_whitespace().nth(3)?.parse().ok()?;
    Some(Identity { uid, session })
}

/// The processes that hold a lock on the file `key` names, found through their open
/// descriptors (`/proc/PID/fdinfo`, which names the locks each holds): every process
/// for root, a user's own for anyone else. At most a few.
fn lock_holders_by_fd(key: FileKey) -> Vec<u32> {
    let want = key.proc_text();
    let ino = format!("ino:\t{}", key.ino);
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fdinfo")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_to_string(fd.path()).is_ok_and(|info| {
                info.lines().any(|l| l == ino)
                    && info
                        .lines()
                        .any(|l| l.starts_with("lock:") && !l.contains("->") && l.contains(&want))
            })
        });
        if holds {
            found.push(pid);
            if found.len() == 3 {
                break;
            }
        }
    }
    found
}

/// "pid 123 (uid 1001 (mallory))".
fn named(pid: u32) -> String {
    match identity(pid) {
        Some(id) => format!("pid {pid} ({})", ownership::user_name(id.uid)),
        None => format!("pid {pid}"),
    }
}

/// Who holds a lock on `file`, as the kernel says: "pid 123 (uid 1001 (mallory))"; when
/// the process that took it has exited and left it to another (a child, a fork), that
/// one, found through its descriptors: "pid 125 (uid 1001 (mallory)), which inherited
/// it from pid 123". `None` when nobody holds it, or the kernel's table cannot be read.
pub fn lock_holder(file: &File) -> Option<String> {
    let key = FileKey::of(&file.metadata().ok()?);
    let pid = Locks::read().taken_by(key)?;
    if identity(pid).is_some() {
        return Some(named(pid));
    }
    let holders = lock_holders_by_fd(key);
    if holders.is_empty() {
        // Only root may read another user's descriptors.
        return Some(format!(
            "a process of another user that inherited it from pid {pid}, which has exited (only root may see whose: run this as root to have it named, or look for what pid {pid} started)"
        ));
    }
    let names: Vec<String> = holders.into_iter().map(named).collect();
    Some(format!(
        "{}, which inherited it from pid {pid} (exited)",
        names.join(" and ")
    ))
}

/// Why a bounded wait for a lock ended without it.
#[derive(Debug)]
pub enum LockWait {
    /// The deadline passed.
    TimedOut,
    /// A terminating signal arrived.
    Interrupted(nix::sys::signal::Signal),
    Io(std::io::Error),
}

impl From<std::io::Error> for LockWait {
    fn from(e: std::io::Error) -> LockWait {
        LockWait::Io(e)
    }
}

/// Takes `file`'s exclusive lock, waiting at most until `deadline` and giving up at a
/// signal: a lock held by any process (another user's, a stuck one) must not hold
/// cibox past its `--wait` or make it ignore SIGTERM.
pub fn lock_until(file: &File, deadline: std::time::Instant) -> Result<(), LockWait> {
    let mut pause = std::time::Duration::from_micros(200);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => return Err(LockWait::Io(e)),
        }
        if let Some(sig) = crate::signals::received() {
            return Err(LockWait::Interrupted(sig));
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return Err(LockWait::TimedOut);
        }
        // Held briefly by design (a hand-out, a ticket): start fast, back off to 5 ms.
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(std::time::Duration::from_millis(5));
    }
}

/// Checks that a folder of the lock dir can be trusted: a real directory (not a
/// symlink), owned by root or by the invoking user, and not writable by others unless
/// sticky when anyone may write (so nobody can replace what another user made). Anyone can create
/// `/run/lock/cibox` after a reboot; a folder made by someone else is refused.
fn trusted_dir(path: &Path) -> Result<(), String> {
    trusted(path, true)
}

/// `queue/` and `runs/`: a real folder, sticky when anyone may write it, and root's or
/// the lock dir's owner's: the owner of a sticky folder may remove anyone's ticket or
/// run record in it.
fn trusted_subdir(path: &Path, dir_owner: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    trusted(path, false)?;
    let uid = std::fs::symlink_metadata(path)
        .map_err(|e| format!("cannot stat it: {e}"))?
        .uid();
    if uid != 0 && uid != dir_owner {
        return Err(format!(
            "is {}, not by root or the lock dir's owner ({}): its owner could remove anyone's ticket or run record; run `cibox host setup` as root",
            ownership::owner_of(uid),
            ownership::user_name(dir_owner)
        ));
    }
    Ok(())
}

fn trusted(path: &Path, check_owner: bool) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::symlink_metadata(path).map_err(|e| format!("cannot stat it: {e}"))?;
    if md.file_type().is_symlink() {
        return Err("is a symbolic link; use the real folder".into());
    }
    if !md.is_dir() {
        return Err("exists and is not a directory".into());
    }
    let me = nix::unistd::geteuid().as_raw();
    if check_owner && !vouched_for(md.uid()) {
        return Err(format!(
            "is {}, not by root or you (uid {me}); remove it, or set gpu.lock_dir to a folder root or you own",
            ownership::owner_of(md.uid())
        ));
    }
    // Group-writable is the admin's choice (a `ci` group, mode 2770); anyone-writable
    // needs the sticky bit.
    if md.mode() & 0o002 != 0 && md.mode() & 0o1000 == 0 {
        return Err(format!(
            "is writable by anyone (mode {:o}) but not sticky; chmod +t it (mode 1777) so nobody can replace another's files",
            md.mode() & 0o7777
        ));
    }
    Ok(())
}

impl LockDir {
    /// Opens (creating when missing) a lease directory on local disk.
    pub fn open(path: &Path, allow_network_fs: bool) -> Result<LockDir, LockDirError> {
        let shown = path.display().to_string();
        let unusable = |reason: String| LockDirError::Unusable {
            dir: shown.clone(),
            reason,
        };
        if !path.exists() {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .map_err(|e| unusable(format!("cannot create {}: {e}", parent.display())))?;
            }
            create_shared_dir(path).map_err(|e| unusable(format!("cannot create it: {e}")))?;
        }
        trusted_dir(path).map_err(&unusable)?;
        if !allow_network_fs {
            match network_fs(path) {
                Ok(Some(fs)) => return Err(LockDirError::Network { dir: shown, fs }),
                Ok(None) => {}
                Err(e) => return Err(unusable(format!("cannot stat its file system: {e}"))),
            }
        }
        let dir_owner = {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(path)
                .map_err(|e| unusable(format!("cannot stat it: {e}")))?
                .uid()
        };
        let me = nix::unistd::geteuid().as_raw();
        for sub in ["queue", "runs"] {
            let at = path.join(sub);
            // Made only by root or the lock dir's owner (see `trusted_subdir`).
            if me == 0 || me == dir_owner {
                create_shared_dir(&at)
                    .map_err(|e| unusable(format!("cannot create {sub}/: {e}")))?;
            } else if std::fs::symlink_metadata(&at).is_err() {
                return Err(unusable(format!(
                    "{sub}/ does not exist, and only root or the lock dir's owner ({}) may make it; run `cibox host setup` as root once",
                    ownership::user_name(dir_owner)
                )));
            }
            trusted_subdir(&at, dir_owner).map_err(|why| unusable(format!("{sub}/ {why}")))?;
        }
        // A lease needs to write its lock files; find out now rather than mid-wait.
        let dir = LockDir {
            path: path.to_path_buf(),
        };
        dir.open_lock_file("queue.seq").map_err(|e| {
            if is_planted(&e) || e.kind() == std::io::ErrorKind::PermissionDenied {
                unusable(e.to_string())
            } else {
                unusable(format!(
                    "not writable ({e}); make it mode 1777 or run as a user who may write there"
                ))
            }
        })?;
        Ok(dir)
    }

    /// The directory as it is, for reading lease states only: nothing is created, and
    /// a missing directory means no GPU is leased.
    pub fn existing(path: &Path) -> LockDir {
        LockDir {
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The uid of the lock dir's owner: root, or the user who made it for themselves.
    fn owner(&self) -> std::io::Result<u32> {
        use std::os::unix::fs::MetadataExt;
        Ok(std::fs::symlink_metadata(&self.path)?.uid())
    }

    /// Opens `select.lock`, the lock a waiter holds while it decides a hand-out.
    /// Whoever can open it can hold it and stop every hand-out for as long as they
    /// like, so `cibox host setup` makes it root's alone (mode 0600). Then only cibox
    /// running as root opens it; anyone else gets `None` and decides without it: a
    /// hand-out stays safe without it (each GPU's lock is taken all or none, a waiter
    /// behind the head checks again once it holds its GPUs), and what the decision
    /// lock adds, that deciders do not interleave, is not worth letting every user
    /// stop all hand-outs. In a lock dir not set up (mode 0666) everyone opens it.
    pub fn open_select_lock(&self) -> std::io::Result<Option<File>> {
        use std::os::unix::fs::MetadataExt;
        let path = self.path.join("select.lock");
        let owner = self.owner()?;
        let me = nix::unistd::geteuid().as_raw();
        let opened = if me == 0 || me == owner {
            // Read-only is enough to lock it; it is made when missing, as ever.
            match OpenOptions::new()
                .read(true)
                .custom_flags(SAFE_FLAGS)
                .open(&path)
            {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return self.open_lock_file("select.lock").map(Some);
                }
                other => other,
            }
        } else {
            OpenOptions::new()
                .read(true)
                .custom_flags(SAFE_FLAGS)
                .open(&path)
        };
        let file = match opened {
            Ok(f) => regular_with(f, &path, true)?,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                // Root's alone, as `host setup` makes it: decide without it.
                let md = std::fs::symlink_metadata(&path)?;
                if md.is_file() && md.uid() == 0 && md.mode() & 0o077 == 0 {
                    return Ok(None);
                }
                return Err(e);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // As for the other files a lease depends on.
                return self.open_lock_file("select.lock").map(Some);
            }
            Err(e) => return Err(refused_link(e, &path)),
        };
        let uid = file.metadata()?.uid();
        if uid != 0 && uid != owner {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} is {}, not by root or the lock dir's owner ({}): its owner could remove it while a waiter holds it; remove it (as root), or run `cibox host setup`",
                    path.display(),
                    ownership::owner_of(uid),
                    ownership::user_name(owner)
                ),
            ));
        }
        Ok(Some(file))
    }

    /// Opens a file every lease depends on (a GPU's lock file, `select.lock`,
    /// `queue.seq`). Only one made by root or the lock dir's owner is trusted: whoever
    /// owns a file in a sticky folder may remove it, and a lease held on a removed file
    /// excludes nobody, so the next lease would take the same GPU. A missing one is made
    /// only by root or the owner, for the same reason; anyone else is told to run
    /// `cibox host setup`.
    pub fn open_lock_file(&self, name: &str) -> std::io::Result<File> {
        use std::os::unix::fs::MetadataExt;
        let path = self.path.join(name);
        let owner = self.owner()?;
        let me = nix::unistd::geteuid().as_raw();
        let file = if me == 0 || me == owner {
            open_shared_file(&path)?
        } else {
            open_existing_shared(&path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!(
                            "{} does not exist, and only root or the lock dir's owner ({}) may make it; run `cibox host setup` as root once",
                            path.display(),
                            ownership::user_name(owner)
                        ),
                    )
                } else {
                    e
                }
            })?
        };
        let uid = file.metadata()?.uid();
        if uid != 0 && uid != owner {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} is {}, not by root or the lock dir's owner ({}): its owner could remove it while a lease holds it and the GPU would be handed out twice; remove it (as root), or run `cibox host setup`",
                    path.display(),
                    ownership::owner_of(uid),
                    ownership::user_name(owner)
                ),
            ));
        }
        Ok(file)
    }
}
