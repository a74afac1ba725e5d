//! `cibox batch …`.

use serde_json::json;

use std::path::PathBuf;

use super::{Context, runtime};
use crate::batch;
use crate::batch::run_lock::{RunInfo, RunLock};
use crate::cli::RunOptions;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::exit;
use crate::gpu::lease::{LeaseDir, host_name};
use crate::image_id::ImageId;
use crate::lockset::Lockset;
use crate::manifest::GpuConfig;
use crate::report::{self, Table};
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

/// Which batches to run: the names given, or else the layer's. With both, the names
/// run as part of the layer (its fast mode applies) and must belong to it: a workflow
/// matrix runs `batch run "$BATCH" --layer L`, one batch per job.
fn select(
    m: &crate::manifest::Manifest,
    names: &[String],
    layer: Option<&str>,
) -> Result<(Vec<String>, bool)> {
    let known: Vec<String> = m.batches.keys().cloned().collect();
    let layer = match layer {
        Some(l) => Some((
            l,
            m.layers.get(l).ok_or_else(|| {
                let layers: Vec<String> = m.layers.keys().cloned().collect();
                let hint = crate::manifest::did_you_mean(l, &layers)
                    .map(|s| format!("did you mean `{s}`?"))
                    .unwrap_or_else(|| format!("layers: {}", layers.join(", ")));
                Error::Usage(format!("unknown layer `{l}`; {hint}"))
            })?,
        )),
        None => None,
    };
    let mut chosen: Vec<String> = Vec::new();
    for n in names {
        if !m.batches.contains_key(n) {
            let hint = crate::manifest::did_you_mean(n, &known)
                .map(|s| format!("did you mean `{s}`?"))
                .unwrap_or_else(|| format!("batches: {}", known.join(", ")));
            return Err(Error::Usage(format!("unknown batch `{n}`; {hint}")));
        }
        if let Some((l, layer)) = layer
            && !layer.batches.contains(n)
        {
            return Err(Error::Usage(format!(
                "batch `{n}` is not in layer `{l}` (its batches: {})",
                layer.batches.join(", ")
            )));
        }
        if !chosen.contains(n) {
            chosen.push(n.clone());
        }
    }
    if chosen.is_empty()
        && let Some((_, layer)) = layer
    {
        chosen = layer.batches.clone();
    }
    if chosen.is_empty() {
        return Err(Error::Usage(
            "no batch to run: name batches or a --layer".into(),
        ));
    }
    Ok((chosen, layer.is_some_and(|(_, l)| l.fast)))
}

/// `cibox batch run` and `cibox layer run`.
pub fn run(ctx: &Context, names: &[String], layer: Option<&str>, opts: &RunOptions) -> Result<u8> {
    let m = ctx.manifest()?;
    let (names, layer_fast) = select(&m, names, layer)?;
    let fast = if opts.fast {
        true
    } else if opts.no_fast {
        false
    } else {
        layer_fast
    };
    let wait = match &opts.wait {
        Some(w) => {
            w.parse::<Span>()
                .map_err(|e| Error::Usage(format!("--wait: {e}")))?
                .0
        }
        None => m.gpu.wait.0,
    };
    let raw_id = opts
        .image
        .clone()
        .or_else(|| std::env::var("CIBOX_IMAGE").ok().filter(|s| !s.is_empty()))
        .or_else(|| m.image.id.clone())
        .ok_or_else(|| {
            Error::Usage(
                "no image ID: pass --image, set CIBOX_IMAGE, or set image.id in cibox.yaml".into(),
            )
        })?;
    let image = ImageId::parse(raw_id.trim()).map_err(Error::refused)?;
    let source = match &opts.source {
        Some(s) => s.clone(),
        None => batch::git_toplevel()
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
    let source_info = batch::source_info(&source);
    if source_info.sha.is_none() {
        report::warn(format!(
            "{} is not a git checkout: the run record will carry no commit",
            source.display()
        ));
    }
    let reports = opts
        .reports
        .clone()
        .unwrap_or_else(|| PathBuf::from("cibox-reports"));
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
    let scope = opts.scope.clone().unwrap_or_else(batch::default_scope);
    if scope.is_empty() {
        return Err(Error::Usage("--scope is empty".into()));
    }
    let lockset = Lockset::compute(&m.dir, &m.image.locks)?;
    let needs_gpus = names.iter().any(|n| m.batches[n].gpus > 0);
    signals::install();
    let rt = runtime()?;
    let engine = rt.block_on(Engine::connect())?;
    rt.block_on(crate::cmd::image::verify_image(&engine, &image, &lockset))?;
    // Held for the whole run, so that a sweep by another job of this scope leaves our
    // containers alone; taken before our first container exists.
    let lock_dir = LeaseDir::open(&m.gpu.lock_dir, m.gpu.allow_network_lock_dir)?;
    let run_id = batch::new_run_id();
    let run_info = RunInfo {
        project: m.project.clone(),
        scope: scope.clone(),
    };
    let _run_lock = RunLock::hold(&lock_dir, &run_id, &run_info).map_err(|e| {
        Error::Infra(format!(
            "lock dir {}: cannot take this run's lock: {e}",
            lock_dir.path().display()
        ))
    })?;
    let host = host_name();
    let swept = rt.block_on(batch::sweep(
        &engine,
        Some(&m.project),
        &scope,
        &lock_dir,
        &host,
    ))?;
    if swept.removed > 0 {
        report::info(format!(
            "removed {} leftover container(s) of scope {scope}",
            swept.removed
        ));
    }
    let gpus = if needs_gpus {
        Some(batch::prepare_gpus(&m, lock_dir)?)
    } else {
        None
    };
    let setup = batch::RunSetup {
        manifest: m,
        names,
        fast,
        image,
        lockset: lockset.digest,
        source,
        source_info,
        reports,
        scope,
        run_id,
        host,
        wait,
        parallel: opts.parallel,
    };
    batch::run(&setup, &rt, &engine, gpus.as_ref())
}

/// `cibox cleanup --scope S`.
pub fn cleanup(ctx: &Context, scope: Option<&str>) -> Result<u8> {
    let scope = scope
        .map(str::to_string)
        .unwrap_or_else(batch::default_scope);
    // The project narrows what is touched when there is a manifest; without one, every
    // cibox container of the scope goes.
    let (project, gpu) = match ctx.manifest() {
        Ok(m) => (Some(m.project), m.gpu),
        Err(Error::Manifest(crate::manifest::ManifestError::NotFound { .. })) => {
            (None, GpuConfig::from_env()?)
        }
        Err(e) => return Err(e),
    };
    // Where the runs' locks are: without it no container's run can be judged dead.
    let lock_dir = LeaseDir::open(&gpu.lock_dir, gpu.allow_network_lock_dir)?;
    let rt = runtime()?;
    let engine = rt.block_on(Engine::connect())?;
    let swept = rt.block_on(batch::sweep(
        &engine,
        project.as_deref(),
        &scope,
        &lock_dir,
        &host_name(),
    ))?;
    if ctx.json {
        let elsewhere: Vec<_> = swept
            .elsewhere
            .iter()
            .map(|(name, host)| json!({"container": name, "host": host}))
            .collect();
        report::json(&json!({
            "scope": scope,
            "removed": swept.removed,
            "live": swept.live,
            "elsewhere": elsewhere,
        }));
    } else {
        let mut line = format!("removed {} container(s) of scope {scope}", swept.removed);
        if swept.live > 0 {
            line.push_str(&format!(
                "; left {} of runs still alive (they remove their own)",
                swept.live
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
    let Some(layer) = m.layers.get("qualify") else {
        return Err(Error::Usage(format!(
            "{}: no `qualify` layer; add layers.qualify with the batches that qualify an image",
            m.path.display()
        )));
    };
    let batches = layer.batches.clone();
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
    let opts = RunOptions {
        fast: false,
        no_fast: false,
        image: Some(image.to_string()),
        source,
        reports: Some(reports.clone()),
        scope,
        wait: None,
        parallel: false,
    };
    let code = run(ctx, &[], Some("qualify"), &opts)?;
    if code != exit::SUCCESS {
        report::info(format!(
            "{image} is not qualified: the qualify layer did not pass"
        ));
        return Ok(code);
    }
    let mut results = Vec::new();
    for b in &batches {
        let r = batch::record::RunRecord::read(&reports.join(b).join("result.json"))
            .map_err(Error::Infra)?;
        results.push(json!({"batch": r.batch, "status": r.status, "tests": r.tests, "duration_s": r.duration_s}));
    }
    let first = batch::record::RunRecord::read(&reports.join(&batches[0]).join("result.json"))
        .map_err(Error::Infra)?;
    let semantics = runtime()?
        .block_on(async { Engine::connect().await?.info().await })?
        .id_semantics;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Manifest;

    fn manifest() -> Manifest {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\nbatches:\n  a: {gpus: 0, timeout: 1m, run: [\"true\"]}\n  b: {gpus: 1, timeout: 1m, run: [\"true\"]}\n  c: {gpus: 2, timeout: 1m, run: [\"true\"]}\nlayers:\n  \"2\": {batches: [a, b], fast: true}\n";
        Manifest::parse(text, std::path::Path::new("cibox.yaml")).unwrap()
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_with_a_layer_run_only_those_names_in_its_mode() {
        let m = manifest();
        assert_eq!(
            select(&m, &names(&["b"]), Some("2")).unwrap(),
            (names(&["b"]), true)
        );
        assert_eq!(
            select(&m, &[], Some("2")).unwrap(),
            (names(&["a", "b"]), true)
        );
        assert_eq!(
            select(&m, &names(&["c", "a", "c"]), None).unwrap(),
            (names(&["c", "a"]), false)
        );
        let err = select(&m, &names(&["c"]), Some("2"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("batch `c` is not in layer `2` (its batches: a, b)"),
            "{err}"
        );
        assert!(select(&m, &[], None).is_err());
    }
}
