//! The build context of a Dockerfile recipe: its folder, less what its `.dockerignore`
//! excludes, packed into a tar the engine reads.
//!
//! The rules are Docker's own (moby's `dockerignore` reader and `patternmatcher`), so
//! `cibox image build` sends what `docker build` sends and `COPY . …` copies the same
//! files: one pattern per line, `#` starts a comment line, patterns are cleaned like
//! paths and taken relative to the context root, `*` and `?` stay within a path
//! segment, `**` spans any number of them, `[…]` is a class (`[^…]` negated), `\`
//! escapes, `!` re-includes, the last matching pattern wins, and a pattern that matches
//! a folder excludes what is inside it. The Dockerfile and `.dockerignore` themselves are always sent, as the
//! docker CLI does (the engine drops them again where they are excluded).
//!
//! A git config in the context (`.git/config` and the others a batch's source copy
//! masks, of nested checkouts and submodules too) is sent cleaned, as a batch reads it
//! ([`crate::git_mask`]): `actions/checkout` leaves the job's token in it, and a
//! `COPY .git/config` (or `COPY . …`) must not put that in an image.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use regex::Regex;

use crate::exit::Failure;

/// One `.dockerignore` pattern.
#[derive(Debug)]
struct Pattern {
    /// `!pattern`: re-includes what earlier patterns excluded.
    exception: bool,
    /// The cleaned pattern, as written after `!` (for the folder-pruning check).
    text: String,
    regex: Regex,
}

/// The patterns of a `.dockerignore`, in order.
#[derive(Debug, Default)]
pub struct IgnoreRules {
    patterns: Vec<Pattern>,
}

impl IgnoreRules {
    /// Reads `<dir>/.dockerignore` (`dir` a folder of the manifest's folder `root`,
    /// both as `canonicalize` gives them), at most [`MAX_IGNORE`] bytes; no file means
    /// no rules, as for `docker build`. A plain file, or a link to one in `root`
    /// (SGLang's is a link to its `.gitignore`), read through the link with every
    /// folder on the way opened without following a link: the context is a pull
    /// request's, and a link could name any file of the host. Errors name the file
    /// and line.
    pub fn read(root: &Path, dir: &Path) -> Result<IgnoreRules, String> {
        let path = dir.join(".dockerignore");
        let text = match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("{}: cannot read: {e}", path.display())),
            Ok(md) if md.file_type().is_symlink() => read_linked(root, dir, &path)?,
            Ok(_) => read_plain(&path)?,
        };
        let Some(text) = text else {
            return Ok(Self::default());
        };
        Self::parse(&text).map_err(|(line, e)| format!("{}:{line}: {e}", path.display()))
    }

    /// Parses the text of a `.dockerignore`; an error carries its 1-based line.
    pub fn parse(text: &str) -> Result<IgnoreRules, (usize, String)> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut patterns = Vec::new();
        for (n, line) in text.lines().enumerate() {
            // Docker drops comment lines before trimming: " #x" is a pattern.
            if line.starts_with('#') {
                continue;
            }
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let (exception, raw) = match line.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, line),
            };
            if exception && raw.is_empty() {
                return Err((n + 1, "`!` alone is not a pattern".into()));
            }
            let mut text = clean(raw);
            if text.len() > 1 && text.starts_with('/') {
                text.remove(0);
            }
            let regex = compile(&text).map_err(|e| (n + 1, format!("bad pattern `{raw}`: {e}")))?;
            patterns.push(Pattern {
                exception,
                text,
                regex,
            });
        }
        Ok(IgnoreRules { patterns })
    }

    /// Keeps `path` (relative to the context root, `/`-separated) whatever the
    /// patterns say.
    fn keep(&mut self, path: &str) {
        if self.excludes(path) {
            let text = path.to_string();
            let regex = Regex::new(&format!("^{}$", regex::escape(&text)))
                .expect("an escaped literal compiles");
            self.patterns.push(Pattern {
                exception: true,
                text,
                regex,
            });
        }
    }

    /// Whether `path` (relative to the context root, `/`-separated) is left out: the
    /// last pattern that matches it or one of its parent folders decides.
    pub fn excludes(&self, path: &str) -> bool {
        let parents: Vec<&str> = match path.rfind('/') {
            Some(i) => path[..i].split('/').collect(),
            None => Vec::new(),
        };
        let mut excluded = false;
        for p in &self.patterns {
            // Only an exception can change an exclusion, and only an exclusion can
            // change an inclusion.
            if p.exception != excluded {
                continue;
            }
            let matched = p.regex.is_match(path)
                || (1..=parents.len()).any(|i| p.regex.is_match(&parents[..i].join("/")));
            if matched {
                excluded = !p.exception;
            }
        }
        excluded
    }

    /// Whether an excluded folder must still be walked, because an exception might
    /// re-include something inside it.
    fn may_reinclude_under(&self, dir: &str) -> bool {
        let prefix = format!("{dir}/");
        self.patterns
            .iter()
            .any(|p| p.exception && format!("{}/", p.text).starts_with(&prefix))
    }
}

/// Go's `filepath.Clean` for `/`-separated paths: no empty or `.` segments, `..`
/// resolved where it can be, no trailing slash.
fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|s| *s != "..") {
                    out.pop();
                } else if !rooted {
                    out.push("..");
                }
            }
            s => out.push(s),
        }
    }
    let joined = out.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

/// A pattern as a regex anchored at both ends, as moby's `patternmatcher` builds it.
fn compile(pattern: &str) -> Result<Regex, String> {
    let mut re = String::from("^");
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' if chars.peek() == Some(&'*') => {
                chars.next();
                // `**/` is `**`.
                if chars.peek() == Some(&'/') {
                    chars.next();
                }
                re.push_str(if chars.peek().is_none() {
                    ".*"
                } else {
                    "(.*/)?"
                });
            }
            '*' => re.push_str("[^/]*"),
            '?' => re.push_str("[^/]"),
            '\\' => match chars.next() {
                Some(next) => re.push_str(&regex::escape(&next.to_string())),
                None => return Err("ends with a lone `\\`".into()),
            },
            // Docker escapes only these; the rest (classes `[…]`, `^`) pass through
            // to the regex as they are.
            '.' | '+' | '(' | ')' | '|' | '{' | '}' | '$' => {
                re.push('\\');
                re.push(c);
            }
            c => re.push(c),
        }
    }
    re.push('$');
    Regex::new(&re).map_err(|_| "not a valid pattern (check its `[…]` classes)".into())
}

/// The most a `.dockerignore` may hold.
const MAX_IGNORE: u64 = 1 << 20;

/// The plain file `path` (not a link), or `None` when nothing is there.
fn read_plain(path: &Path) -> Result<Option<String>, String> {
    let file = match crate::util::open_plain(path, false) {
        Ok((file, md)) if md.len() <= MAX_IGNORE => file,
        Ok(_) => return Err(format!("{}: over 1 MiB", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
            return Err(format!(
                "{}: a link; a .dockerignore must be a plain file",
                path.display()
            ));
        }
        Err(e) => return Err(format!("{}: cannot read: {e}", path.display())),
    };
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_IGNORE), &mut bytes)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// The file the link `path` (in `dir`, below `root`) leads to, when it is a plain file
/// of `root`: the link's target walked one name at a time from the folders held open
/// (`..` the folder held before, never above `root`), none of them a link, nor the
/// file. `None` when nothing is there (a dangling link, as `docker build` reads it).
fn read_linked(root: &Path, dir: &Path, path: &Path) -> Result<Option<String>, String> {
    use std::path::Component;
    let shown = path.display();
    let target = std::fs::read_link(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    let to = target.display();
    let out = || {
        format!(
            "{shown}: a link leading out of the manifest's folder (to {to}); a .dockerignore must be a file of the repository"
        )
    };
    let cannot = |e: std::io::Error| {
        let why = if e.raw_os_error() == Some(nix::libc::ELOOP) {
            "it leads through another link".to_string()
        } else {
            e.to_string()
        };
        format!("{shown}: a link to {to}, which cannot be read: {why}")
    };
    // The folders from `root` to where the walk is, each held open.
    let from = if target.is_absolute() {
        target.strip_prefix(root).map_err(|_| out())?.to_path_buf()
    } else {
        dir.strip_prefix(root).map_err(|_| out())?.join(&target)
    };
    let mut folders = vec![crate::nofollow::Folder::open(root).map_err(cannot)?];
    let mut names: Vec<Component<'_>> = from.components().collect();
    let Some(Component::Normal(file)) = names.pop() else {
        return Err(format!("{shown}: a link to {to}, not to a file"));
    };
    for c in names {
        match c {
            Component::Normal(name) => {
                let name = name.to_str().ok_or_else(|| cannot(not_utf8()))?;
                let at = folders.last().expect("root");
                match at.open_dir(name) {
                    Ok(f) => folders.push(f),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    // O_NOFOLLOW | O_DIRECTORY on a link: ENOTDIR.
                    Err(e) => {
                        let link = matches!(at.kind(name), Ok(Some(k)) if k.is_symlink());
                        return Err(cannot(if link {
                            std::io::Error::from_raw_os_error(nix::libc::ELOOP)
                        } else {
                            e
                        }));
                    }
                }
            }
            Component::ParentDir if folders.len() > 1 => {
                folders.pop();
            }
            Component::ParentDir => return Err(out()),
            _ => {}
        }
    }
    let file = file.to_str().ok_or_else(|| cannot(not_utf8()))?;
    match folders.last().expect("root").read_text(file, MAX_IGNORE) {
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            Err(format!("{shown}: a link to {to}, over 1 MiB"))
        }
        other => other.map_err(cannot),
    }
}

fn not_utf8() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a UTF-8 name")
}

/// Why a build context cannot be packed.
#[derive(Debug, thiserror::Error)]
pub enum BuildContextError {
    /// `.dockerignore` cannot be read or parsed.
    #[error("{0}")]
    Ignore(String),
    #[error("cannot read build context {dir}: {source}")]
    Unreadable {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot pack build context {dir}: {source}")]
    Pack {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    /// The walk for nested checkouts gave up: fail closed rather than miss one.
    #[error(
        "build context {dir}: more than {max} folders to look through for git checkouts nested in it, whose .git/config may hold credentials the image would keep; build from a smaller context, or leave out what the image does not need (.dockerignore)"
    )]
    TooManyFolders { dir: String, max: usize },
    #[error("{what}: {source}")]
    TempFile {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl crate::error::ErrorKind for BuildContextError {
    fn failure(&self) -> Failure {
        match self {
            BuildContextError::TempFile { .. } => Failure::Infra,
            _ => Failure::Usage,
        }
    }
}

/// Packs `dir` (a folder of the manifest's folder `root`) into a tar in an unnamed
/// temporary file (streamed to the engine from there), less what `dir/.dockerignore`
/// excludes; `dockerfile` (relative to `dir`) is always included.
pub fn pack(root: &Path, dir: &Path, dockerfile: &str) -> Result<File, BuildContextError> {
    use std::io::Seek;
    let shown = dir.display().to_string();
    let mut rules = IgnoreRules::read(root, dir).map_err(BuildContextError::Ignore)?;
    let configs = cleaned_git_configs(dir)?;
    rules.keep(".dockerignore");
    rules.keep(&clean(dockerfile));
    let file = tempfile::tempfile().map_err(|source| BuildContextError::TempFile {
        what: "cannot create a temporary file",
        source,
    })?;
    let mut builder = tar::Builder::new(file);
    builder.follow_symlinks(false);
    // Complete, not Deterministic: that mode rewrites permissions to 0755/0644 and
    // would lose the sticky /tmp and /work of a rootfs context.
    builder.mode(tar::HeaderMode::Complete);
    let unreadable = |source| BuildContextError::Unreadable {
        dir: shown.clone(),
        source,
    };
    add_folder(&mut builder, dir, "", &rules, &configs).map_err(unreadable)?;
    let mut file = builder
        .into_inner()
        .map_err(|source| BuildContextError::Pack {
            dir: shown.clone(),
            source,
        })?;
    file.rewind()
        .map_err(|source| BuildContextError::TempFile {
            what: "temporary file",
            source,
        })?;
    Ok(file)
}

/// The context's git configs, by their paths in it, each with the text it is sent as.
fn cleaned_git_configs(dir: &Path) -> Result<HashMap<String, String>, BuildContextError> {
    use crate::git_mask::{MaskError, cleaned};
    let configs = cleaned(dir).map_err(|e| match e {
        MaskError::TooManyFolders { max, .. } => BuildContextError::TooManyFolders {
            dir: dir.display().to_string(),
            max,
        },
        MaskError::Write(source) => BuildContextError::Unreadable {
            dir: dir.display().to_string(),
            source,
        },
    })?;
    Ok(configs
        .into_iter()
        .filter_map(|(rel, text)| Some((rel.to_str()?.to_string(), text)))
        .collect())
}

/// Adds what `folder` (at `rel` in the context, `""` for the root) holds, in name
/// order so the same context packs the same way; a git config of `configs` as its
/// cleaned text.
fn add_folder(
    builder: &mut tar::Builder<File>,
    folder: &Path,
    rel: &str,
    rules: &IgnoreRules,
    configs: &HashMap<String, String>,
) -> std::io::Result<()> {
    let mut entries: Vec<(String, PathBuf, std::fs::FileType)> = Vec::new();
    for e in std::fs::read_dir(folder)? {
        let e = e?;
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            return Err(std::io::Error::other(format!(
                "{}: a file name that is not UTF-8",
                e.path().display()
            )));
        };
        entries.push((name, e.path(), e.file_type()?));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, path, kind) in entries {
        let child = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let excluded = rules.excludes(&child);
        if kind.is_dir() {
            if !excluded {
                append_plain(builder, &path, &child, None)?;
                add_folder(builder, &path, &child, rules, configs)?;
            } else if rules.may_reinclude_under(&child) {
                add_folder(builder, &path, &child, rules, configs)?;
            }
        } else if excluded {
            continue;
        } else if kind.is_file() || kind.is_symlink() {
            let text = configs.get(&child).filter(|_| kind.is_file());
            append_plain(builder, &path, &child, text.map(String::as_bytes))?;
        } else {
            append_special(builder, &path, &child)?;
        }
    }
    Ok(())
}

/// A file, folder or symlink as every checkout of the same commit packs it: owned by
/// root, no owner names, time 0, and the mode without group and other write bits (what
/// git checks out under umask 022). The engine's classic builder hashes a `COPY`
/// source with owners and modes, so a runner's uid or umask would otherwise change
/// the image ID. Sticky folders (a rootfs's `/tmp`, `/work`) keep their mode. A file
/// whose content is `instead` (a cleaned git config) is sent with that.
fn append_plain(
    builder: &mut tar::Builder<File>,
    path: &Path,
    name: &str,
    instead: Option<&[u8]>,
) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_username("")?;
    header.set_groupname("")?;
    let mode = header.mode()?;
    if !(meta.is_dir() && mode & 0o1000 != 0) {
        header.set_mode(mode & !0o022);
    }
    if meta.file_type().is_symlink() {
        header.set_size(0);
        let target = std::fs::read_link(path)?;
        builder.append_link(&mut header, name, target)
    } else if meta.is_dir() {
        header.set_size(0);
        builder.append_data(&mut header, name, std::io::empty())
    } else if let Some(text) = instead {
        header.set_size(text.len() as u64);
        builder.append_data(&mut header, name, text)
    } else {
        let file = File::open(path)?;
        builder.append_data(&mut header, name, file)
    }
}

/// A device node or FIFO (a rootfs context has `/dev/console` and the like). Written by
/// hand: the tar crate names special files by their host path, which is absolute.
/// Sockets cannot be archived and are left out, as the docker CLI leaves them out.
fn append_special(
    builder: &mut tar::Builder<File>,
    path: &Path,
    name: &str,
) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::symlink_metadata(path)?;
    let kind = meta.file_type();
    let entry = if kind.is_fifo() {
        tar::EntryType::Fifo
    } else if kind.is_char_device() {
        tar::EntryType::Char
    } else if kind.is_block_device() {
        tar::EntryType::Block
    } else {
        return Ok(()); // a socket
    };
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(entry);
    header.set_size(0);
    if entry != tar::EntryType::Fifo {
        let rdev = meta.rdev();
        header.set_device_major(nix::sys::stat::major(rdev) as u32)?;
        header.set_device_minor(nix::sys::stat::minor(rdev) as u32)?;
    }
    builder.append_data(&mut header, name, std::io::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> IgnoreRules {
        IgnoreRules::parse(text).unwrap()
    }

    #[test]
    fn patterns_match_as_docker_matches_them() {
        // (pattern, path, excluded), after moby's patternmatcher tests.
        let cases = [
            ("**", "file", true),
            ("**", "dir/file", true),
            ("**/", "dir/file", true),
            ("**/**", "dir/file", true),
            ("dir/**", "dir/file", true),
            ("dir/**", "dir/dir2/file", true),
            ("dir/**", "dir", false),
            ("**/file", "file", true),
            ("**/file", "dir/dir/file", true),
            ("**/file*", "dir/dir/file.txt", true),
            ("**/dir", "dir/file", true),
            ("dir/**/file", "dir/file", true),
            ("dir/**/file", "dir/a/b/file", true),
            ("dir/**/file", "dirx/file", false),
            ("*.go", "main.go", true),
            ("*.go", "cmd/main.go", false),
            ("*/*.go", "cmd/main.go", true),
            ("dir/*", "dir/a/b", true),
            ("abc", "abc/def/ghi", true),
            ("abc", "abcd", false),
            ("a?c", "abc", true),
            ("a?c", "a/c", false),
            ("[a-c]x", "bx", true),
            ("[^a-c]x", "bx", false),
            ("[^a-c]x", "dx", true),
            ("a\\*b", "a*b", true),
            ("a\\*b", "axb", false),
            ("./dir/../file", "file", true),
            ("/abs", "abs", true),
            ("dir/", "dir/file", true),
            ("a.b", "axb", false),
            ("(x)+", "(x)+", true),
        ];
        for (pattern, path, want) in cases {
            assert_eq!(rules(pattern).excludes(path), want, "{pattern} vs {path}");
        }
    }

    #[test]
    fn the_last_matching_pattern_wins() {
        let r = rules("# comment\n*.log\n!keep.log\n\n  build  \n!build/out/keep\n");
        assert!(r.excludes("a.log"));
        assert!(!r.excludes("keep.log"));
        assert!(!r.excludes("# comment"));
        assert!(r.excludes("build/x"));
        assert!(!r.excludes("build/out/keep"));
        assert!(r.may_reinclude_under("build"));
        assert!(r.may_reinclude_under("build/out"));
        assert!(!r.may_reinclude_under("other"));
        // Leading space: a pattern, not a comment.
        assert!(rules(" #x").excludes("#x"));
    }

    #[test]
    fn bad_patterns_name_their_line() {
        assert_eq!(IgnoreRules::parse("ok\n!\n").unwrap_err().0, 2);
        assert_eq!(IgnoreRules::parse("a\\").unwrap_err().0, 1);
        assert_eq!(IgnoreRules::parse("x\n[z-a]\n").unwrap_err().0, 2);
    }

    #[test]
    fn the_dockerfile_and_dockerignore_are_always_kept() {
        let mut r = rules("*\n");
        assert!(r.excludes("Dockerfile"));
        r.keep(".dockerignore");
        r.keep("Dockerfile");
        assert!(!r.excludes("Dockerfile"));
        assert!(!r.excludes(".dockerignore"));
        assert!(r.excludes("other"));
    }

    #[test]
    fn a_git_config_is_packed_without_its_credentials() {
        use std::io::Read;
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let token = "[core]\n\trepositoryformatversion = 0\n[remote \"origin\"]\n\turl = https://x-access-token:ghs_SECRET1@github.com/o/r\n[http \"https://github.com/\"]\n\textraheader = AUTHORIZATION: basic U0VDUkVUMg==\n";
        for dir in [".git", "deps/x/.git", ".git/modules/m"] {
            std::fs::create_dir_all(d.join(dir)).unwrap();
            std::fs::write(d.join(dir).join("config"), token).unwrap();
        }
        std::fs::write(d.join("Dockerfile"), "FROM scratch\nCOPY . /\n").unwrap();
        let mut packed = String::new();
        let mut archive = tar::Archive::new(pack(d, d, "Dockerfile").unwrap());
        let mut configs = 0;
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            let mut text = String::new();
            entry.read_to_string(&mut text).unwrap();
            assert_eq!(entry.header().size().unwrap(), text.len() as u64, "{name}");
            if name.ends_with("config") {
                configs += 1;
                assert!(text.contains("github.com/o/r"), "{name}: {text}");
            }
            packed.push_str(&text);
        }
        assert_eq!(configs, 3);
        for secret in ["SECRET1", "U0VDUkVUMg", "extraheader"] {
            assert!(!packed.contains(secret), "{secret} in the context");
        }
    }

    #[test]
    fn clean_is_go_filepath_clean() {
        for (input, want) in [
            ("a//b/", "a/b"),
            ("./a/./b", "a/b"),
            ("a/../../b", "../b"),
            ("/../a", "/a"),
            ("", "."),
            ("/", "/"),
        ] {
            assert_eq!(clean(input), want, "{input}");
        }
    }

    #[test]
    fn a_dockerignore_that_is_a_link_is_read_inside_the_repository_only() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let sub = root.join("docker");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(root.join(".gitignore"), "*.pyc\n").unwrap();
        let read = |dir: &Path| IgnoreRules::read(&root, dir);
        // SGLang's: `.dockerignore -> .gitignore`, at the root and from below.
        symlink(".gitignore", root.join(".dockerignore")).unwrap();
        assert!(read(&root).unwrap().excludes("a.pyc"));
        symlink("../.gitignore", sub.join(".dockerignore")).unwrap();
        assert!(read(&sub).unwrap().excludes("a.pyc"));
        let link = |dir: &Path, to: &str| {
            std::fs::remove_file(dir.join(".dockerignore")).unwrap();
            symlink(to, dir.join(".dockerignore")).unwrap();
        };
        link(&sub, &format!("{}/./.gitignore", root.display()));
        assert!(read(&sub).unwrap().excludes("a.pyc"));
        // Nothing there: no rules, as docker reads it.
        link(&root, "gone");
        assert!(!read(&root).unwrap().excludes("a.pyc"));
        // Out of the repository, by name or by a link on the way, or a link to a link.
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("x"), "*\n").unwrap();
        symlink(outside.path(), root.join("out")).unwrap();
        symlink(".gitignore", root.join("again")).unwrap();
        for (dir, to, why) in [
            (
                &root,
                "/etc/passwd",
                "a link leading out of the manifest's folder (to /etc/passwd)",
            ),
            (
                &sub,
                "../../x",
                "a link leading out of the manifest's folder",
            ),
            (
                &sub,
                "../docker/../../x",
                "a link leading out of the manifest's folder",
            ),
            (
                &root,
                "out/x",
                "cannot be read: it leads through another link",
            ),
            (
                &root,
                "again",
                "cannot be read: it leads through another link",
            ),
            (&root, "docker", "cannot be read: not a plain file"),
            (&root, "docker/..", "not to a file"),
        ] {
            link(dir, to);
            let err = read(dir).unwrap_err();
            assert!(err.contains(why), "{to}: {err}");
            assert!(err.contains(".dockerignore"), "{to}: {err}");
        }
    }

    #[test]
    fn sglangs_gitignore_reads_as_its_dockerignore() {
        // tests/corpus/dockerfiles: SGLang's `.dockerignore` is a link to it.
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/dockerfiles/sglang.gitignore");
        let r = rules(&std::fs::read_to_string(path).unwrap());
        // As docker reads it: a pattern is of the context's root (`__pycache__/` there
        // only), `**/` of any folder.
        assert!(r.excludes("__pycache__"));
        assert!(!r.excludes("python/sglang/__pycache__"));
        assert!(r.excludes("sgl-kernel/build"));
        assert!(!r.excludes("python/sglang/srt/server_args.py"));
        assert!(!r.excludes("docker/Dockerfile"));
    }
}
