//! Who can change a path: its owner and the folders on the way to it. A path that
//! someone other than root and the invoking user could swap for a link (or whose file
//! they could rewrite) between cibox's check and its use is not one cibox trusts for
//! anything that matters: a host mount, the host policy.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// "uid 1001 (mallory)", or "uid 1001" without a name.
pub fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(uid.into()).ok().flatten() {
        Some(u) => format!("uid {uid} ({})", u.name),
        None => format!("uid {uid}"),
    }
}

/// "owned by uid 1001 (mallory)".
pub fn owner_of(uid: u32) -> String {
    format!("owned by {}", user_name(uid))
}

/// Why someone other than root and `me` could replace `real` (or a folder on the way to
/// it) with a symlink between this check and the engine's mount; `None` when nobody can.
/// A folder anyone (or a group other than root's) may write is safe only when sticky
/// and the entry on the way is root's or `me`'s: then only they may rename it.
pub fn changeable_by_others(real: &Path, me: u32) -> Option<String> {
    let trusted = |uid: u32| uid == 0 || uid == me;
    let mut ancestors: Vec<&Path> = real.ancestors().skip(1).collect();
    ancestors.reverse();
    for dir in ancestors {
        let Ok(md) = std::fs::symlink_metadata(dir) else {
            return Some(format!(
                "cannot be checked: {} cannot be read",
                dir.display()
            ));
        };
        if !trusted(md.uid()) {
            return Some(format!(
                "lies in {}, owned by uid {}: they could swap it for a link elsewhere after this check; use a folder root or you (uid {me}) own",
                dir.display(),
                md.uid()
            ));
        }
        // With an access ACL the group bits are its mask: some named user or group
        // may write whenever the mask allows it, whoever owns the folder.
        let acl = has_access_acl(dir);
        let others_write =
            md.mode() & 0o002 != 0 || (md.mode() & 0o020 != 0 && (md.gid() != 0 || acl));
        if !others_write {
            continue;
        }
        let sticky = md.mode() & 0o1000 != 0;
        // The entry on the way down from `dir`.
        let next = real
            .strip_prefix(dir)
            .ok()
            .and_then(|rest| rest.components().next())
            .map(|c| dir.join(c));
        let next_trusted = next
            .as_deref()
            .and_then(|n| std::fs::symlink_metadata(n).ok())
            .is_some_and(|n| trusted(n.uid()));
        if !(sticky && next_trusted) {
            return Some(format!(
                "lies in {} (mode {:o}), which others may write: they could swap it for a link elsewhere after this check; use a folder only root or you (uid {me}) can change",
                dir.display(),
                md.mode() & 0o7777
            ));
        }
    }
    None
}

/// Whether `dir` has a POSIX access ACL beyond its mode bits (the
/// `system.posix_acl_access` attribute; a minimal ACL is not stored). Unknown counts
/// as yes: the check fails closed.
pub fn has_access_acl(dir: &Path) -> bool {
    // Of `dir` itself, not what a link there leads to (lgetxattr).
    match xattr::get(dir, "system.posix_acl_access") {
        Ok(Some(_)) => true,
        // No such attribute (ENODATA).
        Ok(None) => false,
        // A filesystem without ACLs (or attributes).
        Err(e) => e.raw_os_error() != Some(nix::libc::EOPNOTSUPP),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_others_may_change_are_refused() {
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(changeable_by_others(Path::new("/usr/bin"), me), None);
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        let data = open.join("data");
        std::fs::create_dir_all(&data).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let why = changeable_by_others(&data, me).unwrap();
        assert!(why.contains("(mode 777), which others may write"), "{why}");
        // Sticky, and the entry on the way is ours: nobody else may rename it.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(changeable_by_others(&data, me), None);
    }
}
