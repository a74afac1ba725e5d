//! Host policies for tests: [`HostPolicyFile`] writes one where only root (CI runs the
//! tests as root) can change it, for a test to name with `CIBOX_HOST_POLICY`; and
//! [`GRANT_ALL`], what the tests of loosenings are granted.

use std::path::{Path, PathBuf};

/// Everything a test may ask for: mounts under the tests' data folder, root (with
/// mounts), host IPC, every network, the capabilities and ulimits cibox knows.
pub const GRANT_ALL: &str = "version: 1\ngrants:\n  mounts: [/srv/cibox-tests]\n  users: [root]\n  root_with_mounts: true\n  ipc_host: true\n  network: [bridge, host]\n  cap_add: [IPC_LOCK, SYS_NICE, SYS_PTRACE]\n  ulimits: [memlock, nofile, stack]\n";

/// A host policy file, removed with its folder when dropped.
pub struct HostPolicyFile {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl HostPolicyFile {
    /// Writes `text` as a policy only its owner may change (mode 0644).
    pub fn new(text: &str) -> HostPolicyFile {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.yaml");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        HostPolicyFile { _dir: dir, path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Fails with what to do when this host has a policy of its own at the fixed path: the
/// tests of hosts without one would not be testing that.
pub fn require_no_host_policy() {
    assert!(
        !Path::new("/etc/cibox/host.yaml").exists(),
        "/etc/cibox/host.yaml exists on this machine: these tests need a host without a policy (move it aside while they run)"
    );
}
