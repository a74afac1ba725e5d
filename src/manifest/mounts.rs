//! The mount policy: which host paths a batch may mount (read-only) and where they may
//! go in its container. Checked on the path as written when the manifest is read, and
//! (by the runner) on the resolved path before a run.

use std::path::Path;

/// Where the engine's socket usually is: mounting it (or a folder holding it) hands
/// the batch root on the host.
pub const ENGINE_SOCKETS: [&str; 3] = [
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
];

/// Whether a host path may be mounted into a batch container (read-only). Checked on the
/// path as written when the manifest is read, and on the resolved path before a run.
pub fn check_mount_source(p: &Path) -> Result<(), String> {
    if !p.is_absolute() {
        return Err("must be an absolute host path".into());
    }
    if p.components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err("must not contain `..`".into());
    }
    let under = |root: &str| p.starts_with(root);
    if p == Path::new("/") {
        return Err("is the whole host".into());
    }
    if ["/proc", "/sys", "/dev", "/boot", "/etc"]
        .iter()
        .any(|r| under(r))
    {
        return Err("is the host's system, kernel or device files".into());
    }
    if ["/home", "/root"].iter().any(|r| under(r))
        || std::env::var_os("HOME").is_some_and(|h| !h.is_empty() && h != "/" && p.starts_with(&h))
    {
        return Err("is in a home folder, where keys and tokens live; keep shared models and data elsewhere (e.g. /data)".into());
    }
    let engine = ENGINE_SOCKETS
        .iter()
        .any(|s| Path::new(s).starts_with(p) || p.starts_with(s))
        || [
            "/var/lib/docker",
            "/var/lib/containerd",
            "/run/docker",
            "/var/run/docker",
        ]
        .iter()
        .any(|r| under(r) || Path::new(r).starts_with(p));
    if engine {
        return Err("holds the container engine's socket or state (root on the host)".into());
    }
    // Where services keep their sockets (a read-only mount does not stop `connect`),
    // state, caches of secrets and logs, and where everyone's temporary files and
    // session sockets are (X11, ssh-agent).
    if ["/run", "/var", "/tmp", "/snap", "/opt/containerd"]
        .iter()
        .any(|r| under(r))
    {
        return Err("is where the host's services keep sockets, state and logs, or where everyone's temporary files and session sockets are; keep shared models and data in a folder of their own (e.g. /data)".into());
    }
    Ok(())
}

/// Where a mount may go in the container: not over what cibox provides or the system.
pub fn check_mount_target(t: &str) -> Result<(), String> {
    let p = Path::new(t);
    if !p.is_absolute() {
        return Err("must be an absolute path in the container".into());
    }
    if p.components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err("must not contain `..`".into());
    }
    if t.contains([',', ':']) {
        return Err("must not contain `,` or `:`".into());
    }
    if t.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    if p == Path::new("/") {
        return Err("is the container's root".into());
    }
    let reserved = [
        "/src",
        "/work",
        "/tmp",
        "/reports",
        "/proc",
        "/sys",
        "/dev",
        "/etc",
        "/bin",
        "/sbin",
        "/usr",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/run",
        "/var/run",
        "/.dockerenv",
    ];
    if let Some(r) = reserved.iter().find(|r| p.starts_with(r)) {
        return Err(format!("is under `{r}`, which cibox or the image provides"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::{REAL, assert_refused};

    #[test]
    fn mount_policy_refuses_with_a_position() {
        assert_refused(
            REAL,
            &[
                (
                    "/data/models:/models",
                    "/proc:/p",
                    "cibox.yaml:10:12: container.mounts.0: source `/proc`: is the host's system",
                ),
                (
                    "/data/models:/models",
                    "/home/ci/.cache:/cache",
                    "container.mounts.0: source `/home/ci/.cache`: is in a home folder",
                ),
                (
                    "/data/models:/models",
                    "/var/run/docker.sock:/s",
                    "container.mounts.0: source `/var/run/docker.sock`: holds the container engine's socket",
                ),
                (
                    "/data/models:/models",
                    "/var/run:/r",
                    "holds the container engine's socket",
                ),
                (
                    "/data/models:/models",
                    "/:/host",
                    "source `/`: is the whole host",
                ),
                (
                    "/data/models:/models",
                    "data/models:/models",
                    "container.mounts.0: source `data/models`: must be an absolute host path",
                ),
                (
                    "/data/models:/models",
                    "/data/models:/work/m",
                    "target `/work/m`: is under `/work`",
                ),
                (
                    "/data/models:/models",
                    "/run/dbus:/dbus",
                    "source `/run/dbus`: is where the host's services keep sockets",
                ),
                (
                    "/data/models:/models",
                    "/data/models:/sbin/x",
                    "target `/sbin/x`: is under `/sbin`",
                ),
                (
                    "\"/data/models:/models\"",
                    "{source: /data/models, target: \"/m\\nx\"}",
                    "must not contain control characters",
                ),
            ],
        );
    }
}
