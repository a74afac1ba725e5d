//! Which scheduler runs this host's batches (docs/interface.md §14): `local` (the
//! default: each batch leases GPUs here and runs in a container here) or `slurm` (this
//! host is a login node: each batch is submitted to a Slurm cluster as a job, and runs
//! on the node Slurm allocates). Only the host's admin decides that, in the policy.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::units::Span;

/// How long a Slurm job may run beyond its batch's timeout before Slurm ends it: the
/// node's setup (image, probe, lease, source copy) and teardown (reports, removal).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(300);

/// Options cibox itself sets on every job, which `slurm.options` may not set again.
pub const OWN_OPTIONS: [&str; 22] = [
    "-J",
    "--job-name",
    "-t",
    "--time",
    "--gres",
    "-G",
    "--gpus",
    "--gpus-per-node",
    "-N",
    "--nodes",
    "-n",
    "--ntasks",
    "--ntasks-per-node",
    "-p",
    "--partition",
    "-A",
    "--account",
    "-q",
    "--qos",
    "-o",
    "--output",
    "--label",
];

/// How this host runs batches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Scheduler {
    /// Here, in containers of this host's engine, on GPUs leased here.
    #[default]
    Local,
    /// As Slurm jobs, on the nodes Slurm allocates.
    Slurm(SlurmPolicy),
}

/// Where and how a login node submits batches to Slurm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmPolicy {
    /// `--partition`; `None`: the cluster's default partition.
    pub partition: Option<String>,
    /// `--account`.
    pub account: Option<String>,
    /// `--qos`.
    pub qos: Option<String>,
    /// Further options, passed to `srun` as written (`--exclusive`, `--constraint=a100`).
    pub options: Vec<String>,
    /// Added to a batch's timeout for the job's time limit.
    pub grace: Duration,
    /// The cibox the nodes run (the same build, at a path every node has); `None`:
    /// this cibox's own path.
    pub cibox: Option<PathBuf>,
    /// The GRES type of each GPU model a batch may ask (`gpu_model` as written → the
    /// type the cluster's `gres.conf` names, `h100`): its job asks `--gres=gpu:TYPE:N`.
    pub gres_types: Vec<(String, String)>,
}

/// A batch asks for a GPU model that the policy gives no GRES type: submitted untyped,
/// Slurm could allocate GPUs of any model.
#[derive(Debug, thiserror::Error)]
#[error(
    "batch {batch} asks for GPU model `{}`, and the host policy's slurm.gres_types gives it no GRES type{}: add `\"{}\": TYPE` (the type the cluster's gres.conf names)",
    crate::util::escape(.glob),
    typed_list(.known),
    crate::util::escape(.glob)
)]
pub struct NoGresType {
    pub batch: String,
    pub glob: String,
    /// The models the policy does type.
    pub known: Vec<String>,
}

fn typed_list(models: &[String]) -> String {
    match models.is_empty() {
        true => String::new(),
        false => format!(" (it types {})", models.join(", ")),
    }
}

impl crate::error::ErrorKind for NoGresType {
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }
}

impl SlurmPolicy {
    /// The GRES type a job of `batch` asks for: none without a model, the policy's type
    /// for its model, and a refusal for a model the policy does not type.
    pub fn gres_type(&self, batch: &str, model: Option<&str>) -> Result<Option<&str>, NoGresType> {
        let Some(glob) = model else {
            return Ok(None);
        };
        match self.gres_types.iter().find(|(g, _)| g == glob) {
            Some((_, t)) => Ok(Some(t.as_str())),
            None => Err(NoGresType {
                batch: batch.to_string(),
                glob: glob.to_string(),
                known: self.gres_types.iter().map(|(g, _)| g.clone()).collect(),
            }),
        }
    }
}

impl Scheduler {
    /// `local`, or `slurm (partition gpu, account ml, …)`: what `host policy` shows.
    pub fn describe(&self) -> String {
        let Scheduler::Slurm(p) = self else {
            return "local".into();
        };
        let mut parts = vec![format!(
            "partition {}",
            p.partition.as_deref().unwrap_or("(the cluster's default)")
        )];
        for (what, value) in [("account", &p.account), ("qos", &p.qos)] {
            if let Some(v) = value {
                parts.push(format!("{what} {v}"));
            }
        }
        if !p.options.is_empty() {
            parts.push(format!("options {}", p.options.join(" ")));
        }
        parts.push(format!("grace {}", Span(p.grace)));
        if let Some(c) = &p.cibox {
            parts.push(format!("nodes run {}", c.display()));
        }
        if !p.gres_types.is_empty() {
            let types: Vec<String> = p
                .gres_types
                .iter()
                .map(|(g, t)| format!("{g} → gpu:{t}"))
                .collect();
            parts.push(format!("GRES types {}", types.join(", ")));
        }
        format!("slurm ({})", parts.join(", "))
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RawScheduler {
    #[default]
    Local,
    Slurm,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSlurm {
    partition: Option<String>,
    account: Option<String>,
    qos: Option<String>,
    #[serde(default)]
    options: Vec<String>,
    grace: Option<Span>,
    cibox: Option<PathBuf>,
    #[serde(default)]
    gres_types: indexmap::IndexMap<String, String>,
}

/// The scheduler a policy's `scheduler` and `slurm` keys describe; an error is the key
/// path (from the policy's root) and what is wrong with it.
pub fn scheduler(
    kind: Option<RawScheduler>,
    slurm: Option<RawSlurm>,
) -> Result<Scheduler, (Vec<String>, String)> {
    let at = |path: &[&str], message: String| {
        Err((path.iter().map(|s| s.to_string()).collect(), message))
    };
    let raw = match (kind.unwrap_or_default(), slurm) {
        (RawScheduler::Local, None) => return Ok(Scheduler::Local),
        (RawScheduler::Local, Some(_)) => {
            return at(
                &["slurm"],
                "is set but `scheduler` is not `slurm`; say `scheduler: slurm` or remove it".into(),
            );
        }
        (RawScheduler::Slurm, raw) => raw.unwrap_or_default(),
    };
    for (key, value) in [
        ("partition", &raw.partition),
        ("account", &raw.account),
        ("qos", &raw.qos),
    ] {
        if let Some(v) = value
            && !is_slurm_name(v)
        {
            return at(
                &["slurm", key],
                format!(
                    "`{}` is not a Slurm name (letters, digits, `_`, `.`, `-`)",
                    crate::util::escape(v)
                ),
            );
        }
    }
    for (i, option) in raw.options.iter().enumerate() {
        if let Some(why) = bad_option(option) {
            return at(&["slurm", "options", &i.to_string()], why);
        }
    }
    for (glob, kind) in &raw.gres_types {
        if let Err(why) = crate::manifest::check_model_glob(glob) {
            return at(&["slurm", "gres_types"], format!("a model {why}"));
        }
        if !is_slurm_name(kind) {
            return at(
                &["slurm", "gres_types", glob],
                format!(
                    "`{}` is not a GRES type (letters, digits, `_`, `.`, `-`)",
                    crate::util::escape(kind)
                ),
            );
        }
    }
    let grace = raw.grace.map_or(DEFAULT_GRACE, |g| g.0);
    if let Some(path) = &raw.cibox
        && !path.is_absolute()
    {
        return at(&["slurm", "cibox"], "must be an absolute path".into());
    }
    Ok(Scheduler::Slurm(SlurmPolicy {
        partition: raw.partition,
        account: raw.account,
        qos: raw.qos,
        options: raw.options,
        grace,
        cibox: raw.cibox,
        gres_types: raw.gres_types.into_iter().collect(),
    }))
}

/// A partition, account or QoS name as Slurm writes them.
pub fn is_slurm_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Why an extra option cannot be passed to `srun`, or `None` when it can.
fn bad_option(option: &str) -> Option<String> {
    if !option.starts_with('-') || option.chars().any(char::is_control) {
        return Some(format!(
            "`{}` is not an option (one `--name=value` or `-x` per entry)",
            crate::util::escape(option)
        ));
    }
    let name = option.split('=').next().unwrap_or(option);
    // `-N2` as well as `-N 2`: short options carry their value attached.
    let short = (!option.starts_with("--")).then(|| &option[..option.len().min(2)]);
    let own = OWN_OPTIONS
        .iter()
        .find(|o| **o == name || Some(**o) == short);
    own.map(|o| format!("`{o}` is cibox's to set (from the batch and the keys beside `options`)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slurm(options: &[&str]) -> RawSlurm {
        RawSlurm {
            options: options.iter().map(|s| s.to_string()).collect(),
            ..RawSlurm::default()
        }
    }

    #[test]
    fn slurm_keys_need_the_slurm_scheduler_and_leave_cibox_its_own_options() {
        assert_eq!(scheduler(None, None).unwrap(), Scheduler::Local);
        let (path, why) = scheduler(None, Some(slurm(&[]))).unwrap_err();
        assert_eq!(path, ["slurm"]);
        assert!(why.contains("scheduler: slurm"), "{why}");
        let Scheduler::Slurm(p) =
            scheduler(Some(RawScheduler::Slurm), Some(slurm(&["--exclusive"]))).unwrap()
        else {
            panic!("a Slurm scheduler");
        };
        assert_eq!(p.grace, DEFAULT_GRACE);
        assert_eq!(p.options, ["--exclusive"]);
        for bad in [
            "--time=5",
            "-N2",
            "--gres=gpu:1",
            "-J",
            "exclusive",
            "--x\n",
        ] {
            let e = scheduler(Some(RawScheduler::Slurm), Some(slurm(&[bad])));
            assert!(e.is_err(), "{bad} passed");
        }
        let bad_name = RawSlurm {
            partition: Some("gpu;rm".into()),
            ..RawSlurm::default()
        };
        let (path, _) = scheduler(Some(RawScheduler::Slurm), Some(bad_name)).unwrap_err();
        assert_eq!(path, ["slurm", "partition"]);
    }

    #[test]
    fn a_gpu_model_gets_the_gres_type_the_policy_gives_it_or_is_refused() {
        let typed = |types: &[(&str, &str)]| {
            scheduler(
                Some(RawScheduler::Slurm),
                Some(RawSlurm {
                    gres_types: types
                        .iter()
                        .map(|(g, t)| (g.to_string(), t.to_string()))
                        .collect(),
                    ..RawSlurm::default()
                }),
            )
        };
        let Scheduler::Slurm(p) = typed(&[("*H100*", "h100"), ("*MI300X*", "mi300x")]).unwrap()
        else {
            panic!("a Slurm scheduler");
        };
        assert_eq!(p.gres_type("b", None).unwrap(), None);
        assert_eq!(p.gres_type("b", Some("*H100*")).unwrap(), Some("h100"));
        let err = p.gres_type("b", Some("*A100*")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "batch b asks for GPU model `*A100*`, and the host policy's slurm.gres_types gives it no GRES type (it types *H100*, *MI300X*): add `\"*A100*\": TYPE` (the type the cluster's gres.conf names)"
        );
        assert_eq!(
            crate::error::Error::from(err).exit_code(),
            crate::exit::USAGE
        );
        assert!(Scheduler::Slurm(p).describe().contains("*H100* → gpu:h100"));
        let (path, _) = typed(&[("*H100*", "h100:2")]).unwrap_err();
        assert_eq!(path, ["slurm", "gres_types", "*H100*"]);
        let (path, _) = typed(&[("", "h100")]).unwrap_err();
        assert_eq!(path, ["slurm", "gres_types"]);
    }
}
