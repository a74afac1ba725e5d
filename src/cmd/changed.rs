//! `cibox changed`: the changed test files as a JSON matrix, and `--unregistered`.

use super::context::Context;
use crate::changed;
use crate::changed::matrix::{self, ChangedError};
use crate::cli::{ChangedArgs, ChangedCommand, ChangedRunArgs};
use crate::console;
use crate::error::Result;
use crate::exit;
use crate::manifest::Manifest;

pub fn run(ctx: &Context, args: &ChangedArgs) -> Result<u8> {
    if let Some(ChangedCommand::Run(a)) = &args.command {
        return run_files(ctx, a);
    }
    let m = ctx.manifest()?;
    let Some(cfg) = &m.changed else {
        return Err(ChangedError::NoChangedSection {
            manifest: m.path.clone(),
        }
        .into());
    };
    if args.unregistered {
        return unregistered(&m, cfg, ctx.json);
    }
    let Some(base) = &args.base else {
        return Err(ChangedError::NoBase.into());
    };
    let mut outputs = match args.github_output {
        true => Some(crate::github::Outputs::open()?),
        false => None,
    };
    let head = args.head.as_deref().unwrap_or("HEAD");
    let paths = changed::changed_paths(&m.dir, base, head, cfg.renames)?;
    let found = changed::groups(&m, cfg, &paths, head, console::warn)?;
    let selected = changed::selected_batches(&m, &found);
    if let Some(out) = &mut outputs {
        let mut pairs: Vec<(String, String)> =
            found.iter().flat_map(|(g, f)| f.outputs(*g)).collect();
        if let Some(s) = &selected {
            pairs.push((
                changed::SELECTED_BATCHES.into(),
                serde_json::json!(s).to_string(),
            ));
        }
        let pairs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        out.write(&pairs)?;
    }
    if ctx.json {
        let mut v = serde_json::Map::new();
        let mut groups = serde_json::Map::new();
        for (g, f) in &found {
            match g {
                None => {
                    if let serde_json::Value::Object(o) = f.json() {
                        v.extend(o);
                    }
                }
                Some(name) => {
                    groups.insert(name.to_string(), f.json());
                }
            }
        }
        if !cfg.groups.is_empty() {
            v.insert("groups".into(), serde_json::Value::Object(groups));
        }
        if let Some(s) = &selected {
            v.insert(changed::SELECTED_BATCHES.into(), serde_json::json!(s));
        }
        console::json(&serde_json::Value::Object(v));
    } else {
        for (g, f) in &found {
            match g {
                None => println!("{}", crate::util::escape_json(&f.text())),
                Some(name) => println!("{name}: {}", crate::util::escape_json(&f.text())),
            }
        }
    }
    Ok(exit::SUCCESS)
}

/// Test files that no batch's `tests` globs cover; exit 1 when there are any.
fn unregistered(
    m: &crate::manifest::Manifest,
    cfg: &crate::manifest::ChangedConfig,
    json: bool,
) -> Result<u8> {
    let globs: Vec<String> = m
        .batches
        .values()
        .flat_map(|b| b.tests.iter().cloned())
        .collect();
    if globs.is_empty() {
        return Err(ChangedError::NoTestGlobs.into());
    }
    let run_by_some = crate::manifest::Selector::globs(&globs);
    let files = changed::tracked(&m.dir)?;
    let orphans: Vec<&String> = files
        .iter()
        .filter(|f| cfg.takes_test_file(f))
        .filter(|f| !run_by_some.matches(f))
        .collect();
    if json {
        console::json(&serde_json::json!({ "unregistered": orphans }));
    } else {
        // File names are the checkout's: one line each, escaped.
        for f in &orphans {
            println!("{}", crate::util::escape(f));
        }
    }
    if orphans.is_empty() {
        console::info("every test file is run by some batch");
        Ok(exit::SUCCESS)
    } else {
        console::warn(format!(
            "{} test file(s) are run by no batch",
            orphans.len()
        ));
        Ok(exit::TESTS_FAILED)
    }
}

/// `cibox changed run`: each row of the matrix as a batch: a test list entry's row
/// (`batch`) runs that entry's batch of the manifest, with its arguments, image and
/// container; any other test file runs in a batch made from `changed.run`, with the
/// row's GPU count and `CIBOX_TEST_FILE` naming it.
fn run_files(ctx: &Context, args: &ChangedRunArgs) -> Result<u8> {
    let mut m: Manifest = ctx.manifest()?;
    let Some(cfg) = m.changed.clone() else {
        return Err(ChangedError::NothingToRun {
            manifest: m.path.clone(),
        }
        .into());
    };
    let (text, from) = matrix::read_matrix(args)?;
    let files = matrix::rows(&m, &cfg, &text, from)?;
    if files.is_empty() {
        console::info("no changed test file to run");
        if ctx.json {
            console::json(&serde_json::json!({
                "run": null, "status": "passed", "exit_code": 0, "stopped_by": null,
                "reports": null, "summary": null, "junit": null, "batches": [],
            }));
        }
        return Ok(exit::SUCCESS);
    }
    let names = matrix::batches(&mut m, &cfg, &files)?;
    super::run::run_manifest(ctx, m, &names, None, &args.options)
}
