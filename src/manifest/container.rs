//! `container:`, what a batch's container may do: [`ContainerConfig`] and its parts
//! ([`Network`], [`GpuDriver`], [`HostMount`], [`Ipc`], [`Ulimit`], [`ContainerUser`]),
//! the names `ulimits` and `cap_add` take, the raw block and its checks. Where a mount
//! may come from and go is the mount policy's (`mounts.rs`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::units::Size;
use crate::yaml::Mark;

use super::check::Checker;
use super::devices::{validate_devices, validate_seccomp};
use super::error::ManifestError;
use super::mounts::{check_mount_source, check_mount_target};
use super::values::{EnvValue, env_map, reserved_env, ser_display, ser_display_opt};
use crate::util::is_env_name;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    None,
    Bridge,
    Host,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuDriver {
    /// `--gpus device=UUID`: a device request for the NVIDIA runtime.
    Nvidia,
    /// `nvidia.com/gpu=UUID` CDI device names.
    Cdi,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ContainerConfig {
    pub cpus: Option<f64>,
    #[serde(serialize_with = "ser_display_opt")]
    pub memory: Option<Size>,
    #[serde(serialize_with = "ser_display")]
    pub shm: Size,
    /// The size of each of `/work` and `/tmp` (memory-backed, so charged to `memory`).
    #[serde(serialize_with = "ser_display")]
    pub disk: Size,
    /// The size of `/reports` (memory-backed too), and the most that is copied out.
    #[serde(serialize_with = "ser_display")]
    pub reports_size: Size,
    pub pids: u32,
    pub network: Network,
    pub env: BTreeMap<String, String>,
    pub pass_env: Vec<String>,
    pub gpu_driver: GpuDriver,
    /// Host folders (or files) mounted read-only: models, datasets, caches.
    pub mounts: Vec<HostMount>,
    pub ipc: Ipc,
    /// By name (`memlock`, `nofile`, …); -1 is unlimited.
    pub ulimits: BTreeMap<String, Ulimit>,
    /// Capabilities given back after dropping all, from [`CAP_ADD_ALLOWED`].
    pub cap_add: Vec<String>,
    pub user: ContainerUser,
    /// Host devices beyond GPUs, by path or pattern (expanded on the host at run time).
    pub devices: Vec<String>,
    /// Those of `devices` a host may lack (`{path, optional: true}`): a batch runs
    /// without them there, and its record says so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub optional_devices: Vec<String>,
    /// A seccomp profile the host policy names; `None`: the engine's default.
    pub seccomp: Option<String>,
    /// Where the manifest asks for each loosening it asks for (`network`, `pass_env`,
    /// `ipc`, `ulimits`, `cap_add`, `user`), by key, so that a host that does not grant
    /// it can name the place. Mounts carry their own.
    #[serde(skip)]
    pub marks: BTreeMap<&'static str, Mark>,
}

/// A host path mounted read-only at `target`, as the manifest names it; `mark` is where,
/// for errors found when a run checks the host (which resolves it: the run's plan holds
/// what the engine mounts).
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostMount {
    pub source: PathBuf,
    pub target: String,
    #[serde(skip)]
    pub mark: Mark,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ipc {
    /// The container's own IPC namespace (its `/dev/shm` sized by `shm`).
    Private,
    /// The host's: NCCL's shared-memory transport between processes, as `--ipc=host`.
    Host,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Ulimit {
    pub soft: i64,
    pub hard: i64,
}

/// Who a batch runs as inside its container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerUser {
    /// The invoking uid:gid (65534:65534 when cibox runs as root).
    Invoker,
    /// uid 0 in the container, still without capabilities and with no-new-privileges.
    Root,
    Ids(u32, u32),
}

impl fmt::Display for ContainerUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContainerUser::Invoker => f.write_str("invoker"),
            ContainerUser::Root => f.write_str("root"),
            ContainerUser::Ids(u, g) => write!(f, "{u}:{g}"),
        }
    }
}

impl serde::Serialize for ContainerUser {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The capabilities `container.cap_add` may give back: what NCCL and profilers need.
pub const CAP_ADD_ALLOWED: [&str; 3] = ["IPC_LOCK", "SYS_NICE", "SYS_PTRACE"];

/// `ulimit` names the engine knows.
pub const ULIMIT_NAMES: [&str; 15] = [
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
];

/// The CPU limits the engine takes: it refuses less than a hundredth of a CPU, and a
/// value that small would otherwise round to "no limit".
pub(super) const CPUS_RANGE: &str = "must be between 0.01 and 4096";

pub(super) fn cpus_in_range(cpus: f64) -> bool {
    cpus.is_finite() && (0.01..=4096.0).contains(&cpus)
}

/// `container:` as written: the top-level one, or a batch's with the top-level one laid
/// under it (see `prepare`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawContainer {
    cpus: Option<f64>,
    memory: Option<Size>,
    shm: Option<Size>,
    disk: Option<Size>,
    reports_size: Option<Size>,
    pids: Option<i64>,
    network: Option<Network>,
    #[serde(default)]
    env: BTreeMap<String, EnvValue>,
    #[serde(default)]
    pass_env: Vec<String>,
    gpu_driver: Option<GpuDriver>,
    #[serde(default)]
    mounts: Vec<serde_json::Value>,
    ipc: Option<Ipc>,
    #[serde(default)]
    ulimits: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    cap_add: Vec<String>,
    user: Option<String>,
    /// Paths or patterns, or `{path, optional}`: read in [`validate_devices`].
    #[serde(default)]
    devices: Vec<serde_json::Value>,
    seccomp: Option<String>,
}

/// The key path of `key` in the container block at `at`.
fn key_path(at: &[&str], key: &[&str]) -> Vec<String> {
    at.iter().chain(key).map(|s| s.to_string()).collect()
}

/// Reads a `container:` block (the top-level one, or a batch's merged over it). Its
/// parts are checked in this order, so the first error a block reports stays the same:
/// limits, mounts, ulimits, cap_add, user, cap_add against the user, env.
pub(super) fn validate_container(
    check: &Checker<'_>,
    at: &[&str],
    c: RawContainer,
) -> Result<ContainerConfig, ManifestError> {
    let pids = validate_limits(check, at, &c)?;
    let mounts = validate_mounts(check, at, &c.mounts)?;
    let ulimits = validate_ulimits(check, at, &c.ulimits)?;
    let cap_add = validate_cap_add(check, at, &c.cap_add)?;
    let user = validate_user(check, at, c.user.as_deref())?;
    let at_owned: Vec<String> = at.iter().map(|s| s.to_string()).collect();
    let (devices, optional_devices) = validate_devices(check, &at_owned, &c.devices)?;
    let seccomp = validate_seccomp(check, &at_owned, c.seccomp.as_deref())?;
    // Capabilities reach only a root process: without ambient capabilities (which
    // no-new-privileges keeps out) any other user's are cleared when it starts.
    if !cap_add.is_empty() && user != ContainerUser::Root {
        return Err(check.at(
            &key_path(at, &["cap_add"]),
            format!(
                "takes effect only with `user: root` (a batch running as {user} gets no capability); add `user: root` or drop cap_add"
            ),
        ));
    }
    let asked = [
        ("network", c.network.is_some()),
        ("pass_env", !c.pass_env.is_empty()),
        ("ipc", c.ipc.is_some()),
        ("ulimits", !c.ulimits.is_empty()),
        ("cap_add", !c.cap_add.is_empty()),
        ("user", c.user.is_some()),
        ("devices", !c.devices.is_empty()),
        ("seccomp", c.seccomp.is_some()),
        // Not a loosening, but checked against the host when a run starts.
        ("cpus", c.cpus.is_some()),
    ];
    let marks = asked
        .iter()
        .filter(|(_, given)| *given)
        .map(|(key, _)| (*key, check.root.locate(&key_path(at, &[key])).mark))
        .collect();
    Ok(ContainerConfig {
        cpus: c.cpus,
        memory: c.memory,
        shm: c.shm.unwrap_or(Size(1 << 30)),
        disk: c.disk.unwrap_or(Size(10 << 30)),
        reports_size: c.reports_size.unwrap_or(Size(1 << 30)),
        pids,
        network: c.network.unwrap_or(Network::None),
        env: env_map(
            check,
            &key_path(at, &["env"])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            c.env,
        )?,
        pass_env: c.pass_env,
        gpu_driver: c.gpu_driver.unwrap_or(GpuDriver::Nvidia),
        mounts,
        ipc: c.ipc.unwrap_or(Ipc::Private),
        ulimits,
        cap_add,
        user,
        devices,
        optional_devices,
        seccomp,
        marks,
    })
}

/// `cpus`, `pids`, `pass_env`, `disk` and `reports_size`; gives the pid limit.
fn validate_limits(
    check: &Checker<'_>,
    at: &[&str],
    c: &RawContainer,
) -> Result<u32, ManifestError> {
    if let Some(cpus) = c.cpus
        && !cpus_in_range(cpus)
    {
        return Err(check.at(&key_path(at, &["cpus"]), CPUS_RANGE));
    }
    let pids = c.pids.unwrap_or(4096);
    if pids <= 0 || pids > u32::MAX as i64 {
        return Err(check.at(&key_path(at, &["pids"]), "must be a positive whole number"));
    }
    for (i, name) in c.pass_env.iter().enumerate() {
        if !is_env_name(name) {
            return Err(check.at(
                &key_path(at, &["pass_env", &i.to_string()]),
                format!("`{name}` is not a valid environment variable name"),
            ));
        }
        if let Some(why) = reserved_env(name).or(super::values::not_passed(name)) {
            return Err(check.at(
                &key_path(at, &["pass_env", &i.to_string()]),
                format!("`{name}` {why}"),
            ));
        }
    }
    for (field, size) in [("disk", c.disk), ("reports_size", c.reports_size)] {
        if size.is_some_and(|s| s.0 < 1 << 20) {
            return Err(check.at(&key_path(at, &[field]), "must be at least 1m"));
        }
    }
    Ok(pids as u32)
}

/// `mounts`: each within the mount policy ([`check_mount_source`],
/// [`check_mount_target`]), each target its own.
fn validate_mounts(
    check: &Checker<'_>,
    at: &[&str],
    raw: &[serde_json::Value],
) -> Result<Vec<HostMount>, ManifestError> {
    let mut mounts = Vec::new();
    for (i, m) in raw.iter().enumerate() {
        let idx = i.to_string();
        let here = key_path(at, &["mounts", &idx]);
        let (source, target) = mount_source_and_target(check, &here, m)?;
        let mark = check.root.locate(&here).mark;
        let source_path = PathBuf::from(&source);
        if let Err(why) = check_mount_source(&source_path) {
            return Err(check.at(&here, format!("source `{source}`: {why}")));
        }
        if let Err(why) = check_mount_target(&target) {
            return Err(check.at(&here, format!("target `{target}`: {why}")));
        }
        let normal: PathBuf = Path::new(&target).components().collect();
        if let Some(other) = mounts.iter().position(|m: &HostMount| {
            Path::new(&m.target).components().collect::<PathBuf>() == normal
        }) {
            return Err(check.at(
                &here,
                format!("target `{target}` is also the target of mount {other}; each mount needs its own"),
            ));
        }
        mounts.push(HostMount {
            source: source_path,
            target,
            mark,
        });
    }
    Ok(mounts)
}

/// One mount as written, `SOURCE:TARGET` (or `PATH`, mounted at itself) or
/// `{source: …, target: …}`: its source and target, not yet checked.
fn mount_source_and_target(
    check: &Checker<'_>,
    here: &[String],
    m: &serde_json::Value,
) -> Result<(String, String), ManifestError> {
    Ok(match m {
        serde_json::Value::String(text) => match text.split_once(':') {
            Some((s, t)) => (s.to_string(), t.to_string()),
            None => (text.clone(), text.clone()),
        },
        serde_json::Value::Object(o) => {
            if let Some(k) = o.keys().find(|k| *k != "source" && *k != "target") {
                return Err(check.at(
                    here,
                    format!(
                        "unknown key `{k}`; a mount has `source` and `target` (always read-only)"
                    ),
                ));
            }
            let text = |k: &str| o.get(k).and_then(|v| v.as_str()).map(str::to_string);
            match (text("source"), text("target")) {
                (Some(s), Some(t)) => (s, t),
                (Some(s), None) => (s.clone(), s),
                _ => {
                    return Err(
                        check.at(here, "needs `source:` (a host path) and may have `target:`")
                    );
                }
            }
        }
        _ => {
            return Err(check.at(here, "a mount is `SOURCE:TARGET` or {source: …, target: …}"));
        }
    })
}

/// The most `fs.nr_open` can be on any 64-bit kernel (`sysctl_nr_open_max`), so the
/// most open files a ulimit can ask.
const NR_OPEN_CEILING: i64 = 2_147_483_584;

/// `ulimits`, by name.
fn validate_ulimits(
    check: &Checker<'_>,
    at: &[&str],
    raw: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, Ulimit>, ManifestError> {
    let mut ulimits = BTreeMap::new();
    for (name, value) in raw {
        let here = key_path(at, &["ulimits", name]);
        let limit = validate_ulimit(check, &here, name, value)?;
        ulimits.insert(name.clone(), limit);
    }
    Ok(ulimits)
}

/// One ulimit: a known name, a number or `unlimited` (or a soft and a hard one), and
/// not so low that the batch's shell cannot work.
fn validate_ulimit(
    check: &Checker<'_>,
    here: &[String],
    name: &str,
    value: &serde_json::Value,
) -> Result<Ulimit, ManifestError> {
    if !ULIMIT_NAMES.contains(&name) {
        return Err(check.at(
            here,
            format!(
                "`{name}` is not a ulimit; known: {}",
                ULIMIT_NAMES.join(", ")
            ),
        ));
    }
    let one = |v: &serde_json::Value| -> Option<i64> {
        match v {
            serde_json::Value::String(s) if s == "unlimited" => Some(-1),
            serde_json::Value::Number(n) => n.as_i64().filter(|n| *n >= 0),
            _ => None,
        }
    };
    let limit = match value {
        serde_json::Value::Object(o) => match (
            o.get("soft").and_then(one),
            o.get("hard").and_then(one),
            o.len(),
        ) {
            (Some(soft), Some(hard), 2) => Ulimit { soft, hard },
            _ => return Err(check.at(here, "is a number, `unlimited`, or {soft: …, hard: …}")),
        },
        v => match one(v) {
            Some(n) => Ulimit { soft: n, hard: n },
            None => {
                return Err(check.at(here, "is a number, `unlimited`, or {soft: …, hard: …}"));
            }
        },
    };
    if name == "nofile" {
        // The kernel caps open files at fs.nr_open, itself at most NR_OPEN_CEILING.
        if limit.soft == -1 || limit.hard == -1 {
            return Err(check.at(
                here,
                format!(
                    "open files cannot be unlimited: the kernel caps them at fs.nr_open (at most {NR_OPEN_CEILING}); give a number"
                ),
            ));
        }
        if limit.hard > NR_OPEN_CEILING {
            return Err(check.at(
                here,
                format!(
                    "{} is more open files than any kernel allows (fs.nr_open is at most {NR_OPEN_CEILING})",
                    limit.hard
                ),
            ));
        }
    }
    if limit.hard != -1 && (limit.soft == -1 || limit.soft > limit.hard) {
        return Err(check.at(here, "the soft limit is above the hard one"));
    }
    // Below these the batch's shell cannot start (or fork, or open its files).
    let floor = match name {
        "nofile" | "nproc" => 64,
        "stack" => 65536,
        "fsize" => 1 << 20,
        "data" => 64 << 20,
        _ => 0,
    };
    if limit.soft != -1 && limit.soft < floor {
        return Err(check.at(
            here,
            format!(
                "{} is too low for the batch's own shell to work; at least {floor}",
                limit.soft
            ),
        ));
    }
    Ok(limit)
}

/// `cap_add`: names from [`CAP_ADD_ALLOWED`] (any case, `CAP_` or not), each once.
fn validate_cap_add(
    check: &Checker<'_>,
    at: &[&str],
    raw: &[String],
) -> Result<Vec<String>, ManifestError> {
    let mut cap_add = Vec::new();
    for (i, cap) in raw.iter().enumerate() {
        let name = cap.to_ascii_uppercase();
        let name = name.strip_prefix("CAP_").unwrap_or(&name).to_string();
        if !CAP_ADD_ALLOWED.contains(&name.as_str()) {
            return Err(check.at(
                &key_path(at, &["cap_add", &i.to_string()]),
                format!(
                    "`{cap}` is not allowed; cap_add takes only {} (every other capability stays dropped)",
                    CAP_ADD_ALLOWED.join(", ")
                ),
            ));
        }
        if cap_add.contains(&name) {
            return Err(check.at(
                &key_path(at, &["cap_add", &i.to_string()]),
                format!("`{cap}` is listed twice"),
            ));
        }
        cap_add.push(name);
    }
    Ok(cap_add)
}

/// `user`: `invoker` (the default), `root` or `UID:GID`.
fn validate_user(
    check: &Checker<'_>,
    at: &[&str],
    user: Option<&str>,
) -> Result<ContainerUser, ManifestError> {
    Ok(match user {
        None | Some("invoker") => ContainerUser::Invoker,
        Some("root") => ContainerUser::Root,
        Some(text) => {
            // Not 0 (that is `root`, said so) and not 2^32-1, which means "none" to
            // the kernel.
            let id = |s: &str| {
                s.parse::<u32>()
                    .ok()
                    .filter(|n| (1..u32::MAX).contains(n) && !s.starts_with('+'))
            };
            let ids = text
                .split_once(':')
                .and_then(|(u, g)| Some((id(u)?, id(g)?)));
            match ids {
                Some((u, g)) => ContainerUser::Ids(u, g),
                None => {
                    return Err(check.at(
                        &key_path(at, &["user"]),
                        format!("`{text}` is not `invoker`, `root` or `UID:GID` (numbers from 1 to 4294967294; for uid or gid 0 write `root`)"),
                    ));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::{REAL, assert_refused};

    #[test]
    fn container_settings_refuse_bad_input_with_a_position() {
        assert_refused(
            REAL,
            &[
                (
                    "cap_ipc_lock",
                    "SYS_ADMIN",
                    "batches.e2e.container.cap_add.1: `SYS_ADMIN` is not allowed; cap_add takes only IPC_LOCK, SYS_NICE, SYS_PTRACE",
                ),
                (
                    "user: root",
                    "user: admin",
                    "container.user: `admin` is not `invoker`, `root` or `UID:GID`",
                ),
                (
                    "memlock: unlimited",
                    "memlock: lots",
                    "ulimits.memlock: is a number, `unlimited`, or {soft: …, hard: …}",
                ),
                (
                    "memlock: unlimited",
                    "memlok: 1",
                    "`memlok` is not a ulimit",
                ),
                (
                    "ipc: host",
                    "ipc: shareable",
                    "`shareable` is not allowed here",
                ),
                (
                    "{source: /data/datasets}",
                    "{source: /data/datasets, target: /models/}",
                    "target `/models/` is also the target of mount 0",
                ),
                (
                    "user: root",
                    "user: \"4294967295:1\"",
                    "numbers from 1 to 4294967294",
                ),
                (
                    "user: root",
                    "user: \"65534:0\"",
                    "for uid or gid 0 write `root`",
                ),
                (
                    "user: root",
                    "user: \"1000:1000\"",
                    "container.cap_add: takes effect only with `user: root` (a batch running as 1000:1000 gets no capability)",
                ),
                (
                    "nofile: {soft: 1024, hard: 65536}",
                    "nofile: 0",
                    "ulimits.nofile: 0 is too low for the batch's own shell to work; at least 64",
                ),
                (
                    "cap_ipc_lock",
                    "\"SYS_NICE \"",
                    "`SYS_NICE ` is not allowed",
                ),
                (
                    "cap_ipc_lock",
                    "sys_nice",
                    "cap_add.1: `sys_nice` is listed twice",
                ),
            ],
        );
    }
}
