//! `<reports>/<batch>/`: cibox's folder for one batch, made fresh for each run. The
//! batch never writes there: cibox copies what is safe out of the container's own
//! `/reports` ([`crate::run::copy`]) and writes `log.txt` and `result.json` beside it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::nofollow;
use crate::run::error::RunError;

/// Marks a batch folder as cibox's from the moment it is made, so that the folder of a
/// run that was killed (no `result.json` yet) is still known to be ours.
pub const MARKER: &str = ".cibox-batch";

/// Refuses a `<reports>/<batch>/` that holds files cibox did not write (it is replaced
/// by the run). Checked for every batch before the first starts.
pub fn refuse_foreign(dir: &Path) -> Result<(), crate::error::Error> {
    let ours = !dir.exists()
        || dir.join(MARKER).exists()
        || std::fs::symlink_metadata(dir.join("result.json")).is_ok()
        || std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
    if !ours {
        return Err(RunError::ForeignBatchDir {
            dir: dir.display().to_string(),
        }
        .into());
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

/// Makes `dir` fresh for a batch: what an earlier run left is removed (a folder an
/// older cibox let a batch make unreadable included), and the new folder is cibox's,
/// open to readers.
pub fn prepare(dir: &Path) -> Result<(), crate::error::Error> {
    refuse_foreign(dir)?;
    if std::fs::symlink_metadata(dir).is_ok() {
        nofollow::remove_tree(dir).map_err(error(dir, "clear"))?;
    }
    std::fs::create_dir_all(dir).map_err(error(dir, "create"))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(error(dir, "create"))?;
    nofollow::create_fresh(&dir.join(MARKER)).map_err(error(dir, "write in"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_fresh_folder_replaces_what_an_earlier_run_left() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("b");
        prepare(&dir).unwrap();
        std::os::unix::fs::symlink("/", dir.join("hostroot")).unwrap();
        std::fs::create_dir(dir.join("shut")).unwrap();
        std::fs::write(dir.join("shut/r.xml"), "<x/>").unwrap();
        std::fs::set_permissions(dir.join("shut"), std::fs::Permissions::from_mode(0o000)).unwrap();
        prepare(&dir).unwrap();
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "only the marker"
        );
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o755);
    }
}
