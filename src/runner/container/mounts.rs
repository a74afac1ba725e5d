//! The host side of `container.mounts`: checked before a run starts (nothing is made
//! when one is wrong), on the path as the kernel resolves it, so a symlink cannot lead a
//! mount into a home folder or to the engine's socket; and the engine is handed that
//! resolved path, through folders nobody else can change, so what was checked is what
//! is mounted.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::manifest::{self, Manifest, ManifestError};
use crate::ownership;
use crate::yaml::Mark;

/// A host mount as checked on this host: what the manifest names, and the path the
/// engine is given (the source as the kernel resolved it).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ResolvedMount {
    /// As the manifest names it.
    pub source: PathBuf,
    pub target: String,
    /// The source as the kernel resolves it: what the engine mounts.
    #[serde(rename = "resolved")]
    pub host_path: PathBuf,
    /// Mount points below the source on this host.
    #[serde(skip)]
    pub submounts: Vec<PathBuf>,
    /// Where the manifest names it.
    #[serde(skip)]
    pub mark: Mark,
}

/// The checked mounts of each batch of a run, by batch name.
pub type HostMounts = indexmap::IndexMap<String, Vec<ResolvedMount>>;

/// The host folders of a run that no mount may be, hold, or lie inside.
pub struct RunFolders<'a> {
    /// The checkout under test: the batch has it at `/src` already, with its git
    /// credentials masked; a mount would show them.
    pub source: &'a Path,
    /// Where every batch's reports land.
    pub reports: &'a Path,
    /// The GPU lock dir: a batch that can open its files can `flock` them (a read-only
    /// file still takes a lock) and keep GPUs from every other run.
    pub lock_dir: &'a Path,
}

/// The engine's socket as `DOCKER_HOST` names it (`unix://…`), else the usual places.
fn engine_sockets() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = manifest::ENGINE_SOCKETS.iter().map(PathBuf::from).collect();
    if let Ok(host) = std::env::var("DOCKER_HOST")
        && let Some(path) = host.strip_prefix("unix://")
    {
        out.push(PathBuf::from(path));
    }
    out.into_iter()
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect()
}

/// Checks every mount of the named batches on this host and resolves each to the path
/// the engine will be given: the source resolved, allowed, a folder or a plain file,
/// holding no engine socket, apart from the run's own folders, and reached only through
/// folders that nobody but root and this user can change.
pub fn check_host(
    m: &Manifest,
    names: &[String],
    run: &RunFolders<'_>,
) -> Result<HostMounts, ManifestError> {
    let sockets = engine_sockets();
    let ours: Vec<(PathBuf, &str)> = [
        (
            run.source.to_path_buf(),
            "the checkout under test (the batch has it at /src, its git credentials masked)",
        ),
        (
            run.reports.to_path_buf(),
            "the reports folder of every batch",
        ),
        (
            run.lock_dir.to_path_buf(),
            "the GPU lock dir (a batch could lock its files and keep GPUs from every run)",
        ),
    ]
    .into_iter()
    .chain(runner_folders().into_iter().map(|p| {
        (
            p,
            "a folder of the CI runner (its credentials, or every job's files)",
        )
    }))
    .map(|(p, what)| (resolve_lenient(&p), what))
    .collect();
    let me = nix::unistd::geteuid().as_raw();
    // Read once, and only when a batch has mounts.
    let mut mount_points: Option<Vec<PathBuf>> = None;
    let path = m.path.display().to_string();
    let mut checked = HostMounts::new();
    for name in names {
        let Some(batch) = m.batches.get(name) else {
            continue;
        };
        let checked_here = checked.entry(name.clone()).or_default();
        for mount in &batch.container.mounts {
            let at = |message: String| ManifestError::At {
                path: path.clone(),
                mark: mount.mark,
                message: format!("batches.{name}.container.mounts: {message}"),
            };
            let source = mount.source.display();
            let real = std::fs::canonicalize(&mount.source)
                .map_err(|e| at(format!("source `{source}` on this host: {e}")))?;
            let resolved = |why: String| {
                if real == mount.source {
                    at(format!("source `{source}` {why}"))
                } else {
                    at(format!(
                        "source `{source}` (resolves to {}) {why}",
                        real.display()
                    ))
                }
            };
            manifest::check_mount_source(&real).map_err(resolved)?;
            let md = std::fs::metadata(&real)
                .map_err(|e| at(format!("source `{source}` on this host: {e}")))?;
            if md.file_type().is_socket() {
                return Err(resolved("is a socket".into()));
            }
            if sockets.iter().any(|s| s.starts_with(&real)) {
                return Err(resolved(
                    "holds the container engine's socket (root on the host)".into(),
                ));
            }
            if !md.is_dir() && !md.is_file() {
                return Err(resolved("is neither a folder nor a file".into()));
            }
            for (folder, what) in &ours {
                let relation = if real == *folder {
                    "is"
                } else if folder.starts_with(&real) {
                    "holds"
                } else if real.starts_with(folder) {
                    "is inside"
                } else {
                    continue;
                };
                return Err(resolved(format!(
                    "{relation} {what}; mount a folder apart from it"
                )));
            }
            if real.to_str().is_none() {
                return Err(resolved(
                    "is not valid UTF-8, which the engine's API cannot carry; rename it".into(),
                ));
            }
            if let Some(why) = ownership::changeable_by_others(&real, me) {
                return Err(resolved(why));
            }
            let submounts = mount_points
                .get_or_insert_with(mount_points_now)
                .iter()
                .filter(|p| p.starts_with(&real) && **p != real)
                .cloned()
                .collect();
            checked_here.push(ResolvedMount {
                source: mount.source.clone(),
                target: mount.target.clone(),
                host_path: real,
                submounts,
                mark: mount.mark,
            });
        }
    }
    Ok(checked)
}

/// The folders of the GitHub Actions runner cibox runs under, if any: its install
/// folder (`.runner`, `.credentials`, the runner's private key: found as the nearest
/// folder above the workspace holding `.runner` or `.credentials`), its work folder
/// (every job's checkout; the parent of `RUNNER_WORKSPACE`, whatever it is called),
/// `RUNNER_TEMP` and `RUNNER_TOOL_CACHE`.
fn runner_folders() -> Vec<PathBuf> {
    let var = |v: &str| {
        std::env::var_os(v)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    };
    let mut out = Vec::new();
    let workspaces: Vec<PathBuf> = ["RUNNER_WORKSPACE", "GITHUB_WORKSPACE"]
        .iter()
        .filter_map(|v| var(v))
        .collect();
    if let Some(work) = var("RUNNER_WORKSPACE").as_deref().and_then(Path::parent) {
        out.push(work.to_path_buf());
    }
    for w in &workspaces {
        if let Some(home) = w
            .ancestors()
            .find(|a| a.join(".runner").exists() || a.join(".credentials").exists())
        {
            out.push(home.to_path_buf());
        }
    }
    out.extend(
        ["RUNNER_TEMP", "RUNNER_TOOL_CACHE"]
            .iter()
            .filter_map(|v| var(v)),
    );
    out.retain(|p| p.is_absolute() && p != Path::new("/"));
    out
}

/// `p` with its links resolved as far as it exists (a lock dir not made yet still
/// resolves through its parents).
fn resolve_lenient(p: &Path) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(p) {
        return real;
    }
    for base in p.ancestors().skip(1) {
        if let Ok(real) = std::fs::canonicalize(base)
            && let Ok(rest) = p.strip_prefix(base)
        {
            return real.join(rest);
        }
    }
    p.to_path_buf()
}

/// Refuses, on an engine that cannot make them read-only, mounts that hold other
/// mounts: before API 1.44 (Docker 25) a read-only bind leaves the mounts below it
/// writable, so cibox binds only the folder itself there, and a mount below would be
/// missing from the batch without a word.
pub fn check_engine(
    manifest: &Path,
    mounts: &HostMounts,
    engine: &EngineFacts,
) -> Result<(), ManifestError> {
    let root_dir = engine
        .root_dir
        .as_deref()
        .map(|d| resolve_lenient(Path::new(d)));
    for (name, batch_mounts) in mounts {
        for mount in batch_mounts {
            let at = |message: String| ManifestError::At {
                path: manifest.display().to_string(),
                mark: mount.mark,
                message: format!("batches.{name}.container.mounts: {message}"),
            };
            let real = mount.host_path.as_path();
            if let Some(root) = &root_dir
                && (root.starts_with(real) || real.starts_with(root))
            {
                return Err(at(format!(
                    "source `{}` is, holds or lies in the engine's data root {} (every container's config and environment; root on the host)",
                    mount.source.display(),
                    root.display()
                )));
            }
            if engine.recursive_read_only {
                continue;
            }
            if let Some(below) = mount.submounts.first() {
                return Err(at(format!(
                    "source `{}` holds another mount, {} ({} in all); this engine (API {}) cannot make mounts below a read-only bind read-only: mount {} by itself, or use Docker 25 or later",
                    mount.source.display(),
                    below.display(),
                    mount.submounts.len(),
                    engine.api,
                    below.display(),
                )));
            }
        }
    }
    Ok(())
}

/// What the mount checks need to know of the engine.
pub struct EngineFacts {
    /// The API version agreed (`1.41`).
    pub api: String,
    /// Whether a bind can be read-only all the way down (API 1.44+).
    pub recursive_read_only: bool,
    /// `DockerRootDir`.
    pub root_dir: Option<String>,
}

/// Every mount point of this mount namespace (`/proc/self/mountinfo`, field 5, with its
/// octal escapes undone); empty when it cannot be read.
fn mount_points_now() -> Vec<PathBuf> {
    let Ok(text) = std::fs::read("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.split(|b| *b == b'\n')
        .filter_map(|line| line.split(|b| *b == b' ').nth(4))
        .map(|p| PathBuf::from(unescape_octal(p)))
        .collect()
}

/// `\040` → space, as the kernel writes ` `, `\t`, `\n` and `\\` in mountinfo; bytes
/// that are not UTF-8 stay as they are.
fn unescape_octal(bytes: &[u8]) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let n = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(n);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    std::ffi::OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_octal(br"/data/my\040models"), "/data/my models");
        assert_eq!(unescape_octal(br"/a\134b"), r"/a\b");
        assert_eq!(unescape_octal(br"/end\04"), r"/end\04");
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(unescape_octal(b"/x\\377y").as_bytes(), b"/x\xffy");
    }

    #[test]
    fn the_engines_data_root_is_refused_wherever_it_is() {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ncontainer: {mounts: [\"/data/docker/containers:/c\", \"/data/models:/m\"]}\nbatches:\n  b: {gpus: 0, timeout: 1m, run: [x]}\n";
        let m = crate::manifest::Manifest::parse(text, Path::new("cibox.yaml")).unwrap();
        // As the host check would resolve them where no link leads elsewhere.
        let mounts: HostMounts = [(
            "b".to_string(),
            m.batches["b"]
                .container
                .mounts
                .iter()
                .map(|hm| ResolvedMount {
                    source: hm.source.clone(),
                    target: hm.target.clone(),
                    host_path: hm.source.clone(),
                    submounts: Vec::new(),
                    mark: hm.mark,
                })
                .collect(),
        )]
        .into();
        let facts = |root: &str| EngineFacts {
            api: "1.41".into(),
            recursive_read_only: false,
            root_dir: Some(root.into()),
        };
        let err = check_engine(&m.path, &mounts, &facts("/data/docker"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cibox.yaml:4:22: batches.b.container.mounts: source `/data/docker/containers` is, holds or lies in the engine's data root /data/docker"),
            "{err}"
        );
        let err = check_engine(&m.path, &mounts, &facts("/data/models/docker"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("source `/data/models`"), "{err}");
        check_engine(&m.path, &mounts, &facts("/srv/docker")).unwrap();
    }
}
