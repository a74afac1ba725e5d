//! File operations in folders that someone else may write too (a batch's reports
//! folder, which its container can change while cibox works there): nothing found there
//! is followed. A planted symlink is removed or refused, never written through, and a
//! folder a batch left unreadable is still removed.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Creates `path` as a new file, first removing whatever has that name. A container
/// that can write the folder could have planted a symlink there (to `/etc/passwd`,
/// say); removing unlinks the symlink itself, and creating with `O_EXCL` refuses, rather
/// than follows, one planted in between.
pub fn create_fresh(path: &Path) -> std::io::Result<std::fs::File> {
    clear(path)?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
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
    fn a_planted_link_is_replaced_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("precious");
        std::fs::write(&target, "keep").unwrap();
        let planted = tmp.path().join("result.json");
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        use std::io::Write;
        create_fresh(&planted).unwrap().write_all(b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&planted).unwrap(), "new");
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
