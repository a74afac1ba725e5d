//! The host side of `container.mounts`: checked before a run starts (nothing is made
//! when one is wrong), on the path as the kernel resolves it, so a symlink cannot lead a
//! mount into a home folder or to the engine's socket.

use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

use crate::manifest::{self, Manifest, ManifestError};

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

/// Checks every mount of the named batches on this host: the source exists, and
/// resolved it is still allowed, is no socket and holds no engine socket.
pub fn check_host(m: &Manifest, names: &[String]) -> Result<(), ManifestError> {
    let sockets = engine_sockets();
    for name in names {
        let Some(batch) = m.batches.get(name) else {
            continue;
        };
        for mount in &batch.container.mounts {
            let at = |message: String| ManifestError::At {
                path: m.path.display().to_string(),
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
        }
    }
    Ok(())
}
