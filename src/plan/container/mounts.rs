//! The host side of `container.mounts`: checked before a run starts (nothing is made
//! when one is wrong), on the path as the kernel resolves it, so a symlink cannot lead a
//! mount into a home folder or to the engine's socket; and the engine is handed that
//! resolved path, through folders nobody else can change, so what was checked is what
//! is mounted.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::engine::HostView;
use crate::host::policy::{HostPolicy, MountRoot};
use crate::host::{self, grants};
use crate::manifest::check_mount_source;
use crate::manifest::{self, ContainerUser, HostMount, Manifest, ManifestError};
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
/// the engine will be given: the source resolved, under a mount root the host policy
/// grants, allowed, a folder or a plain file, holding no engine socket (nor, unless the
/// policy vouches for its root, any socket, device or FIFO), apart from the run's own
/// folders, and reached only through folders that nobody but root and this user can
/// change.
pub fn check_host(
    m: &Manifest,
    names: &[String],
    run: &RunFolders<'_>,
    policy: &HostPolicy,
) -> Result<HostMounts, ManifestError> {
    let host = HostCheck::new(run, policy);
    let mut checked = HostMounts::new();
    for name in names {
        let Some(batch) = m.batches.get(name) else {
            continue;
        };
        let checked_here = checked.entry(name.clone()).or_default();
        for mount in &batch.container.mounts {
            let at = |message: String| ManifestError::At {
                path: m.path.display().to_string(),
                mark: mount.mark,
                message: format!("batches.{name}.container.mounts: {message}"),
            };
            checked_here.push(host.check(mount, &at)?);
        }
    }
    Ok(checked)
}

/// What every mount of a run is checked against on this host.
struct HostCheck<'p> {
    sockets: Vec<PathBuf>,
    /// The run's own folders and the runner's, resolved, with what each is.
    ours: Vec<(PathBuf, &'static str)>,
    /// The policy's mount roots, resolved.
    roots: Vec<(PathBuf, &'p MountRoot)>,
    policy: &'p HostPolicy,
    me: u32,
    /// Read once, and only when a batch has mounts.
    mount_points: std::cell::OnceCell<Vec<PathBuf>>,
}

impl<'p> HostCheck<'p> {
    fn new(run: &RunFolders<'_>, policy: &'p HostPolicy) -> HostCheck<'p> {
        let ours = [
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
        .chain(host::runner::runner_folders().into_iter().map(|p| {
            (
                p,
                "a folder of the CI runner (its credentials, or every job's files)",
            )
        }))
        .map(|(p, what)| (resolve_lenient(&p), what))
        .collect();
        HostCheck {
            sockets: engine_sockets(),
            ours,
            roots: policy
                .grants
                .mounts
                .iter()
                .map(|r| (resolve_lenient(&r.root), r))
                .collect(),
            policy,
            me: nix::unistd::geteuid().as_raw(),
            mount_points: std::cell::OnceCell::new(),
        }
    }

    /// One mount, resolved and checked; `at` words a refusal at its place.
    fn check(
        &self,
        mount: &HostMount,
        at: &dyn Fn(String) -> ManifestError,
    ) -> Result<ResolvedMount, ManifestError> {
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
        let Some((_, root)) = self.roots.iter().find(|(r, _)| real.starts_with(r)) else {
            return Err(resolved(format!(
                "lies outside every mount root this host grants: {}",
                grants::not_granted(self.policy, "mounts")
            )));
        };
        // The root as the policy names it: one whose folders others may change could be
        // pointed anywhere between the admin's grant and this run.
        if let Some(why) = ownership::changeable_by_others(&root.root, self.me) {
            return Err(resolved(format!(
                "is under the host policy's mount root {}, which {why}",
                root.root.display()
            )));
        }
        let md = std::fs::metadata(&real)
            .map_err(|e| at(format!("source `{source}` on this host: {e}")))?;
        if md.file_type().is_socket() {
            return Err(resolved("is a socket".into()));
        }
        if self.sockets.iter().any(|s| s.starts_with(&real)) {
            return Err(resolved(
                "holds the container engine's socket (root on the host)".into(),
            ));
        }
        if !md.is_dir() && !md.is_file() {
            return Err(resolved("is neither a folder nor a file".into()));
        }
        self.apart_from_ours(&real).map_err(resolved)?;
        if real.to_str().is_none() {
            return Err(resolved(
                "is not valid UTF-8, which the engine's API cannot carry; rename it".into(),
            ));
        }
        if let Some(why) = ownership::changeable_by_others(&real, self.me) {
            return Err(resolved(why));
        }
        if !root.special_files {
            special_files_below(&real).map_err(resolved)?;
        }
        let submounts = self
            .mount_points
            .get_or_init(mount_points_now)
            .iter()
            .filter(|p| p.starts_with(&real) && **p != real)
            .cloned()
            .collect();
        Ok(ResolvedMount {
            source: mount.source.clone(),
            target: mount.target.clone(),
            host_path: real,
            submounts,
            mark: mount.mark,
        })
    }

    /// A mount must not be, hold or lie in the run's folders or the runner's.
    fn apart_from_ours(&self, real: &Path) -> Result<(), String> {
        for (folder, what) in &self.ours {
            let relation = if real == folder {
                "is"
            } else if folder.starts_with(real) {
                "holds"
            } else if real.starts_with(folder) {
                "is inside"
            } else {
                continue;
            };
            return Err(format!("{relation} {what}; mount a folder apart from it"));
        }
        Ok(())
    }
}

/// The most entries a mount's walk looks at: a tree bigger than that is one the policy
/// must vouch for (`special_files: allow`), or one to mount narrower.
const MAX_WALKED: usize = 200_000;

/// Refuses a socket, device or FIFO at or below `real`: a read-only mount does not stop
/// `connect()` on a socket (a service in a root-only folder would take uid 0 in the
/// container for root), nor a device's own permissions. And a folder below that others
/// may write: a socket made there after this check would reach the batch all the same.
/// Links are not followed; each entry is looked at with `lstat`, which sees a socket
/// bound over a file.
fn special_files_below(real: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![real.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if dir == real && e.raw_os_error() == Some(nix::libc::ENOTDIR) => return Ok(()),
            Err(e) => {
                return Err(format!(
                    "cannot be checked for sockets and devices: {}: {e}",
                    dir.display()
                ));
            }
        };
        for entry in entries {
            let entry =
                entry.map_err(|e| format!("cannot be checked for sockets and devices: {e}"))?;
            seen += 1;
            if seen > MAX_WALKED {
                return Err(format!(
                    "holds more than {MAX_WALKED} entries, too many to check for sockets, devices and FIFOs before every run; mount a narrower folder, or have the host policy vouch for its root (special_files: allow)"
                ));
            }
            let path = entry.path();
            let md = std::fs::symlink_metadata(&path)
                .map_err(|e| format!("cannot be checked: {}: {e}", path.display()))?;
            let kind = md.file_type();
            let what = if kind.is_socket() {
                "a socket"
            } else if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_block_device() || kind.is_char_device() {
                "a device"
            } else if kind.is_dir() && md.mode() & 0o002 != 0 {
                "a folder anyone may write (a socket made there later would reach the batch)"
            } else {
                if kind.is_dir() {
                    stack.push(path);
                }
                continue;
            };
            return Err(format!(
                "holds {what}, {}, which a batch could use through a read-only mount; mount a folder without it, or have the host policy vouch for its root (special_files: allow)",
                path.display()
            ));
        }
    }
    Ok(())
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
    manifest: &Manifest,
    mounts: &HostMounts,
    engine: &EngineFacts,
    policy: &HostPolicy,
) -> Result<(), ManifestError> {
    root_with_mounts(manifest, mounts, engine, policy)?;
    let root_dir = engine
        .root_dir
        .as_deref()
        .map(|d| resolve_lenient(Path::new(d)));
    for (name, batch_mounts) in mounts {
        for mount in batch_mounts {
            let at = |message: String| ManifestError::At {
                path: manifest.path.display().to_string(),
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

/// A batch that runs as `root` with host mounts reads, as host uid 0, every root-owned
/// file below them (mode 0600 included): refused unless the engine maps containers'
/// root to an unprivileged uid (userns-remap), or the host policy allows it in so many
/// words (`grants.root_with_mounts`).
fn root_with_mounts(
    manifest: &Manifest,
    mounts: &HostMounts,
    engine: &EngineFacts,
    policy: &HostPolicy,
) -> Result<(), ManifestError> {
    if engine.userns || policy.grants.root_with_mounts {
        return Ok(());
    }
    for (name, batch_mounts) in mounts {
        let Some(batch) = manifest.batches.get(name) else {
            continue;
        };
        if batch_mounts.is_empty() || batch.container.user != ContainerUser::Root {
            continue;
        }
        return Err(ManifestError::At {
            path: manifest.path.display().to_string(),
            mark: batch
                .container
                .marks
                .get("user")
                .copied()
                .unwrap_or(batch_mounts[0].mark),
            message: format!(
                "batches.{name}.container.user: `root` with host mounts would read every root-owned file below them as host uid 0, and this engine maps no user namespace (userns-remap): {}",
                grants::not_granted(policy, "root_with_mounts")
            ),
        });
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
    /// Containers' root is an unprivileged uid on the host (userns-remap).
    pub userns: bool,
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

impl crate::plan::container::ContainerPlan {
    /// Places the container's binds where the engine finds them when cibox runs
    /// somewhere else than the engine's host (see [`HostView`]): the source is not
    /// bound at `/src` (it reaches `/work` through the engine's archive API), and each
    /// host mount is handed to the engine at its path on the host, which must pass the
    /// host rules again and lie apart from the host folder of the run's source
    /// (`source_on_host`). A refusal says where the manifest asks for the mount.
    pub fn place_for_engine(
        &mut self,
        w: &HostView,
        source_on_host: Option<&Path>,
    ) -> Result<Vec<Placed>, (Mark, String)> {
        if w.is_host() {
            return Ok(Vec::new());
        }
        self.binds.clear();
        let mut placed = Vec::new();
        for m in &mut self.mounts {
            let host = w.to_host(&m.host_path).map_err(|why| (m.mark, why))?;
            check_mount_source(&host).map_err(|why| {
                (
                    m.mark,
                    format!(
                        "source `{}` is {} on the engine's host, which {why}",
                        m.source.display(),
                        host.display()
                    ),
                )
            })?;
            if let Some(src) = source_on_host
                && (src.starts_with(&host) || host.starts_with(src))
            {
                return Err((
                    m.mark,
                    format!(
                        "source `{}` is {} on the engine's host, which is, holds or lies in this run's checkout there ({})",
                        m.source.display(),
                        host.display(),
                        src.display()
                    ),
                ));
            }
            placed.push(Placed {
                source: m.source.clone(),
                inside: m.host_path.clone(),
                host: host.clone(),
                mark: m.mark,
            });
            m.host_path = host;
        }
        // The record says what the engine mounted.
        if let serde_json::Value::Object(map) = &mut self.loosened
            && map.contains_key("mounts")
        {
            map.insert("mounts".into(), serde_json::json!(self.mounts));
        }
        Ok(placed)
    }
}

/// A mount cibox in a container hands the engine at its path on the engine's host: to
/// be judged there ([`judge_on_host`]), since the host resolves that path anew.
#[derive(Debug, Clone)]
pub struct Placed {
    /// As the manifest names it.
    pub source: PathBuf,
    /// As cibox resolved and checked it, in its own container.
    pub inside: PathBuf,
    /// What the engine is given.
    pub host: PathBuf,
    pub mark: Mark,
}

/// Why the engine's host would not mount at `host` what cibox checked at `inside`, as
/// `there` (how the host has `host`, see [`crate::engine::Engine::host_folders`])
/// says: a path the host cannot resolve, one it resolves through a link, one that is
/// another folder than cibox's (a folder above the runner container's bind swapped
/// since the runner started), or one a folder on the way to which someone other than
/// root and the invoking user may change (they could swap it between this check and
/// the engine's mount). `None`: the host mounts what cibox checked.
pub fn judge_on_host(
    inside: &Path,
    host: &Path,
    there: &crate::engine::HostFolder,
) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    const BIND: &str = "bind a folder only root (or you) can change on the host into the runner container, or run cibox on the engine's host";
    if let Some(e) = &there.error {
        return Some(format!(
            "cannot be checked on the engine's host: {}: {}; {BIND}",
            host.display(),
            crate::util::escape(e)
        ));
    }
    if there.real.as_deref() != Some(host) {
        return Some(format!(
            "is reached on the engine's host through a link: {} resolves there to {}; {BIND}",
            host.display(),
            there
                .real
                .as_deref()
                .map(|r| r.display().to_string())
                .unwrap_or_default()
        ));
    }
    match std::fs::metadata(inside) {
        Ok(md) if (md.dev(), md.ino()) == (there.dev, there.ino) => {}
        _ => {
            return Some(format!(
                "is not on the engine's host what cibox sees here: {} there is another folder than {} in cibox's container (a folder above the runner container's bind was replaced since the runner started?); {BIND}",
                host.display(),
                inside.display()
            ));
        }
    }
    there.changeable.as_ref().map(|why| {
        format!(
            "is {} on the engine's host, which {why} (bound into the runner container in its place), or run cibox on the engine's host",
            host.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_path_is_judged_by_how_the_host_has_it() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("models");
        std::fs::create_dir(&inside).unwrap();
        let md = std::fs::metadata(&inside).unwrap();
        let host = Path::new("/srv/ci/models");
        let there = crate::engine::HostFolder {
            path: host.into(),
            real: Some(host.into()),
            dev: md.dev(),
            ino: md.ino(),
            changeable: None,
            error: None,
        };
        assert_eq!(judge_on_host(&inside, host, &there), None);
        let why = |f: crate::engine::HostFolder| judge_on_host(&inside, host, &f).unwrap();
        let linked = why(crate::engine::HostFolder {
            real: Some("/etc".into()),
            ..there.clone()
        });
        assert!(linked.contains("resolves there to /etc"), "{linked}");
        let other = why(crate::engine::HostFolder {
            ino: md.ino() + 1,
            ..there.clone()
        });
        assert!(other.contains("another folder than"), "{other}");
        let theirs = why(crate::engine::HostFolder {
            changeable: Some("lies in /srv/ci, owned by uid 4321: …".into()),
            ..there.clone()
        });
        assert!(
            theirs.starts_with(
                "is /srv/ci/models on the engine's host, which lies in /srv/ci, owned by uid 4321"
            ),
            "{theirs}"
        );
        let gone = why(crate::engine::HostFolder {
            real: None,
            error: Some("No such file or directory".into()),
            ..there
        });
        assert!(
            gone.contains("cannot be checked on the engine's host"),
            "{gone}"
        );
    }

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
            userns: false,
        };
        let policy = HostPolicy::default();
        let err = check_engine(&m, &mounts, &facts("/data/docker"), &policy)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cibox.yaml:4:22: batches.b.container.mounts: source `/data/docker/containers` is, holds or lies in the engine's data root /data/docker"),
            "{err}"
        );
        let err = check_engine(&m, &mounts, &facts("/data/models/docker"), &policy)
            .unwrap_err()
            .to_string();
        assert!(err.contains("source `/data/models`"), "{err}");
        check_engine(&m, &mounts, &facts("/srv/docker"), &policy).unwrap();
    }
}
