//! Fake GPUs: a machine without accelerators made to look like one with `count` GPUs of
//! a vendor and model, so a multi-GPU batch leases and runs on a laptop, and a
//! maintainer can try a CI change before pushing it (docs/guide/gpus.md).
//!
//! `cibox gpu fake` writes a folder: the vendor's tool's double (the same program the
//! tests use, `tests/fixtures/<tool>`) behind a wrapper that names its state, the GPUs
//! in the tool's own CSV, and `fake.json` saying what was faked. `CIBOX_FAKE_GPUS=DIR`
//! turns it on: the probe asks that double whatever the host policy or manifest chose,
//! and a leased unit reaches its container as the variables that name it alone (no
//! device request, no device node: the engine needs no GPU runtime). Nothing faked
//! passes for hardware: `doctor`, the run record and the reports say so.
//!
//! A vendor is a line of [`VENDORS`]: its tool, the double's text, the variable the
//! double reads its state from, and how one GPU is written in its `gpus.csv`.

use std::path::{Path, PathBuf};

/// The variable that turns fake GPUs on: the folder `cibox gpu fake` wrote.
pub const VARIABLE: &str = "CIBOX_FAKE_GPUS";
/// The file in that folder that says what was faked.
const FACTS: &str = "fake.json";
/// The most GPUs one fake host has.
pub const MAX_COUNT: u32 = 64;

/// A vendor whose GPUs can be faked.
pub struct FakeVendor {
    /// As `--vendor` names it.
    pub name: &'static str,
    /// The tool cibox probes it with, and the double's file name.
    pub tool: &'static str,
    /// The double: answers the tool's queries from a state folder.
    script: &'static str,
    /// The variable the double reads that folder from.
    state_variable: &'static str,
    /// The model when none is given.
    pub default_model: &'static str,
    /// One GPU's line of the double's `gpus.csv`: index, then its identity, memory.
    line: fn(u32) -> String,
}

/// Every vendor that can be faked. A new one (Ascend's npu-smi, Intel's xpu-smi, Moore
/// Threads' mthreads-gmi) is a line here, its double under tests/fixtures, and its
/// probe backend choosing it in `probe` (as `nvidia-smi` and `rocm-smi` are).
pub const VENDORS: [FakeVendor; 2] = [
    FakeVendor {
        name: "nvidia",
        tool: "nvidia-smi",
        script: include_str!("../../tests/fixtures/nvidia-smi"),
        state_variable: "CIBOX_FAKE_SMI_STATE",
        default_model: "NVIDIA H100 80GB HBM3",
        line: |i| format!("{i}, GPU-fa4e0000-0000-4000-8000-{i:012x}, 0, 81559, 0\n"),
    },
    FakeVendor {
        name: "amd",
        tool: "rocm-smi",
        script: include_str!("../../tests/fixtures/rocm-smi"),
        state_variable: "CIBOX_FAKE_ROCM_STATE",
        default_model: "AMD Instinct MI300X",
        line: |i| format!("{i}, fa4e{i:012x}, 0, 196592, 0\n"),
    },
];

/// What a fake host is: `fake.json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FakeHost {
    pub vendor: String,
    pub model: String,
    pub count: u32,
    /// The folder (not in `fake.json`: where it was found).
    #[serde(skip)]
    pub dir: PathBuf,
}

impl FakeHost {
    /// One line for people: what is faked, and that it is.
    pub fn describe(&self) -> String {
        format!(
            "FAKE GPUs, not real hardware: {} × {} ({}, from {}={})",
            self.count,
            self.model,
            self.vendor,
            VARIABLE,
            self.dir.display()
        )
    }

    /// The vendor's tool in the folder.
    pub fn tool(&self) -> Option<&'static str> {
        vendor(&self.vendor).map(|v| v.tool)
    }
}

/// Why fake GPUs could not be set up or read.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    #[error("--vendor {0}: not a vendor cibox can fake (one of: {names})", names = names())]
    Vendor(String),
    #[error("--count {0}: give 1 to {MAX_COUNT}")]
    Count(u32),
    #[error("--model {0:?}: give a model name of printable characters, no comma")]
    Model(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{VARIABLE}={}: not a folder `cibox gpu fake` wrote ({FACTS}: {why})", dir.display())]
    NotFake { dir: PathBuf, why: String },
    /// The folder's programs run as whoever runs cibox: one another user could change
    /// would run theirs.
    #[error("{}: {why}; the fake GPUs' tools run as you, so their folder must be yours (or root's) and changeable by nobody else", dir.display())]
    Untrusted { dir: PathBuf, why: String },
}

impl crate::error::ErrorKind for FakeError {
    fn failure(&self) -> crate::exit::Failure {
        match self {
            FakeError::Io { .. } | FakeError::NotFake { .. } => crate::exit::Failure::Infra,
            FakeError::Untrusted { .. } => crate::exit::Failure::Usage,
            _ => crate::exit::Failure::Usage,
        }
    }
}

fn names() -> String {
    VENDORS
        .iter()
        .map(|v| v.name)
        .collect::<Vec<_>>()
        .join(", ")
}

fn vendor(name: &str) -> Option<&'static FakeVendor> {
    VENDORS.iter().find(|v| v.name.eq_ignore_ascii_case(name))
}

/// The folder `CIBOX_FAKE_GPUS` names, if set.
fn dir_named() -> Option<PathBuf> {
    std::env::var_os(VARIABLE)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The fake host in force, if `CIBOX_FAKE_GPUS` is set: an error when it names no
/// folder `cibox gpu fake` wrote.
pub fn active() -> Option<Result<FakeHost, FakeError>> {
    dir_named().map(|dir| read(&dir))
}

/// Whether fake GPUs are on (`CIBOX_FAKE_GPUS` set, whatever it names).
pub fn is_on() -> bool {
    dir_named().is_some()
}

/// The double to probe with instead of `tool`, when fake GPUs are on: the folder's own,
/// or (for a tool the fake host is not of) a path that does not exist, so the probe
/// fails naming it rather than asking the real tool.
pub fn program(tool: &str) -> Option<String> {
    let dir = dir_named()?;
    if let Err(e) = trusted(&dir) {
        // A path no one can have made, so the probe fails closed, saying why.
        return Some(format!("{} (refused: {e})", dir.join(tool).display()));
    }
    Some(dir.join(tool).to_string_lossy().into_owned())
}

/// Whether `dir` is a folder only this user (or root) can change, all the way down:
/// not a link, owned by them, writable by no group or other, in folders no one else
/// could swap.
fn trusted(dir: &Path) -> Result<(), FakeError> {
    use std::os::unix::fs::MetadataExt;
    let untrusted = |why: String| FakeError::Untrusted {
        dir: dir.to_path_buf(),
        why,
    };
    let dir = std::path::absolute(dir).map_err(|e| untrusted(e.to_string()))?;
    let me = rustix::process::geteuid().as_raw();
    let md = std::fs::symlink_metadata(&dir).map_err(|e| untrusted(e.to_string()))?;
    if !md.file_type().is_dir() {
        return Err(untrusted("not a folder (a link is not followed)".into()));
    }
    if md.uid() != me && md.uid() != 0 {
        return Err(untrusted(format!("owned by uid {}", md.uid())));
    }
    if md.mode() & 0o022 != 0 || crate::ownership::has_access_acl(&dir) {
        return Err(untrusted(format!(
            "others may write it (mode {:o})",
            md.mode() & 0o7777
        )));
    }
    match crate::ownership::changeable_by_others(&dir, me) {
        Some(why) => Err(untrusted(why)),
        None => Ok(()),
    }
}

/// Which tool the fake host in force is probed with.
pub fn active_tool() -> Option<&'static str> {
    active()?.ok()?.tool()
}

fn read(dir: &Path) -> Result<FakeHost, FakeError> {
    trusted(dir)?;
    let not = |why: String| FakeError::NotFake {
        dir: dir.to_path_buf(),
        why,
    };
    let text = std::fs::read_to_string(dir.join(FACTS)).map_err(|e| not(e.to_string()))?;
    let mut host: FakeHost = serde_json::from_str(&text).map_err(|e| not(e.to_string()))?;
    if vendor(&host.vendor).is_none() {
        return Err(not(format!("unknown vendor {:?}", host.vendor)));
    }
    host.dir = dir.to_path_buf();
    Ok(host)
}

/// Writes a fake host of `count` GPUs of `model` (the vendor's usual one when `None`)
/// into `dir`, replacing one written there before.
pub fn create(
    dir: &Path,
    vendor_name: &str,
    model: Option<&str>,
    count: u32,
) -> Result<FakeHost, FakeError> {
    let v = vendor(vendor_name).ok_or_else(|| FakeError::Vendor(vendor_name.into()))?;
    if count == 0 || count > MAX_COUNT {
        return Err(FakeError::Count(count));
    }
    let model = model.unwrap_or(v.default_model);
    if model.is_empty() || model.contains(',') || model.chars().any(char::is_control) {
        return Err(FakeError::Model(model.into()));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FakeError::Io { path, source }
    };
    let dir = std::path::absolute(dir).map_err(io(dir))?;
    let state = dir.join("state");
    // The folder named is made as asked; in it nothing is written through a link (one
    // planted there is replaced, never followed).
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    trusted(&dir)?;
    let root = crate::nofollow::Folder::open(&dir).map_err(io(&dir))?;
    let state_dir = root.make_dir("state", 0o755).map_err(io(&state))?;
    root.make_dir("locks", 0o755)
        .map_err(io(&dir.join("locks")))?;
    let write = |folder: &crate::nofollow::Folder, name: &str, text: &str, exec: bool| {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        let path = folder.path().join(name);
        let mut f = folder.create_fresh(name).map_err(io(&path))?;
        f.write_all(text.as_bytes()).map_err(io(&path))?;
        if exec {
            f.set_permissions(std::fs::Permissions::from_mode(0o755))
                .map_err(io(&path))?;
        }
        Ok::<(), FakeError>(())
    };
    let gpus: String = (0..count).map(v.line).collect();
    write(&state_dir, "gpus.csv", &gpus, false)?;
    write(&state_dir, "apps.csv", "", false)?;
    write(&state_dir, "gpu_name", &format!("{model}\n"), false)?;
    write(&state_dir, &format!("{}.double", v.tool), v.script, true)?;
    let wrapper = format!(
        "#!/bin/sh\n# cibox gpu fake: a stand-in for {tool}. NOT real hardware.\n{var}={st} exec /bin/sh {double} \"$@\"\n",
        tool = v.tool,
        var = v.state_variable,
        st = quote(&state),
        double = quote(&state.join(format!("{}.double", v.tool))),
    );
    write(&root, v.tool, &wrapper, true)?;
    let host = FakeHost {
        vendor: v.name.into(),
        model: model.into(),
        count,
        dir: dir.clone(),
    };
    let facts = serde_json::to_string_pretty(&host).expect("plain struct") + "\n";
    write(&root, FACTS, &facts, false)?;
    Ok(host)
}

/// `path` in single quotes for sh.
fn quote(path: &Path) -> String {
    format!("'{}'", path.to_string_lossy().replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_another_user_could_change_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("fake");
        create(&dir, "nvidia", None, 2).unwrap();
        let mode = |m: u32| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(m));
        // Others may write it: neither read nor written again (its tools would run as us).
        mode(0o777).unwrap();
        assert!(matches!(read(&dir), Err(FakeError::Untrusted { .. })));
        assert!(matches!(
            create(&dir, "nvidia", None, 2),
            Err(FakeError::Untrusted { .. })
        ));
        mode(0o755).unwrap();
        assert!(read(&dir).is_ok());
        // Another user's (only root can give it away; CI runs as root).
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
            let e = read(&dir).unwrap_err();
            assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        }
        // A link to it is not followed.
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(matches!(read(&link), Err(FakeError::Untrusted { .. })));
    }

    #[test]
    fn a_fake_host_is_read_back_as_written() {
        let d = tempfile::tempdir().unwrap();
        let h = create(d.path(), "NVIDIA", Some("NVIDIA A100-SXM4-80GB"), 4).unwrap();
        assert_eq!(read(d.path()).unwrap(), h);
        assert_eq!(h.tool(), Some("nvidia-smi"));
        let csv = std::fs::read_to_string(d.path().join("state/gpus.csv")).unwrap();
        assert_eq!(csv.lines().count(), 4);
        assert!(
            h.describe()
                .starts_with("FAKE GPUs, not real hardware: 4 × NVIDIA A100")
        );
    }

    #[test]
    fn every_vendors_identities_are_its_own() {
        for v in &VENDORS {
            let id = (v.line)(3).split(',').nth(1).unwrap().trim().to_string();
            // rocm-smi prints the unique ID bare; the probe names it `GPU-…`.
            let id = if id.starts_with("GPU-") {
                id
            } else {
                format!("GPU-{id}")
            };
            let owner = crate::gpu::vendor::VENDORS
                .iter()
                .find(|o| o.owns(&id))
                .map(|o| o.name().to_ascii_lowercase());
            assert_eq!(owner.as_deref(), Some(v.name), "{id}");
        }
    }

    #[test]
    fn a_link_planted_in_the_folder_is_replaced_never_followed() {
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        std::fs::write(&outside, "mine\n").unwrap();
        std::fs::create_dir_all(d.path().join("fake/state")).unwrap();
        std::os::unix::fs::symlink(&outside, d.path().join("fake/state/gpus.csv")).unwrap();
        std::os::unix::fs::symlink(&outside, d.path().join("fake/nvidia-smi")).unwrap();
        create(&d.path().join("fake"), "nvidia", None, 2).unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "mine\n");
        let csv = d.path().join("fake/state/gpus.csv");
        assert!(
            !std::fs::symlink_metadata(&csv)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn bad_requests_are_refused_before_writing() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("x");
        assert!(matches!(
            create(&dir, "intel", None, 2),
            Err(FakeError::Vendor(_))
        ));
        assert!(matches!(
            create(&dir, "amd", None, 0),
            Err(FakeError::Count(0))
        ));
        assert!(matches!(
            create(&dir, "amd", Some("a,b"), 1),
            Err(FakeError::Model(_))
        ));
        assert!(!dir.exists());
    }
}
