//! One run's setup, for every front end that runs batches (`batch run`, `layer run`,
//! `image qualify`, `reproduce`, `changed run`): each builds a [`RunRequest`] (with
//! [`locate`] for where it runs) and calls [`run`], which checks, plans, verifies and
//! executes it with the standard reporters.
//!
//! The order is the contract's: everything that needs only the manifest and the host
//! is checked before the engine is asked, and bad input leaves nothing behind.

use std::path::{Path, PathBuf};

use crate::engine::{Engine, HostView};
use crate::host::{self, HostPolicy, Scheduler, SlurmPolicy};
use crate::image::{ImageError, Lockset, PinnedRef};
use crate::manifest::{Manifest, ManifestError};
use crate::plan::container::mounts::{self, EngineFacts, RunFolders};
use crate::plan::run_plan::SourceInfo;
use crate::plan::{self, HostFacts, RunPlan, RunRequest};
use crate::report::outcome::RunResult;
use crate::report::reporter::buildkite::Buildkite;
use crate::report::reporter::files::Files;
use crate::report::reporter::github::GitHub;
use crate::report::reporter::pump::Pump;
use crate::report::reporter::terminal::Terminal;
use crate::report::reporter::wire::Wire;
use crate::report::reporter::{Fanout, Reporter};
use crate::run::error::RunError;
use crate::run::slurm::NodeJob;
use crate::run::source::OUTPUT_FOLDERS;
use crate::{console, signals};

use crate::error::Result;

/// Plans and executes a run with the reporters of a front end: the reports folder, the
/// terminal, and GitHub when cibox runs in a workflow. What the manifest asks beyond the
/// locked-down default must be granted by `policy`. Where the policy says
/// `scheduler: slurm`, each batch runs as a Slurm job on the node Slurm allocates. With
/// `json`, standard output is kept for the outcome the front end prints: the batches'
/// output and GitHub's commands go to standard error.
pub fn run(
    manifest: Manifest,
    policy: &HostPolicy,
    request: RunRequest,
    json: bool,
) -> Result<RunResult> {
    let names = plan::check_request(&manifest, &request)?;
    run_checked(manifest, policy, request, names, json)
}

/// [`run`] of a request whose batches [`plan::check_request`] gave (`names`): the
/// command that checked it first runs it without checking it twice.
pub fn run_checked(
    manifest: Manifest,
    policy: &HostPolicy,
    request: RunRequest,
    names: Vec<String>,
    json: bool,
) -> Result<RunResult> {
    let names = check(&manifest, policy, &request, names)?;
    let mut request = request;
    request.private_caches = request
        .private_caches
        .take()
        .or_else(crate::github::untrusted_event);
    let not_scoped = pull_request_scope(policy, &mut request);
    request.artifacts = crate::artifact::RunArtifacts {
        key: crate::run::artifacts::key(
            request.private_caches.is_some() || request.pull_request.is_some(),
        ),
        max_bytes: policy
            .artifacts_max
            .unwrap_or(crate::artifact::DEFAULT_MAX_BYTES),
        host_reports: None,
    };
    warn_private_caches(&manifest, policy, &request, &names, not_scoped.as_deref());
    if let (Scheduler::Slurm(slurm), None) = (&policy.scheduler, &request.node) {
        no_shards_through_slurm(&manifest, &names)?;
        no_collected_through_slurm(&manifest, &names)?;
        crate::run::artifacts::refuse_under_slurm(&manifest, &names)?;
        return submit(manifest, policy, slurm, request, json);
    }
    let mut reporters = standard_reporters(json)?;
    run_here(manifest, policy, request, &names, &mut reporters)
}

/// Where the host keeps pull requests' cache writes (`caches.pull_requests: keep`), a
/// run of a workflow event that names one pull request keeps them in that pull
/// request's scope: the event's number is taken from its event file, checked against
/// the run (section 13). Why a run of such an event is not one pull request's, when it
/// is not (its writes then stay private).
fn pull_request_scope(policy: &HostPolicy, request: &mut RunRequest) -> Option<String> {
    let caches = policy.caches.as_ref()?;
    let event = request.private_caches.as_deref()?;
    if !(caches.trusted && caches.pull_requests.keep)
        || event == crate::plan::run_plan::REPLAY
        || request.node.is_some()
    {
        return None;
    }
    match crate::github::pull_request(request.source_info.sha.as_deref()) {
        Ok(n) => {
            request.pull_request = Some(n);
            request.private_caches = None;
            None
        }
        Err(why) => Some(why),
    }
}

/// A host that trusts its runs' cache writes trusts the code they run; a run of code
/// nobody merged (a pull request's, even one the approved-commit pattern started from
/// the base branch) writes privately, or, where the host keeps pull requests' writes,
/// into its pull request's scope: said when it matters.
fn warn_private_caches(
    manifest: &Manifest,
    policy: &HostPolicy,
    request: &RunRequest,
    names: &[String],
    not_scoped: Option<&str>,
) {
    let used = names.iter().any(|n| {
        manifest
            .batches
            .get(n)
            .is_some_and(|b| !b.caches.is_empty())
    });
    if let Some(n) = request.pull_request
        && used
    {
        console::info(format!(
            "cache writes of this run are kept for pull request {n} only (the host's caches.pull_requests: keep): its later runs read them over the base branch's; no other pull request's run or base run does"
        ));
    }
    let (Some(event), Some(caches)) = (&request.private_caches, &policy.caches) else {
        return;
    };
    if caches.trusted && used {
        let what = if event == crate::plan::run_plan::REPLAY {
            "a replay of a recorded run (cibox reproduce), whose record anyone may have written"
                .to_string()
        } else {
            format!("a {event} run, whose code may not be merged")
        };
        let what = match not_scoped {
            Some(why) => format!("{what}, and it is not believed to be one pull request's ({why})"),
            None => what,
        };
        console::warn(format!(
            "this host keeps what its runs write to caches (caches.trusted), but this is {what}: its cache writes stay private and are thrown away"
        ));
    }
}

/// The reporters of a run on this host's terminal.
fn standard_reporters(json: bool) -> Result<Fanout> {
    // One queue for stdout, so the batches' output stays inside GitHub's fences; under
    // --json, stdout is the outcome's alone and everything else goes to stderr.
    // A terminal, or `2>&1` into one file: one queue, so cibox's lines (a step's phase
    // line, a timeout) come out where they happened among the output.
    let one = json || one_destination();
    let (out, err) = if json {
        let err = Pump::stderr();
        (err.clone(), err)
    } else if one {
        let out = Pump::stdout();
        (out.clone(), out)
    } else {
        (Pump::stdout(), Pump::stderr())
    };
    let mut terminal = Terminal::new(out.clone(), err).with_heartbeat(heartbeat());
    if one {
        terminal = terminal.one_stream();
    }
    // Files first: a batch's status is printed once its result.json is written.
    let mut reporters = Fanout::new().with(Files::new()).with(terminal);
    if crate::github::active() {
        let github = GitHub::new(out.clone()).map_err(RunError::NoStopToken)?;
        reporters = reporters.with(github);
    }
    if crate::buildkite::active() {
        reporters = reporters.with(Buildkite::new(out));
    }
    Ok(reporters)
}

/// Whether standard output and standard error lead to the same file (a terminal, a
/// pipe or file both were sent to).
fn one_destination() -> bool {
    use std::os::unix::fs::MetadataExt;
    let meta = |fd: std::os::fd::BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .map(std::fs::File::from)
            .and_then(|f| f.metadata())
            .map(|m| (m.dev(), m.ino()))
    };
    use std::os::fd::AsFd;
    match (
        meta(std::io::stdout().as_fd()),
        meta(std::io::stderr().as_fd()),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// What needs only the manifest, the request and the policy; the run's batches.
fn check(
    manifest: &Manifest,
    policy: &HostPolicy,
    request: &RunRequest,
    names: Vec<String>,
) -> Result<Vec<String>> {
    // `changed run`'s test files, named by data from elsewhere: files of this source.
    for name in &names {
        if let Some(file) = manifest
            .batches
            .get(name)
            .and_then(|b| b.changed_file.as_ref())
        {
            check_test_file_in(&request.source, file)?;
        }
    }
    if let Some(src) = &policy.source
        && (src.path.starts_with(&request.source) || src.path.starts_with(&request.reports))
    {
        return Err(crate::error::Error::from(host::PolicyError::Unusable {
            path: src.path.display().to_string(),
            message: "lies in this run's source or reports folder, where a pull request's files are; the host's policy lives outside every checkout".into(),
        }));
    }
    host::check_requests(policy, manifest, &names)?;
    Ok(names)
}

/// A sharded batch runs on a host that runs batches itself: Slurm's node side names a
/// batch, not one of its shards. Said at the batch's `shards`, before anything starts.
fn no_shards_through_slurm(manifest: &Manifest, names: &[String]) -> Result<()> {
    let Some((name, b)) = names
        .iter()
        .filter_map(|n| Some((n, manifest.batches.get(n)?)))
        .find(|(_, b)| b.shards > 1)
    else {
        return Ok(());
    };
    Err(ManifestError::At {
        path: manifest.path.display().to_string(),
        mark: manifest
            .mark_of(&["batches", name, "shards"])
            .unwrap_or_default(),
        message: format!(
            "batch {name} has {} shards, and this host submits batches to Slurm (its policy says `scheduler: slurm`), which runs a batch whole: give it shards: 1 here, or run it on a host that runs batches itself",
            b.shards
        ),
    }
    .into())
}

/// A batch of a test list the project's code prints (`collect:`) is refused where Slurm
/// runs the batches: a node reads the manifest as committed, without the list, and
/// would not know the batch.
fn no_collected_through_slurm(manifest: &Manifest, names: &[String]) -> Result<()> {
    let Some((name, family)) = names
        .iter()
        .filter_map(|n| Some((n, manifest.batches.get(n)?.family.as_deref()?)))
        .find(|(_, f)| manifest.collectors.contains_key(*f))
    else {
        return Ok(());
    };
    Err(ManifestError::At {
        path: manifest.path.display().to_string(),
        mark: manifest
            .mark_of(&["batches", family, "collect"])
            .unwrap_or_default(),
        message: format!(
            "batch {name} is of a list the project's code prints (`collect:`), and this host submits batches to Slurm (its policy says `scheduler: slurm`), whose nodes read no such list: write the list out (`each:`), or run it on a host that runs batches itself"
        ),
    }
    .into())
}

/// Each image the run uses, with its own lock files.
fn locksets(plan: &crate::plan::RunPlan) -> Result<indexmap::IndexMap<String, Lockset>> {
    let mut locksets = indexmap::IndexMap::new();
    for name in plan.images.keys() {
        locksets.insert(name.clone(), plan.manifest.lockset(name)?);
    }
    Ok(locksets)
}

fn no_run_id(e: std::io::Error) -> RunError {
    RunError::NoRunId(e)
}

/// What the engine would refuse for every batch, or could not do on this host, said at
/// its place in the manifest before anything starts: more CPUs than the host has (the
/// engine refuses the container), several nodes without a scheduler to give them.
fn fits_this_host(manifest: &Manifest, names: &[String], on_node: bool) -> Result<()> {
    let host_cpus = nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN)
        .ok()
        .flatten()
        .filter(|n| *n > 0);
    let at = |mark: Option<crate::yaml::Mark>, message: String| ManifestError::At {
        path: manifest.path.display().to_string(),
        mark: mark.unwrap_or_default(),
        message,
    };
    for name in names {
        let Some(b) = manifest.batches.get(name) else {
            continue;
        };
        if let (Some(cpus), Some(host)) = (b.container.cpus, host_cpus)
            && cpus > host as f64
        {
            return Err(at(
                b.container.marks.get("cpus").copied(),
                format!(
                    "batch {name}: container.cpus is {cpus}, and this host has {}: the engine would refuse its container; ask for at most {host}",
                    crate::util::count(host as u64, "CPU")
                ),
            )
            .into());
        }
        // A Slurm node runs its own part of a batch on several nodes.
        if b.nodes > 1 && !on_node {
            return Err(at(
                manifest.mark_of(&["batches", name, "nodes"]),
                format!(
                    "batch {name} asks for {} nodes, and this host runs batches itself (its policy names no `scheduler: slurm`): give it nodes: 1, or run it where Slurm is",
                    b.nodes
                ),
            )
            .into());
        }
    }
    Ok(())
}

/// Runs the batches here, each in a container of this host's engine.
fn run_here(
    manifest: Manifest,
    policy: &HostPolicy,
    request: RunRequest,
    names: &[String],
    reporters: &mut dyn Reporter,
) -> Result<RunResult> {
    let folders = RunFolders {
        source: &request.source,
        reports: &request.reports,
        lock_dir: &manifest.gpu.lock_dir,
    };
    fits_this_host(&manifest, names, request.node.is_some())?;
    let host_mounts = mounts::check_host(&manifest, names, &folders, policy)?;
    let mut host = HostFacts::current(&manifest, host_mounts, policy).map_err(no_run_id)?;
    if let Some(caches) = host.caches.as_mut()
        && (request.private_caches.is_some()
            || (request.pull_request.is_some() && !caches.pull_requests.keep))
    {
        // A pull request's writes go to its scope only where this host keeps them.
        caches.trusted = false;
    }
    host.devices = crate::plan::container::devices::check_devices(&manifest, names, policy)?;
    if let (Some(role), [batch]) = (&request.node, names) {
        host.run_id = role.task_run_id(batch);
    }
    let mut plan = plan::plan(manifest, request, &host)?;
    let locksets = locksets(&plan)?;
    signals::install();
    let engine = Engine::connect()?;
    let mut facts = EngineFacts {
        api: engine.api_version(),
        recursive_read_only: engine.recursive_read_only(),
        root_dir: None,
        userns: false,
    };
    // Only host mounts are checked against the engine's data root and user namespace;
    // its info is slow to gather (a good part of a trivial batch's setup), so it is
    // asked for only when a batch has one.
    if host.mounts.values().any(|m| !m.is_empty()) {
        let info = engine.info()?;
        (facts.root_dir, facts.userns) = (info.root_dir, info.userns);
    }
    mounts::check_engine(&plan.manifest, &host.mounts, &facts, policy)?;
    place_for_engine(&mut plan, &engine, &engine.host_view())?;
    if plan.node.is_some() {
        fetch_missing_images(&engine, &plan)?;
    }
    crate::run::execute(&plan, &locksets, &engine, reporters)
}

/// Submits the batches to Slurm: the nodes check what is theirs to check (mounts, the
/// engine, the image) when they run them.
fn submit(
    manifest: Manifest,
    policy: &HostPolicy,
    slurm: &SlurmPolicy,
    request: RunRequest,
    json: bool,
) -> Result<RunResult> {
    let host = HostFacts::current(&manifest, Default::default(), policy).map_err(no_run_id)?;
    let plan = plan::plan(manifest, request, &host)?;
    let locksets = locksets(&plan)?;
    signals::install();
    let mut reporters = standard_reporters(json)?;
    crate::run::slurm::execute(&plan, &locksets, slurm, &mut reporters)
}

/// On a node of a Slurm job: runs the batch the submitter sent, as a local run of it
/// would, on the GPUs Slurm allocated, telling the submitter everything on stdout.
pub fn run_on_node(job: &NodeJob, policy: &HostPolicy) -> Result<RunResult> {
    let alloc = crate::slurm::alloc::Allocation::current()?;
    let manifest = job.manifest(policy)?;
    let request = job.request(&manifest, &alloc)?;
    let names = plan::check_request(&manifest, &request)?;
    let names = check(&manifest, policy, &request, names)?;
    let mut wire = Wire::stdout();
    run_here(manifest, policy, request, &names, &mut wire)
}

/// A node that lacks an image of the run gets it by its pinned digest (`image.ref`),
/// and keeps it only when it is the very ID the submitter planned with; one without
/// a reference refuses, saying how to get the image there.
fn fetch_missing_images(engine: &Engine, plan: &crate::plan::RunPlan) -> Result<()> {
    for (name, id) in &plan.images {
        if engine.inspect(id.as_str())?.is_some() {
            continue;
        }
        let node = plan.node.as_ref().map_or("this node", |n| n.node.as_str());
        let Some(text) = plan.manifest.images[name].reference.as_deref() else {
            return Err(crate::error::Error::from(ImageError::Refused {
                message: format!(
                    "{id} is not present on Slurm node {node}, and image `{name}` has no `ref` to fetch it by digest"
                ),
                details: vec![
                    "set the image's ref (REPOSITORY@sha256:…) so nodes fetch it, or load it on every node (cibox image load)".into(),
                ],
            }));
        };
        let pinned = PinnedRef::parse(text)?;
        crate::console::info(format!("{id} is not on node {node}: pulling {pinned}"));
        engine.pull(&pinned.repository, &pinned.digest)?;
        let found = engine.inspect(&pinned.to_string())?.map(|i| i.id);
        if found.as_deref() != Some(id.as_str()) {
            return Err(crate::error::Error::from(ImageError::NodeCopyDiffers {
                pinned: pinned.to_string(),
                found: found.unwrap_or_else(|| "(nothing)".into()),
                id: id.clone(),
            }));
        }
    }
    Ok(())
}

/// Where the run's paths are for the engine, when cibox runs in a container of the
/// engine's host (a runner in a container with the engine's socket): host mounts
/// handed over at their host paths, no `/src` bind, the cache store where the engine
/// finds it; and each of those host paths judged on the engine's host itself (by
/// ownership and links, through a helper there: the host resolves them anew when it
/// mounts them, through folders cibox cannot see from its container). On the engine's
/// host nothing changes.
fn place_for_engine(plan: &mut RunPlan, engine: &Engine, w: &HostView) -> Result<()> {
    if w.is_host() {
        return Ok(());
    }
    plan.bind_source = false;
    if plan.batches.iter().any(|b| !b.needs.is_empty()) {
        let host = w.to_host(&plan.reports).map_err(|why| {
            crate::artifact::ArtifactError::Io {
                path: plan.reports.display().to_string(),
                source: std::io::Error::other(format!(
                    "{why}: the artifacts later layers need are mounted from the reports folder; bind it into the runner container, or run cibox on the engine's host"
                )),
            }
        })?;
        plan.artifacts.host_reports = Some(host);
    }
    let source_on_host = w.to_host(&plan.source).ok();
    let path = plan.manifest.path.display().to_string();
    let at = |batch: &str, mark, why: String| {
        crate::error::Error::from(ManifestError::At {
            path: path.clone(),
            mark,
            message: format!("batches.{batch}.container.mounts: {why}"),
        })
    };
    let mut placed = Vec::new();
    for b in &mut plan.batches {
        let mounts = b
            .container
            .place_for_engine(w, source_on_host.as_deref())
            .map_err(|(mark, why)| at(&b.name, mark, why))?;
        placed.extend(mounts.into_iter().map(|m| (b.name.clone(), m)));
    }
    let uses_caches = plan.batches.iter().any(|b| !b.caches.is_empty());
    let mut store = None;
    if let Some(c) = plan.caches.as_mut()
        && uses_caches
    {
        if c.host_root.is_none() {
            let host = w.to_host(&c.root).map_err(|why| {
                crate::error::Error::from(crate::cache::CacheError::Store {
                    path: c.root.clone(),
                    message: format!("{why}; or name where the engine's host has it in the host policy's caches.host_root"),
                })
            })?;
            c.host_root = Some(host);
        }
        store = c.host_root.clone().map(|h| (c.root.clone(), h));
    }
    let mut hosts: Vec<PathBuf> = placed.iter().map(|(_, m)| m.host.clone()).collect();
    hosts.extend(store.iter().map(|(_, h)| h.clone()));
    if hosts.is_empty() {
        return Ok(());
    }
    let unchecked = |why: String| {
        format!(
            "cannot be checked on the engine's host ({why}); run cibox on the engine's host, or without host mounts and caches"
        )
    };
    let folders = engine.host_folders(w, &hosts);
    for (i, (batch, m)) in placed.iter().enumerate() {
        let why = match &folders {
            Err(e) => Some(unchecked(e.clone())),
            Ok(f) => mounts::judge_on_host(&m.inside, &m.host, &f[i]),
        };
        if let Some(why) = why {
            return Err(at(
                batch,
                m.mark,
                format!("source `{}` {why}", m.source.display()),
            ));
        }
    }
    if let Some((inside, host)) = &store {
        let why = match &folders {
            Err(e) => Some(unchecked(e.clone())),
            Ok(f) => mounts::judge_on_host(inside, host, &f[placed.len()]),
        };
        if let Some(why) = why {
            return Err(crate::error::Error::from(crate::cache::CacheError::Store {
                path: inside.clone(),
                message: format!("the cache store {why}"),
            }));
        }
    }
    Ok(())
}

/// How often a quiet batch is said to be alive: `CIBOX_HEARTBEAT` (a duration; `0s`
/// never), else every 30 s; a malformed value means the default.
fn heartbeat() -> std::time::Duration {
    match std::env::var("CIBOX_HEARTBEAT")
        .ok()
        .as_deref()
        .map(str::trim)
    {
        Some("0" | "0s") => std::time::Duration::ZERO,
        Some(text) => text
            .parse::<crate::units::Span>()
            .map_or(crate::report::reporter::terminal::HEARTBEAT, |s| s.0),
        None => crate::report::reporter::terminal::HEARTBEAT,
    }
}

/// Where a run happens, before it is checked.
#[derive(Debug, Default)]
pub struct Whereabouts {
    /// The source; default: the git toplevel, else the current folder.
    pub source: Option<PathBuf>,
    /// The reports folder; default `cibox-reports`.
    pub reports: Option<PathBuf>,
    /// The scope; default per workflow run on GitHub Actions, per user elsewhere.
    pub scope: Option<String>,
}

/// Fills in where `request` runs, checked: the source a directory (canonical, with
/// what git says of it), the reports folder writable or one that can be made (it is
/// made only once the run starts, by `execute`), the scope not empty.
pub fn locate(request: &mut RunRequest, at: Whereabouts) -> Result<()> {
    let source = match at.source {
        Some(s) => s,
        None => git_toplevel()
            .or_else(|| std::env::current_dir().ok())
            .ok_or(RunError::NoSource)?,
    };
    if !source.is_dir() {
        return Err(RunError::SourceNotDir { dir: source }.into());
    }
    let source = source
        .canonicalize()
        .map_err(|e| RunError::SourceUnresolved {
            dir: source.clone(),
            source: e,
        })?;
    // A checkout without a git to ask would ship what git ignores and record no commit
    // (a replay could not find it): refused, naming git, not taken for no checkout.
    if let Some(top) = crate::git::checkout_above(&source)
        && let Some(why) = crate::git::unusable()
    {
        return Err(RunError::NoGit {
            dir: top.to_path_buf(),
            why,
        }
        .into());
    }
    let reports = planned_reports(at.reports.unwrap_or_else(|| PathBuf::from("cibox-reports")))?;
    let source_info = source_info(&source, Some(&reports));
    if source_info.sha.is_none() {
        console::warn(format!(
            "{} is not a git checkout: the run record will carry no commit",
            source.display()
        ));
    }
    let scope = at.scope.unwrap_or_else(default_scope);
    if scope.is_empty() {
        return Err(RunError::EmptyScope.into());
    }
    request.source = source;
    request.source_info = source_info;
    request.reports = reports;
    request.scope = scope;
    Ok(())
}

/// The reports folder, resolved but not made: a folder that exists (canonical, shown
/// writable), or the canonical path of one to be made in the nearest folder that exists
/// (shown writable). Bad input must leave nothing behind, so it is made only when the
/// run starts (by `execute`, once everything is checked).
fn planned_reports(reports: PathBuf) -> Result<PathBuf> {
    let dir = reports.display().to_string();
    let absolute = if reports.is_absolute() {
        reports.clone()
    } else {
        std::env::current_dir()
            .map_err(|source| RunError::ReportsNoCurrentFolder {
                dir: dir.clone(),
                source,
            })?
            .join(&reports)
    };
    // The nearest folder that exists, and the names below it still to be made.
    let mut at = absolute.as_path();
    let mut missing = Vec::new();
    while !at.exists() {
        let (Some(parent), Some(name)) = (at.parent(), at.file_name()) else {
            return Err(RunError::ReportsNowhere { dir }.into());
        };
        missing.push(name.to_os_string());
        at = parent;
    }
    let given = at.to_path_buf();
    let at = at.canonicalize().map_err(|source| RunError::ReportsDir {
        dir: dir.clone(),
        source,
    })?;
    if !at.is_dir() {
        return Err(RunError::ReportsNotADirectory { dir, at }.into());
    }
    // cibox may write there as root: the folder, as named and where it leads, must be
    // one nobody else can change (a link another user planted, a folder they made).
    if let Some(why) =
        crate::nofollow::trusted_folder(&given).or_else(|| crate::nofollow::trusted_folder(&at))
    {
        return Err(RunError::UntrustedReports { dir, why }.into());
    }
    let mut planned = at.clone();
    for name in missing.iter().rev() {
        match Path::new(name).components().next() {
            Some(std::path::Component::Normal(_)) => planned.push(name),
            Some(std::path::Component::CurDir) => {}
            _ => return Err(RunError::ReportsDotDot { dir, at }.into()),
        }
    }
    // Made and removed: only a folder we may write in will do. Made new (`O_EXCL`), by
    // name in the folder: a link planted under the name is refused, never followed.
    let probe = format!(
        ".cibox-write-check-{}",
        crate::util::random_hex(8).unwrap_or_else(|_| std::process::id().to_string())
    );
    crate::nofollow::Folder::open(&at)
        .and_then(|f| {
            f.create_new(&probe, 0o600)?;
            f.remove(&probe)
        })
        .map_err(|source| {
            let at = at.clone();
            if missing.is_empty() {
                RunError::ReportsNotWritable { at, source }
            } else {
                RunError::ReportsCannotBeMade { at, source }
            }
        })?;
    Ok(planned)
}

/// A test file `changed run` or a replay was given: a plain file of `source` (not a
/// link, which could lead out of it).
pub fn check_test_file_in(source: &Path, file: &str) -> Result<()> {
    match std::fs::symlink_metadata(source.join(file)) {
        Ok(md) if md.is_file() => Ok(()),
        Ok(md) if md.file_type().is_symlink() => Err(RunError::TestFileLink {
            file: file.to_string(),
            dir: source.to_path_buf(),
        }
        .into()),
        _ => Err(RunError::TestFileMissing {
            file: file.to_string(),
            dir: source.to_path_buf(),
        }
        .into()),
    }
}

/// The source: the git toplevel (or `--source`), with its commit and dirtiness when it
/// is a checkout. Not being one is allowed and recorded.
pub fn source_info(dir: &Path, reports: Option<&Path>) -> SourceInfo {
    let sha = crate::git::text(dir, &["rev-parse", "--verify", "HEAD"])
        .ok()
        .filter(|s| s.len() == 40);
    // cibox's own output folders in the source (at any depth: a manifest in a subfolder
    // has its reports there) and this run's reports folder make it no dirtier: they
    // never ship.
    let mut excluded: Vec<String> = OUTPUT_FOLDERS
        .iter()
        .map(|f| format!(":(exclude,glob)**/{f}/**"))
        .collect();
    if let Some(rel) = reports.and_then(|r| r.strip_prefix(dir).ok())
        && !rel.as_os_str().is_empty()
        && let Some(rel) = rel.to_str()
    {
        excluded.push(format!(":(exclude,literal){rel}"));
    }
    let mut args = vec![
        "status",
        "--porcelain",
        "--untracked-files=normal",
        "--",
        ".",
    ];
    args.extend(excluded.iter().map(String::as_str));
    let dirty = sha
        .as_ref()
        .and_then(|_| crate::git::text(dir, &args).ok())
        .map(|s| !s.is_empty());
    SourceInfo {
        sha,
        dirty,
        path: dir.display().to_string(),
    }
}

/// The git toplevel of the current folder.
pub fn git_toplevel() -> Option<PathBuf> {
    crate::git::text(Path::new("."), &["rev-parse", "--show-toplevel"])
        .ok()
        .map(PathBuf::from)
}

/// The default scope: per workflow run on GitHub Actions, per user elsewhere.
pub fn default_scope() -> String {
    if let (Ok(id), Ok(attempt)) = (
        std::env::var("GITHUB_RUN_ID"),
        std::env::var("GITHUB_RUN_ATTEMPT"),
    ) {
        return format!("gh-{id}-{attempt}");
    }
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| nix::unistd::getuid().to_string())
        });
    format!("local-{user}")
}
