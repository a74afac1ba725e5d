//! `<reports>/<batch>/`: cibox's folder for one batch, made fresh for each run. The
//! batch never writes there: cibox copies what is safe out of the container's own
//! `/reports` ([`crate::run::copy`]) and writes `log.txt` and `result.json` beside it.

use std::path::{Path, PathBuf};

use crate::nofollow::{self, Folder};
use crate::run::error::RunError;

pub use crate::report::record::BATCH_MARKER as MARKER;

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

/// The run's reports folder, held open: made (below the nearest folder that exists)
/// when missing, and refused unless it and every folder on the way to it are ones only
/// root and the invoking user can change, so that nobody else can plant a link where
/// cibox writes, or swap a folder it writes in.
pub fn reports_folder(path: &Path) -> Result<Folder, crate::error::Error> {
    // Judged from `/` down: a relative name (`cibox-qualify`) has no folders above it
    // to check, and `""` cannot be read.
    let mut at = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut missing: Vec<std::ffi::OsString> = Vec::new();
    while std::fs::symlink_metadata(&at).is_err() {
        let (Some(parent), Some(name)) = (at.parent().map(PathBuf::from), at.file_name()) else {
            break;
        };
        missing.push(name.to_os_string());
        at = parent;
    }
    if let Some(why) = nofollow::trusted_folder(&at) {
        return Err(RunError::UntrustedReports {
            dir: path.display().to_string(),
            why,
        }
        .into());
    }
    let top = Folder::open(&at).map_err(error(&at, "open"))?;
    let rest: PathBuf = missing.iter().rev().collect();
    top.make_path(&rest, 0o755)
        .map_err(error(path, "create"))
        .map_err(Into::into)
}

/// Makes the batch's folder `dir` (below the reports folder `root`, held open as
/// `reports`) fresh: what an earlier run left is removed (a folder an older cibox let a
/// batch make unreadable included), and the new folder is cibox's, open to readers,
/// held open for the batch's files.
pub fn prepare(reports: &Folder, root: &Path, dir: &Path) -> Result<Folder, crate::error::Error> {
    prepare_as(reports, root, dir, true)
}

/// The batch's folder on a Slurm node: the submitter made it fresh (and writes the
/// batch's `log.txt` and `result.json` in it), so what is there stays; made only when
/// missing (a batch's rank folder, `node-<rank>/`).
pub fn prepare_on_node(
    reports: &Folder,
    root: &Path,
    dir: &Path,
) -> Result<Folder, crate::error::Error> {
    prepare_as(reports, root, dir, false)
}

fn prepare_as(
    reports: &Folder,
    root: &Path,
    dir: &Path,
    fresh: bool,
) -> Result<Folder, crate::error::Error> {
    refuse_foreign(dir)?;
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name().and_then(|n| n.to_str()))
    else {
        return Err(error(dir, "create")(std::io::Error::other(
            "not a folder below the reports folder",
        ))
        .into());
    };
    let parent = reports
        .make_path(parent, 0o755)
        .map_err(error(dir, "create"))?;
    if fresh {
        parent.remove(name).map_err(error(dir, "clear"))?;
    }
    let folder = parent.make_dir(name, 0o755).map_err(error(dir, "create"))?;
    folder.set_mode(0o755).map_err(error(dir, "create"))?;
    folder
        .create_fresh(MARKER)
        .map_err(error(dir, "write in"))?;
    Ok(folder)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn a_fresh_folder_replaces_what_an_earlier_run_left() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("b");
        let reports = reports_folder(tmp.path()).unwrap();
        prepare(&reports, tmp.path(), &dir).unwrap();
        std::os::unix::fs::symlink("/", dir.join("hostroot")).unwrap();
        std::fs::create_dir(dir.join("shut")).unwrap();
        std::fs::write(dir.join("shut/r.xml"), "<x/>").unwrap();
        std::fs::set_permissions(dir.join("shut"), std::fs::Permissions::from_mode(0o000)).unwrap();
        prepare(&reports, tmp.path(), &dir).unwrap();
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "only the marker"
        );
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o755);
    }
}
