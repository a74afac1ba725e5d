//! `cibox batch …`.

use serde_json::json;

use std::path::{Path, PathBuf};

use super::Context;
use crate::cli::RunOptions;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::exit;
use crate::image::{ImageId, Lockset};
use crate::lockdir::LockDir;
use crate::manifest::{GpuConfig, Manifest};
use crate::report::{self, Table};
use crate::runner::reporter::Fanout;
use crate::runner::reporter::files::Files;
use crate::runner::reporter::github::GitHub;
use crate::runner::reporter::terminal::{Terminal, print_sweep_notes};
use crate::runner::sweep::sweep;
use crate::runner::{self, HostFacts, RunOutcome, RunRequest};
use crate::signals;
use crate::units::Span;

/// `cibox batch list`: batches (name, GPUs, timeout, description) and layers.
pub fn list(ctx: &Context) -> Result<u8> {
    let m = ctx.manifest()?;
    if ctx.json {
        let batches: Vec<_> = m
            .batches
            .iter()
            .map(|(name, b)| {
                json!({
                    "name": name,
                    "gpus": b.gpus,
                    "timeout": b.timeout.to_string(),
                    "timeout_s": b.timeout.0.as_secs(),
                    "description": b.description,
                    "allow_empty": b.allow_empty,
                })
            })
            .collect();
        let layers: Vec<_> = m
            .layers
            .iter()
            .map(|(name, l)| {
                json!({"name": name, "fast": l.fast, "batches": l.batches, "description": l.description})
            })
            .collect();
        report::json(&json!({"project": m.project, "batches": batches, "layers": layers}));
        return Ok(exit::SUCCESS);
    }
    let mut t = Table::new(&["BATCH", "GPUS", "TIMEOUT", "DESCRIPTION"]);
    for (name, b) in &m.batches {
        t.row(vec![
            name.clone(),
            b.gpus.to_string(),
            b.timeout.to_string(),
            b.description.clone().unwrap_or_default(),
        ]);
    }
    print!("{}", t.render());
    if !m.layers.is_empty() {
        println!();
        let mut t = Table::new(&["LAYER", "FAST", "BATCHES"]);
        for (name, l) in &m.layers {
            let batches = if l.all {
                format!("all ({})", l.batches.join(", "))
            } else {
                l.batches.join(", ")
            };
            t.row(vec![
                name.clone(),
                if l.fast { "yes" } else { "no" }.into(),
                batches,
            ]);
        }
        print!("{}", t.render());
    }
    Ok(exit::SUCCESS)
}

/// `cibox batch run` and `cibox layer run`.
pub fn run(ctx: &Context, names: &[String], layer: Option<&str>, opts: &RunOptions) -> Result<u8> {
    run_manifest(ctx.manifest()?, names, layer, opts)
}

/// Runs batches of a manifest (which `changed run` extends with its own).
pub(super) fn run_manifest(
    m: Manifest,
    names: &[String],
    layer: Option<&str>,
    opts: &RunOptions,
) -> Result<u8> {
    let mut request = RunRequest {
        names: names.to_vec(),
        layer: layer.map(str::to_string),
        fast: if opts.fast {
            Some(true)
        } else if opts.no_fast {
            Some(false)
        } else {
            None
        },
        image: opts
            .image
            .clone()
            .or_else(|| std::env::var("CIBOX_IMAGE").ok().filter(|s| !s.is_empty())),
        image_ids: m
            .images
            .keys()
            .filter_map(|name| {
                std::env::var(runner::plan::image_variable(name))
                    .ok()
                    .filter(|s| !s.is_empty())
                    .map(|id| (name.clone(), id))
            })
            .collect(),
        parallel: opts.parallel,
        ..RunRequest::default()
    };
    runner::plan::check(&m, &request)?;
    if let Some(w) = &opts.wait {
        let wait = w
            .parse::<Span>()
            .map_err(|e| Error::Usage(format!("--wait: {e}")))?;
        request.wait = Some(wait.0);
    }
    where_to_run(
        &mut request,
        opts.source.clone(),
        opts.reports.clone(),
        opts.scope.clone(),
    )?;
    // `changed run`'s test files, named by data from elsewhere: files of this source.
    for name in names {
        if let Some(file) = m.batches.get(name).and_then(|b| b.changed_file.as_ref()) {
            check_test_file_in(&request.source, file)?;
        }
    }
    let outcome = run_plan(m, request)?;
    Ok(outcome.exit_code())
}

/// A test file `changed run` or a replay was given: a plain file of `source` (not a
/// link, which could lead out of it).
pub(super) fn check_test_file_in(source: &Path, file: &str) -> Result<()> {
    match std::fs::symlink_metadata(source.join(file)) {
        Ok(md) if md.is_file() => Ok(()),
        Ok(md) if md.file_type().is_symlink() => Err(Error::Usage(format!(
            "test file `{}` is a link in {}; name the file itself",
            crate::util::escape(file),
            source.display()
        ))),
        _ => Err(Error::Usage(format!(
            "test file `{}` is not a file in {}",
            crate::util::escape(file),
            source.display()
        ))),
    }
}

/// The source, reports folder and scope of a run, checked: the source a directory
/// (default: the git toplevel, else the current folder), the reports folder created
/// and writable (default `cibox-reports`), the scope not empty.
pub(super) fn where_to_run(
    request: &mut RunRequest,
    source: Option<PathBuf>,
    reports: Option<PathBuf>,
    scope: Option<String>,
) -> Result<()> {
    let source = match source {
        Some(s) => s,
        None => runner::git_toplevel()
            .or_else(|| std::env::current_dir().ok())
            .ok_or_else(|| Error::Usage("cannot tell the source folder; pass --source".into()))?,
    };
    if !source.is_dir() {
        return Err(Error::Usage(format!(
            "--source {}: not a directory",
            source.display()
        )));
    }
    let source = source
        .canonicalize()
        .map_err(|e| Error::Usage(format!("--source {}: {e}", source.display())))?;
    let source_info = runner::source_info(&source);
    if source_info.sha.is_none() {
        report::warn(format!(
            "{} is not a git checkout: the run record will carry no commit",
            source.display()
        ));
    }
    let reports = reports.unwrap_or_else(|| PathBuf::from("cibox-reports"));
    std::fs::create_dir_all(&reports)
        .map_err(|e| Error::Usage(format!("reports dir {}: {e}", reports.display())))?;
    let reports = reports
        .canonicalize()
        .map_err(|e| Error::Usage(format!("reports dir {}: {e}", reports.display())))?;
    let probe = reports.join(".cibox-write-check");
    std::fs::write(&probe, b"")
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| {
            Error::Usage(format!(
                "reports dir {} is not writable: {e}",
                reports.display()
            ))
        })?;
    let scope = scope.unwrap_or_else(runner::default_scope);
    if scope.is_empty() {
        return Err(Error::Usage("--scope is empty".into()));
    }
    request.source = source;
    request.source_info = source_info;
    request.reports = reports;
    request.scope = scope;
    Ok(())
}

/// Plans and executes a run with the reporters of a front end: the terminal, the
/// reports folder, and GitHub when cibox runs in a workflow.
pub(super) fn run_plan(mut m: Manifest, request: RunRequest) -> Result<RunOutcome> {
    // Again for the front ends that come here directly (qualify, reproduce).
    let names = runner::plan::check(&m, &request)?;
    let folders = runner::mounts::RunFolders {
        source: &request.source,
        reports: &request.reports,
        lock_dir: &m.gpu.lock_dir.clone(),
    };
    runner::mounts::check_host(&mut m, &names, &folders)?;
    let host = HostFacts::current(&m);
    let plan = runner::plan(m, request, &host)?;
    // Each image the run uses, verified by its own lock files.
    let mut locksets = indexmap::IndexMap::new();
    for name in plan.images.keys() {
        let locks = &plan.manifest.images[name].locks;
        locksets.insert(name.clone(), Lockset::compute(&plan.manifest.dir, locks)?);
    }
    signals::install();
    let engine = Engine::connect()?;
    let facts = runner::mounts::EngineFacts {
        api: engine.api_version(),
        recursive_read_only: engine.recursive_read_only(),
        root_dir: engine.info()?.root_dir,
    };
    runner::mounts::check_engine(&plan.manifest, &names, &facts)?;
    // Files first: a batch's verdict is printed once its result.json is written.
    let mut reporters = Fanout::new().with(Files::new()).with(Terminal::stdout());
    if crate::github::active() {
        reporters = reporters.with(GitHub::stdout());
    }
    Ok(runner::execute(&plan, &locksets, &engine, &mut reporters)?)
}

/// `cibox cleanup [--scope S]`: the containers of dead runs of this host, of scope S
/// or of every scope.
pub fn cleanup(ctx: &Context, scope: Option<&str>) -> Result<u8> {
    // The project narrows what is touched when there is a manifest; without one, every
    // dead run's cibox container goes.
    let (project, gpu) = match ctx.manifest() {
        Ok(m) => (Some(m.project), m.gpu),
        Err(Error::Manifest(crate::manifest::ManifestError::NotFound { .. })) => {
            (None, GpuConfig::from_env()?)
        }
        Err(e) => return Err(e),
    };
    // Where the runs' locks are: without it no container's run can be judged dead.
    let lock_dir = LockDir::open(&gpu.lock_dir, gpu.allow_network_lock_dir)?;
    let engine = Engine::connect()?;
    let swept = sweep(
        &engine,
        project.as_deref(),
        scope,
        &lock_dir,
        &crate::util::host_name(),
    )?;
    print_sweep_notes(&swept);
    if ctx.json {
        let elsewhere: Vec<_> = swept
            .elsewhere
            .iter()
            .map(|(name, host)| json!({"container": name, "host": host}))
            .collect();
        report::json(&json!({
            "scope": scope,
            "removed": swept.removed.len(),
            "live": swept.live.len(),
            "elsewhere": elsewhere,
        }));
    } else {
        let which = match scope {
            Some(s) => format!("scope {s}"),
            None => "dead runs in every scope".to_string(),
        };
        let mut line = format!("removed {} container(s) of {which}", swept.removed.len());
        if !swept.live.is_empty() {
            line.push_str(&format!(
                "; left {} of runs still alive (they remove their own)",
                swept.live.len()
            ));
        }
        println!("{line}");
    }
    Ok(exit::SUCCESS)
}

/// `cibox image qualify ID`: run the `qualify` layer on the image and write
/// `qualification.json` only when every batch passed.
pub fn qualify(
    ctx: &Context,
    id: &str,
    reports: PathBuf,
    source: Option<PathBuf>,
    scope: Option<String>,
) -> Result<u8> {
    let image = ImageId::parse(id).map_err(Error::refused)?;
    let m = ctx.manifest()?;
    if !m.layers.contains_key("qualify") {
        return Err(Error::Usage(format!(
            "{}: no `qualify` layer; add layers.qualify with the batches that qualify an image",
            m.path.display()
        )));
    }
    let record_path = reports.join("qualification.json");
    // Nothing from an earlier run may pass for this one's qualification.
    match std::fs::remove_file(&record_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::Usage(format!(
                "cannot remove {}: {e}",
                record_path.display()
            )));
        }
    }
    let mut request = RunRequest {
        layer: Some("qualify".into()),
        image: Some(image.to_string()),
        ..RunRequest::default()
    };
    where_to_run(&mut request, source, Some(reports), scope)?;
    let outcome = run_plan(m, request)?;
    if !outcome.passed() {
        report::info(format!(
            "{image} is not qualified: the qualify layer did not pass"
        ));
        return Ok(outcome.exit_code());
    }
    let results: Vec<_> = outcome
        .batches
        .iter()
        .map(|b| {
            let r = &b.record;
            json!({"batch": r.batch, "status": r.status, "tests": r.tests, "duration_s": r.duration_s})
        })
        .collect();
    let first = &outcome.batches[0].record;
    let semantics = Engine::connect()?.info()?.id_semantics;
    let record = json!({
        "schema": 1,
        "image": image,
        "id_semantics": semantics,
        "lockset": first.lockset,
        "source": first.source,
        "manifest_digest": first.manifest_digest,
        "batches": results,
        "cibox_version": env!("CARGO_PKG_VERSION"),
        "qualified_at": crate::units::rfc3339(std::time::SystemTime::now()),
    });
    let text = serde_json::to_string_pretty(&record).expect("serialises") + "\n";
    std::fs::write(&record_path, text)
        .map_err(|e| Error::Infra(format!("{}: {e}", record_path.display())))?;
    println!("qualified {image}: {}", record_path.display());
    Ok(exit::SUCCESS)
}
