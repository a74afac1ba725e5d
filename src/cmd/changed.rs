//! `cibox changed`: the changed test files as a JSON matrix, and `--unregistered`.

use serde_json::json;

use super::Context;
use crate::changed;
use crate::cli::ChangedArgs;
use crate::error::{Error, Result};
use crate::exit;
use crate::report;

pub fn run(ctx: &Context, args: &ChangedArgs) -> Result<u8> {
    let m = ctx.manifest()?;
    let Some(cfg) = &m.changed else {
        return Err(Error::Usage(format!(
            "{}: no `changed` section (patterns, gpus_marker, default_gpus)",
            m.path.display()
        )));
    };
    let dir = &m.dir;
    if args.unregistered {
        return unregistered(&m, &cfg.patterns);
    }
    let Some(base) = &args.base else {
        return Err(Error::Usage("changed: --base REF is required".into()));
    };
    let mut outputs = match args.github_output {
        true => Some(crate::github::Outputs::open().map_err(Error::Usage)?),
        false => None,
    };
    let head = args.head.as_deref().unwrap_or("HEAD");
    let paths = changed::changed_paths(dir, base, head)?;
    let tests: Vec<&changed::Changed> = paths
        .iter()
        .filter(|c| {
            cfg.patterns
                .iter()
                .any(|pat| changed::glob_matches(pat, &c.path))
        })
        .collect();
    let texts = changed::texts(dir, &tests)?;
    let mut include = Vec::new();
    for (c, text) in tests.iter().zip(&texts) {
        let path = &c.path;
        let gpus = match changed::gpus_marker(text, &cfg.gpus_marker) {
            Some(changed::GpuMarker {
                gpus,
                expression: Some(expr),
            }) => {
                report::warn(format!(
                    "{path}: `{} = {expr}` is not one number; taking the largest in it, {gpus}",
                    cfg.gpus_marker
                ));
                gpus
            }
            Some(m) => m.gpus,
            None => {
                report::warn(format!(
                    "{path}: no top-level `{} = <int>`; assuming {} GPUs",
                    cfg.gpus_marker, cfg.default_gpus
                ));
                cfg.default_gpus
            }
        };
        include.push(json!({"test_file": path, "num_gpus": gpus}));
    }
    let has_tests = !include.is_empty();
    // Serialised, never pasted: names with quotes, `$(…)` or newlines stay data.
    let matrix = serde_json::to_string(&json!({ "include": include })).expect("serialises");
    if let Some(out) = &mut outputs {
        out.write(&[
            ("matrix", &matrix),
            ("has_tests", if has_tests { "true" } else { "false" }),
        ])
        .map_err(Error::Infra)?;
    }
    if ctx.json {
        report::json(&json!({"include": include, "has_tests": has_tests}));
    } else {
        println!("{matrix}");
    }
    Ok(exit::SUCCESS)
}

/// Test files that no batch's `tests` globs cover; exit 1 when there are any.
fn unregistered(m: &crate::manifest::Manifest, patterns: &[String]) -> Result<u8> {
    let globs: Vec<&String> = m.batches.values().flat_map(|b| b.tests.iter()).collect();
    if globs.is_empty() {
        return Err(Error::Usage(
            "changed --unregistered: no batch names its test files; add `tests: [globs]` to the batches".into(),
        ));
    }
    let files = changed::tracked(&m.dir)?;
    let orphans: Vec<&String> = files
        .iter()
        .filter(|f| patterns.iter().any(|p| changed::glob_matches(p, f)))
        .filter(|f| !globs.iter().any(|g| changed::glob_matches(g, f)))
        .collect();
    for f in &orphans {
        println!("{f}");
    }
    if orphans.is_empty() {
        report::info("every test file is run by some batch");
        Ok(exit::SUCCESS)
    } else {
        report::warn(format!(
            "{} test file(s) are run by no batch",
            orphans.len()
        ));
        Ok(exit::TESTS_FAILED)
    }
}
