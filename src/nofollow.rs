//! File operations where a link cibox did not make must never be followed: cibox may
//! run as root, and a link planted where it writes (by a batch, or by another local
//! user who made a folder first) would make it write wherever the link points.
//!
//! A [`Folder`] is a folder cibox holds open: everything in it is made, written, renamed
//! and removed relative to that descriptor, one name at a time, never following a link
//! (`openat` with `O_NOFOLLOW`, `O_EXCL` for what it makes). A folder swapped for a link
//! after it was opened changes nothing: cibox goes on writing in the folder it opened.
//! [`trusted_folder`] says whether a folder (and every folder on the way to it) is one
//! only root or the invoking user can change, as a reports folder must be.
//!
//! The path-based helpers below ([`clear`], [`remove_tree`]) are for
//! folders cibox made itself and nobody else can change; a planted symlink is removed or
//! refused, never written through, and a folder a batch left unreadable is still removed.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

/// A folder cibox holds open, and writes in by name only.
#[derive(Debug)]
pub struct Folder {
    fd: OwnedFd,
    /// Where it was when it was opened: for messages only.
    path: PathBuf,
}

/// Opens for reading a folder, not following a link at `name`.
fn open_dir_at(dir: impl AsFd, name: &Path) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// One plain name of a folder entry: no `/`, not `.` or `..`.
fn plain(name: &str) -> std::io::Result<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("`{}` is not a name in a folder", crate::util::escape(name)),
        ));
    }
    Ok(name)
}

impl Folder {
    /// Opens the folder at `path`, which must be a folder, not a link to one.
    pub fn open(path: &Path) -> std::io::Result<Folder> {
        Ok(Folder {
            fd: open_dir_at(rustix::fs::CWD, path)?,
            path: path.to_path_buf(),
        })
    }

    /// Where the folder was when it was opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path that leads to the folder held (`/proc/self/fd/N`), whatever has been done
    /// to its name since: for code that walks a tree by path.
    pub fn held_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// The same folder, held a second time.
    pub fn try_clone(&self) -> std::io::Result<Folder> {
        Ok(Folder {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
        })
    }

    /// The folder `name` in it, not a link.
    pub fn open_dir(&self, name: &str) -> std::io::Result<Folder> {
        Ok(Folder {
            fd: open_dir_at(&self.fd, Path::new(plain(name)?))?,
            path: self.path.join(name),
        })
    }

    /// The folder `name` in it, made (with `mode`) when it is not there.
    pub fn make_dir(&self, name: &str, mode: u32) -> std::io::Result<Folder> {
        match rustix::fs::mkdirat(&self.fd, plain(name)?, Mode::from_raw_mode(mode)) {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        self.open_dir(name)
    }

    /// The folder at `rel` below it (each name made when missing), never through a link.
    pub fn make_path(&self, rel: &Path, mode: u32) -> std::io::Result<Folder> {
        let mut at = self.try_clone()?;
        for c in rel.components() {
            match c {
                std::path::Component::Normal(n) => {
                    let name = n.to_str().ok_or_else(|| {
                        std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a UTF-8 name")
                    })?;
                    at = at.make_dir(name, mode)?;
                }
                std::path::Component::CurDir => {}
                _ => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("`{}` is not a path below a folder", rel.display()),
                    ));
                }
            }
        }
        Ok(at)
    }

    /// The folder at `rel` below it, each name a folder, none a link.
    pub fn open_path(&self, rel: &Path) -> std::io::Result<Folder> {
        let mut at = self.try_clone()?;
        for c in rel.components() {
            match c {
                std::path::Component::Normal(n) => {
                    let name = n.to_str().ok_or_else(|| {
                        std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a UTF-8 name")
                    })?;
                    at = at.open_dir(name)?;
                }
                std::path::Component::CurDir => {}
                _ => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("`{}` is not a path below a folder", rel.display()),
                    ));
                }
            }
        }
        Ok(at)
    }

    /// The text of the plain file `name` (at most `max` bytes), not following a link;
    /// `None` when nothing has the name.
    pub fn read_text(&self, name: &str, max: u64) -> std::io::Result<Option<String>> {
        use std::io::Read;
        let fd = match rustix::fs::openat(
            &self.fd,
            plain(name)?,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let file = File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not a plain file",
            ));
        }
        let mut bytes = Vec::new();
        file.take(max + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!("larger than {max} bytes"),
            ));
        }
        Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// The plain file `name`, open for reading, not following a link: anything else
    /// that has the name (a link, a FIFO, a device, a folder) is refused.
    pub fn open_file(&self, name: &str) -> std::io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            plain(name)?,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let file = File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not a plain file",
            ));
        }
        Ok(file)
    }

    /// Renames `from` to `to` in the folder (what had the name `to` is replaced, a
    /// folder only when empty).
    pub fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        Ok(rustix::fs::renameat(
            &self.fd,
            plain(from)?,
            &self.fd,
            plain(to)?,
        )?)
    }

    /// Makes `name` a new file (mode `mode`), refusing whatever has the name already
    /// (a link included: `O_EXCL` never follows one).
    pub fn create_new(&self, name: &str, mode: u32) -> std::io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            plain(name)?,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?;
        Ok(File::from(fd))
    }

    /// Makes `name` a new file (`0644`), first removing whatever has that name.
    pub fn create_fresh(&self, name: &str) -> std::io::Result<File> {
        self.remove(name)?;
        self.create_new(name, 0o644)
    }

    /// Writes `bytes` as the whole of `name`, replacing what had the name (a link is
    /// replaced, not followed): through a new file renamed over it, so a reader sees the
    /// old content or the new, never half.
    pub fn write_replacing(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = format!(".{}.partial", plain(name)?);
        self.create_fresh(&tmp)?.write_all(bytes)?;
        // A folder cannot be renamed over: it goes first.
        if self.kind(name)? == Some(rustix::fs::FileType::Directory) {
            self.remove(name)?;
        }
        Ok(rustix::fs::renameat(&self.fd, &tmp, &self.fd, name)?)
    }

    /// What `name` is, not following a link; `None` when nothing has the name.
    pub fn kind(&self, name: &str) -> std::io::Result<Option<rustix::fs::FileType>> {
        match rustix::fs::statat(&self.fd, plain(name)?, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(rustix::fs::FileType::from_raw_mode(st.st_mode))),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes whatever has `name`: a file or link itself, a folder with all it holds
    /// (made passable first: a folder left at mode 000 would stop a plain removal).
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        match self.kind(name)? {
            None => Ok(()),
            Some(rustix::fs::FileType::Directory) => {
                let inner = self.open_dir(name)?;
                inner.empty()?;
                drop(inner);
                Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)?)
            }
            Some(_) => Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())?),
        }
    }

    /// Moves `name` (whatever it is, a link as itself) into `to`, keeping its name.
    pub fn move_into(&self, name: &str, to: &Folder) -> std::io::Result<()> {
        let name = plain(name)?;
        Ok(rustix::fs::renameat(&self.fd, name, &to.fd, name)?)
    }

    /// The names in the folder, sorted (`.` and `..` left out).
    pub fn names(&self) -> std::io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.fd)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Removes everything in the folder.
    fn empty(&self) -> std::io::Result<()> {
        let _ = rustix::fs::fchmod(&self.fd, Mode::from_raw_mode(0o700));
        for name in self.names()? {
            self.remove(&name)?;
        }
        Ok(())
    }

    /// Sets the folder's own mode.
    pub fn set_mode(&self, mode: u32) -> std::io::Result<()> {
        Ok(rustix::fs::fchmod(&self.fd, Mode::from_raw_mode(mode))?)
    }
}

/// `e`, said plainly when it is a link cibox would not follow (`ELOOP` from
/// `O_NOFOLLOW`, `ENOTDIR` for a link where a folder should be).
pub fn said_of_links(e: std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(nix::libc::ELOOP) | Some(nix::libc::ENOTDIR) => std::io::Error::new(
            e.kind(),
            "a symbolic link (or a file where a folder should be): cibox never reads or writes through a link here; put the file itself in its place",
        ),
        _ => e,
    }
}

/// Why `dir` is not a folder only root and the invoking user can change (it, or a
/// folder on the way to it, is someone else's, or others may write it without the
/// sticky bit keeping their hands off our names); `None` when it is one.
pub fn trusted_folder(dir: &Path) -> Option<String> {
    let me = nix::unistd::geteuid().as_raw();
    // The folder itself counts as one on the way to what cibox writes in it.
    crate::ownership::changeable_by_others(&dir.join(".cibox"), me)
}

/// Removes whatever has `path`'s name, a folder the batch made there included.
pub fn clear(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => remove_tree(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes a tree a batch wrote, making its folders passable first (a batch can leave
/// one at mode 000, which would stop a plain removal halfway). A link is removed, not
/// followed.
pub fn remove_tree(dir: &Path) -> std::io::Result<()> {
    let md = std::fs::symlink_metadata(dir)?;
    if !md.is_dir() {
        return std::fs::remove_file(dir);
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700));
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    std::fs::remove_dir_all(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_writes_by_name_and_never_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let precious = tmp.path().join("precious");
        std::fs::write(&precious, "keep").unwrap();
        let reports = tmp.path().join("reports");
        std::fs::create_dir(&reports).unwrap();
        let folder = Folder::open(&reports).unwrap();
        std::os::unix::fs::symlink(&precious, reports.join("summary.md")).unwrap();
        folder.write_replacing("summary.md", b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
        assert_eq!(
            std::fs::read_to_string(reports.join("summary.md")).unwrap(),
            "new"
        );
        // A new file is refused where a link has the name.
        std::os::unix::fs::symlink(&precious, reports.join("junit.xml")).unwrap();
        assert!(folder.create_new("junit.xml", 0o644).is_err());
        // A folder opened, then swapped for a link: writes still land in the folder.
        let batch = folder.make_dir("b", 0o755).unwrap();
        std::fs::rename(reports.join("b"), tmp.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), reports.join("b")).unwrap();
        batch.write_replacing("result.json", b"{}").unwrap();
        assert!(tmp.path().join("moved/result.json").exists());
        assert!(!tmp.path().join("result.json").exists());
        // Opening a link to a folder is refused; so are names that are paths.
        assert!(folder.open_dir("b").is_err());
        assert!(folder.create_new("../x", 0o644).is_err());
        // A tree is removed, a link in it unlinked, not followed.
        let t = folder.make_path(Path::new("t/u"), 0o755).unwrap();
        std::os::unix::fs::symlink(tmp.path(), reports.join("t/u/out")).unwrap();
        drop(t);
        folder.remove("t").unwrap();
        assert!(!reports.join("t").exists());
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
    }

    #[test]
    fn a_folder_another_user_owns_is_not_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        assert_eq!(trusted_folder(&theirs), None);
        std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
        let why = trusted_folder(&theirs).unwrap();
        assert!(why.contains("owned by uid 65534"), "{why}");
    }

    #[test]
    fn an_unreadable_folder_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("d");
        std::fs::create_dir_all(d.join("shut/inner")).unwrap();
        std::fs::set_permissions(d.join("shut"), std::fs::Permissions::from_mode(0o000)).unwrap();
        remove_tree(&d).unwrap();
        assert!(!d.exists());
    }
}
