//! Writing a start for a project (`cibox init`): a commented `cibox.yaml` from what is found in
//! it (lock files, test files by the GPUs they declare: [`crate::starter`]), an image
//! recipe stub, and workflow templates for the patterns the README recommends (CPU on
//! every pull request, GPU on the approved-commit pattern, a scheduled cache warm-up),
//! which render and lint clean; the reports folders added to `.gitignore`.
//! It never overwrites a file: what exists is left as it is, and said. It writes nothing
//! through a link: a folder it writes into that is one (a checkout's committed `.github`
//! leading outside it) is refused before anything is written, and what it writes is made
//! name by name in folders held open, never following one ([`crate::nofollow`]).

use std::path::{Path, PathBuf};

use super::{Found, MARKER, templates, text};
use crate::console;
use crate::error::{ErrorKind, Result};
use crate::exit::Failure;
use crate::nofollow::Folder;

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("cannot read the current folder: {0}")]
    CurrentFolder(#[source] std::io::Error),
    #[error(
        "{}: {what}; cibox init writes nothing through a link or in place of a folder, and wrote nothing",
        .path.display()
    )]
    Link { path: PathBuf, what: String },
    #[error("writing {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ErrorKind for InitError {
    fn failure(&self) -> Failure {
        match self {
            InitError::CurrentFolder(_) | InitError::Link { .. } => Failure::Usage,
            InitError::Write { .. } => Failure::Infra,
        }
    }
}

/// Writes a start for the project at `root` (its git root, else the current folder),
/// saying on stderr what it found and wrote.
pub fn init(root: &Path) -> Result<()> {
    let root = root.to_path_buf();
    let found = super::look(&root);
    say_found(&found);
    let files: [(&str, String); 5] = [
        ("cibox.yaml", text::manifest(&found)),
        (text::RECIPE, text::recipe(&found)),
        (
            ".github/workflows/cibox-cpu.yml.j2",
            templates::CPU_TEMPLATE.to_string(),
        ),
        (
            ".github/workflows/cibox-gpu.yml.j2",
            templates::GPU_TEMPLATE.to_string(),
        ),
        (
            ".github/workflows/cibox-warm-up.yml.j2",
            templates::WARM_UP_TEMPLATE.to_string(),
        ),
    ];
    // Every folder on the way first: a link among them writes nothing at all.
    for (rel, _) in &files {
        no_link_on_the_way(&root, Path::new(rel))?;
    }
    let folder = Folder::open(&root).map_err(|source| InitError::Write {
        path: root.clone(),
        source: crate::nofollow::said_of_links(source),
    })?;
    let mut wrote = 0;
    for (rel, text) in &files {
        let path = root.join(rel);
        if std::fs::symlink_metadata(&path).is_ok() {
            console::info(format!("{rel} exists: left as it is"));
            continue;
        }
        write_new(&folder, Path::new(rel), &path, text)?;
        console::info(format!("wrote {rel}"));
        wrote += 1;
    }
    ignore_outputs(&folder);
    if wrote > 0 {
        console::info(format!(
            "next: edit the FROM line of {}, then `cibox batch list`, `cibox image build`, `cibox workflow render` and `cibox workflow lint`",
            text::RECIPE
        ));
    }
    console::info(format!("the rendered workflows need: {}", templates::NEEDS));
    Ok(())
}

/// Says what was found: each lock file, and the tests by the GPUs they declare.
fn say_found(found: &Found) {
    if found.locks.is_empty() {
        console::info("lock files: none found (the recipe is the image's only lock file)");
    }
    for lock in &found.locks {
        console::info(format!("lock file: {lock}"));
    }
    if !found.has_tests() {
        console::info("tests: no pytest files (test_*.py, *_test.py) found");
        return;
    }
    console::info(format!(
        "tests: {} without GPUs (batch unit)",
        found.cpu_tests.len()
    ));
    for (n, files) in &found.gpu_tests {
        console::info(format!(
            "tests: {} declaring {} = {n} (batch {})",
            files.len(),
            MARKER,
            text::gpu_batch(*n)
        ));
    }
}

/// The folders cibox writes its reports into, ignored by git: added to `.gitignore`
/// (made when missing), never through a link (then only said).
fn ignore_outputs(root: &Folder) {
    const NAME: &str = ".gitignore";
    let wanted = ["/cibox-reports/", "/cibox-reproduce/", "/cibox-qualify/"];
    let result = root.read_text(NAME, 1 << 20).and_then(|text| {
        let text = text.unwrap_or_default();
        let have: Vec<&str> = text.lines().map(str::trim).collect();
        let missing: Vec<&str> = wanted
            .iter()
            .copied()
            .filter(|w| !have.contains(w) && !have.contains(&w.trim_start_matches('/')))
            .collect();
        if missing.is_empty() {
            return Ok(false);
        }
        let mut new = text.clone();
        if !new.is_empty() && !new.ends_with('\n') {
            new.push('\n');
        }
        new.push_str("# cibox's reports (cibox init)\n");
        for m in missing {
            new.push_str(m);
            new.push('\n');
        }
        root.write_replacing(NAME, new.as_bytes()).map(|()| true)
    });
    match result {
        Ok(true) => console::info("wrote .gitignore: cibox's reports folders ignored"),
        Ok(false) => {}
        Err(e) => console::warn(format!(
            ".gitignore: {}; add /cibox-reports/, /cibox-reproduce/ and /cibox-qualify/ yourself",
            crate::nofollow::said_of_links(e)
        )),
    }
}

/// Refuses a folder on the way to `rel` (below `root`) that is a link, or not a folder.
fn no_link_on_the_way(root: &Path, rel: &Path) -> Result<()> {
    let mut at = PathBuf::new();
    for part in rel.parent().into_iter().flat_map(Path::components) {
        at.push(part);
        let what = match std::fs::symlink_metadata(root.join(&at)) {
            Err(_) => return Ok(()), // not there: made by init, below nothing else
            Ok(md) if md.is_dir() => continue,
            Ok(md) if md.file_type().is_symlink() => {
                let target = std::fs::read_link(root.join(&at)).unwrap_or_default();
                format!(
                    "a symbolic link (to {}) where init writes in a folder",
                    crate::util::escape(&target.to_string_lossy())
                )
            }
            Ok(_) => "not a folder, where init writes in one".to_string(),
        };
        return Err(InitError::Link { path: at, what }.into());
    }
    Ok(())
}

/// Writes `text` as the new file `rel` of `root` (never over one, `shown` in errors),
/// making its folders, each name made or opened in the folder before it, no link
/// followed.
fn write_new(root: &Folder, rel: &Path, shown: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let io = |source| InitError::Write {
        path: shown.to_path_buf(),
        source: crate::nofollow::said_of_links(source),
    };
    // (Init's own names: plain, UTF-8.)
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let folder = match rel.parent() {
        Some(parent) => root.make_path(parent, 0o777).map_err(io)?,
        None => root.try_clone().map_err(io)?,
    };
    folder
        .create_new(name, 0o666)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_on_the_way_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(".github")).unwrap();
        let e = init(dir.path()).unwrap_err().to_string();
        assert!(e.starts_with(".github: a symbolic link (to "), "{e}");
        assert!(e.ends_with("and wrote nothing"), "{e}");
        assert!(!dir.path().join("cibox.yaml").exists());
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }

    #[test]
    fn init_writes_each_file_once_and_ignores_the_reports() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".gitignore"), "target\ncibox-reports/").unwrap();
        std::fs::write(dir.path().join("cibox.yaml"), "# mine\n").unwrap();
        init(dir.path()).unwrap();
        // What existed is left as it is.
        assert_eq!(
            std::fs::read_to_string(dir.path().join("cibox.yaml")).unwrap(),
            "# mine\n"
        );
        assert!(
            dir.path()
                .join(".github/workflows/cibox-gpu.yml.j2")
                .is_file()
        );
        let ignored = std::fs::read_to_string(dir.path().join(".gitignore")).unwrap();
        assert_eq!(
            ignored,
            "target\ncibox-reports/\n# cibox's reports (cibox init)\n/cibox-reproduce/\n/cibox-qualify/\n"
        );
        // A second run adds nothing.
        init(dir.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(".gitignore")).unwrap(),
            ignored
        );
    }
}
