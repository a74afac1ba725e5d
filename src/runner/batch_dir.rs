//! `<reports>/<batch>/`: the one host folder a batch can write (`/reports`). It is
//! cibox's: made fresh for each run, shut to everyone but cibox and the batch while the
//! batch runs, and cleaned once the container is gone, so that what the batch left
//! cannot hurt whoever reads the folder next (an artifact upload, a person): no
//! symlink (`hostroot -> /`), FIFO, socket or device survives, and no setuid or setgid
//! bit (a batch could otherwise leave a setuid program for any local user to run).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::error::RunError;

/// Marks a batch folder as cibox's from the moment it is made, so that the folder of a
/// run that was killed (no `result.json` yet) is still known to be ours.
pub const MARKER: &str = ".cibox-batch";

/// Refuses a `<reports>/<batch>/` that holds files cibox did not write (it is replaced
/// by the run). Checked for every batch before the first starts.
pub fn check(dir: &Path) -> Result<(), RunError> {
    let ours = !dir.exists()
        || dir.join(MARKER).exists()
        || std::fs::symlink_metadata(dir.join("result.json")).is_ok()
        || std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
    if !ours {
        return Err(RunError::ForeignBatchDir {
            dir: dir.display().to_string(),
        });
    }
    Ok(())
}

fn error(dir: &Path, what: &'static str) -> impl Fn(std::io::Error) -> RunError {
    let dir = dir.display().to_string();
    move |source| RunError::BatchDir {
        dir: dir.clone(),
        what,
        source,
    }
}

/// Makes `dir` fresh for a batch that runs as `user`: what an earlier run left is
/// removed (a folder the batch made unreadable included), and the new folder is open
/// only to cibox and the batch: `root:<batch group>` mode 1770 when cibox is root (the
/// sticky bit keeps the batch from replacing cibox's own files there), else mode 0700.
pub fn prepare(dir: &Path, user: (u32, u32)) -> Result<(), RunError> {
    check(dir)?;
    if std::fs::symlink_metadata(dir).is_ok() {
        remove_tree(dir).map_err(error(dir, "clear"))?;
    }
    std::fs::create_dir_all(dir).map_err(error(dir, "create"))?;
    let root = nix::unistd::geteuid().is_root();
    if root {
        nix::unistd::chown(dir, None, Some(user.1.into()))
            .map_err(|e| error(dir, "hand over")(e.into()))?;
    }
    let mode = if root { 0o1770 } else { 0o700 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(error(dir, "hand over"))?;
    super::record::create_fresh(&dir.join(MARKER)).map_err(error(dir, "write in"))?;
    Ok(())
}

/// Removes a tree a batch wrote, making its folders passable first (a batch can leave
/// one at mode 000, which would stop a plain removal halfway).
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

/// What cleaning a batch folder did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cleaned {
    /// Symlinks, FIFOs, sockets and devices removed.
    pub removed: usize,
    /// Files and folders whose mode was cut back (setuid, setgid, sticky, others' write).
    pub modes_fixed: usize,
}

/// Cleans what the batch left in `dir`, once its container is gone (never while it
/// could still write there): removes every entry that is not a plain file or a folder,
/// gives files mode 0644 (0755 if any execute bit was set) and folders 0755, and opens
/// `dir` itself to readers (0755). Nothing is followed. An entry that cannot be cleaned
/// (a tree deeper than a path can name, say) is removed whole.
pub fn clean(dir: &Path) -> std::io::Result<Cleaned> {
    let mut cleaned = Cleaned::default();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(_) => {
                // A folder the batch shut: open it for us, then read it; failing that,
                // it goes.
                match std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
                    .and_then(|()| std::fs::read_dir(&d))
                {
                    Ok(e) => e,
                    Err(_) if d != dir => {
                        remove_whole(&d)?;
                        cleaned.removed += 1;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        for e in entries.flatten() {
            let p = e.path();
            match clean_entry(&p, &mut cleaned) {
                Ok(true) => stack.push(p),
                Ok(false) => {}
                Err(_) => {
                    remove_whole(&p)?;
                    cleaned.removed += 1;
                }
            }
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    Ok(cleaned)
}

/// Cleans one entry; whether it is a folder to descend into.
fn clean_entry(p: &Path, cleaned: &mut Cleaned) -> std::io::Result<bool> {
    let md = std::fs::symlink_metadata(p)?;
    let ft = md.file_type();
    let mode = md.mode() & 0o7777;
    let wanted = if ft.is_dir() {
        0o755
    } else if ft.is_file() {
        if mode & 0o111 != 0 { 0o755 } else { 0o644 }
    } else {
        std::fs::remove_file(p)?;
        cleaned.removed += 1;
        return Ok(false);
    };
    if mode != wanted {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(wanted))?;
        if mode & 0o7022 != 0 {
            cleaned.modes_fixed += 1;
        }
    }
    Ok(ft.is_dir())
}

/// Removes `p` whatever it is (std's removal works relative to open folders, so depth
/// does not stop it, and never follows a link).
fn remove_whole(p: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(md) if md.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleaning_leaves_only_plain_files_and_folders_without_special_bits() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("b");
        prepare(&dir, (65534, 65534)).unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/tool"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            dir.join("sub/tool"),
            std::fs::Permissions::from_mode(0o4755),
        )
        .unwrap();
        std::fs::write(dir.join("open"), "x").unwrap();
        std::fs::set_permissions(dir.join("open"), std::fs::Permissions::from_mode(0o666)).unwrap();
        std::os::unix::fs::symlink("/", dir.join("hostroot")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", dir.join("sub/x.xml")).unwrap();
        nix::unistd::mkfifo(
            &dir.join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        std::fs::create_dir(dir.join("shut")).unwrap();
        std::fs::write(dir.join("shut/r.xml"), "<x/>").unwrap();
        std::fs::set_permissions(dir.join("shut"), std::fs::Permissions::from_mode(0o000)).unwrap();
        let cleaned = clean(&dir).unwrap();
        assert_eq!(cleaned.removed, 3);
        let mode = |p: &str| std::fs::metadata(dir.join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("sub/tool"), 0o755, "no setuid bit survives");
        assert_eq!(mode("open"), 0o644);
        assert_eq!(mode("shut"), 0o755);
        assert_eq!(mode(""), 0o755);
        assert!(std::fs::symlink_metadata(dir.join("hostroot")).is_err());
        // The next run replaces the folder, a shut subfolder included.
        std::fs::set_permissions(dir.join("shut"), std::fs::Permissions::from_mode(0o000)).unwrap();
        prepare(&dir, (65534, 65534)).unwrap();
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "only the marker"
        );
    }
}
