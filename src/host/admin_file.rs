//! Files only the host's administrator may change (the policy, seccomp profiles): who
//! must own them, and how much of one is read.

use std::path::Path;

use crate::ownership;

/// The largest policy read: a policy is a few dozen lines.
const MAX_BYTES: u64 = 1 << 20;

/// The file's bytes, at most [`MAX_BYTES`].
pub fn read_small(real: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let (file, _) =
        crate::util::open_plain(real, false).map_err(|e| format!("cannot read it: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(format!(
            "is over {} KiB; a policy is a few dozen lines",
            MAX_BYTES >> 10
        ));
    }
    Ok(bytes)
}

/// The policy file and every folder on the way to it: only root or the invoking user
/// can change them (see [`ownership::changeable_by_others`]), and the file itself is a
/// plain file neither group nor others may write.
pub fn trusted_file(real: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let md = std::fs::symlink_metadata(real).map_err(|e| e.to_string())?;
    if !md.is_file() {
        return Err("is not a plain file".into());
    }
    let owner_ok = md.uid() == 0 || md.uid() == me;
    let loose = md.mode() & 0o022 != 0 || ownership::has_access_acl(real);
    if !owner_ok || loose {
        return Err(format!(
            "is {} with mode {:o}: a policy must be owned by root{} and writable by nobody else; fix it with chown root and chmod go-w",
            ownership::owner_of(md.uid()),
            md.mode() & 0o7777,
            if me == 0 {
                String::new()
            } else {
                format!(" or you (uid {me})")
            }
        ));
    }
    if let Some(why) = ownership::changeable_by_others(real, me) {
        return Err(why);
    }
    Ok(())
}
