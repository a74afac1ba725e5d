//! `cibox workflow render [--check]` and `cibox workflow lint`.

use super::error::CommandError;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::context::Context;
use crate::cli::LintFormat;
use crate::console;
use crate::error::Result;
use crate::exit;
use crate::manifest;
use crate::workflow::{lint, render};

pub fn render(ctx: &Context, check: bool) -> Result<u8> {
    let m = ctx.manifest()?;
    let dir = m.resolve(&m.workflows.dir.to_string_lossy());
    if !dir.is_dir() {
        return Err(CommandError::usage(format!(
            "workflows dir {} does not exist (workflows.dir in {})",
            dir.display(),
            m.path.display()
        )));
    }
    let templates = render::templates(&dir).map_err(CommandError::usage)?;
    if templates.is_empty() {
        return Err(CommandError::usage(format!(
            "no *.yml.j2 template in {}",
            dir.display()
        )));
    }
    let context = render::context(&m);
    // Render everything first: a bad template writes nothing at all.
    let rendered: Vec<render::Rendered> = templates
        .iter()
        .map(|t| render::render(t, &context))
        .collect::<std::result::Result<_, _>>()
        .map_err(CommandError::usage)?;
    let mut stale = 0;
    let mut outputs = Vec::new();
    for r in &rendered {
        let current = render::current_output(&r.output);
        let state = if current.as_deref() == Some(r.text.as_str()) {
            "unchanged"
        } else if check {
            stale += 1;
            let diff = render::diff(
                r.output.strip_prefix(&m.dir).unwrap_or(&r.output),
                current.as_deref().unwrap_or(""),
                &r.text,
            );
            if ctx.json {
                outputs.push(json!({"template": r.template, "output": r.output,
                    "state": if current.is_some() { "stale" } else { "missing" }, "diff": diff}));
                continue;
            }
            // The template and the file beside it are a pull request's.
            print!("{}", crate::util::escape_lines(&diff));
            console::info(format!(
                "{} {}",
                r.output.display(),
                if current.is_some() {
                    "differs from its template"
                } else {
                    "is missing"
                }
            ));
            if current.is_some() {
                "stale"
            } else {
                "missing"
            }
        } else {
            std::fs::write(&r.output, &r.text)
                .map_err(|e| CommandError::infra(format!("writing {}: {e}", r.output.display())))?;
            console::info(format!(
                "wrote {} from {}",
                r.output.display(),
                r.template.display()
            ));
            "written"
        };
        outputs.push(json!({"template": r.template, "output": r.output, "state": state}));
    }
    if ctx.json {
        console::json(&json!({"check": check, "stale": stale, "outputs": outputs}));
    }
    if check && stale > 0 {
        console::info(format!(
            "{stale} workflow(s) out of date: run `cibox workflow render`"
        ));
        return Ok(exit::TESTS_FAILED);
    }
    Ok(exit::SUCCESS)
}

/// The workflow files to lint: the paths given, else the manifest's `workflows.dir`, else
/// `.github/workflows` of the repository around the current folder.
/// Each with whether it may be a symbolic link (named, not found in a folder).
fn lint_targets(ctx: &Context, paths: &[PathBuf]) -> Result<Vec<(PathBuf, bool)>> {
    let yaml_files = |dir: &Path| -> Result<Vec<(PathBuf, bool)>> {
        let entries = std::fs::read_dir(dir)
            .map_err(|e| CommandError::usage(format!("workflows folder {}: {e}", dir.display())))?;
        let mut files: Vec<(PathBuf, bool)> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
            .map(|p| (p, false))
            .collect();
        files.sort();
        Ok(files)
    };
    if !paths.is_empty() {
        let mut files = Vec::new();
        for p in paths {
            match std::fs::metadata(p) {
                Ok(md) if md.is_dir() => files.extend(yaml_files(p)?),
                Ok(_) => files.push((p.clone(), true)),
                Err(e) => {
                    return Err(CommandError::usage(format!(
                        "{}: {e}: give workflow files or folders",
                        p.display()
                    )));
                }
            }
        }
        return Ok(files);
    }
    let cwd = std::env::current_dir()
        .map_err(|e| CommandError::usage(format!("cannot read the current folder: {e}")))?;
    let manifest_found = ctx.manifest_path.is_some() || manifest::find(&cwd).is_ok();
    let dir = if manifest_found {
        let m = ctx.manifest()?;
        m.resolve(&m.workflows.dir.to_string_lossy())
    } else {
        // A repository that has not adopted cibox: its own workflows.
        let root = cwd
            .ancestors()
            .find(|d| d.join(".git").exists())
            .unwrap_or(&cwd);
        root.join(".github/workflows")
    };
    if !dir.is_dir() {
        return Err(CommandError::usage(format!(
            "no workflows folder at {}: give workflow files or folders to lint",
            dir.display()
        )));
    }
    yaml_files(&dir)
}

/// The repository the current folder is in (its `.git`), for SARIF's relative URIs.
fn repository_root() -> Option<PathBuf> {
    let cwd = std::fs::canonicalize(std::env::current_dir().ok()?).ok()?;
    cwd.ancestors()
        .find(|d| d.join(".git").exists())
        .map(Path::to_path_buf)
}

pub fn lint(ctx: &Context, paths: &[PathBuf], format: Option<LintFormat>) -> Result<u8> {
    let format = match (format, ctx.json) {
        (Some(LintFormat::Text | LintFormat::Sarif), true) => {
            return Err(CommandError::usage(
                "`--json` and `--format`: give one of them",
            ));
        }
        (Some(f), _) => f,
        (None, true) => LintFormat::Json,
        (None, false) => LintFormat::Text,
    };
    let files = lint_targets(ctx, paths)?;
    let mut findings: Vec<lint::Finding> = Vec::new();
    for (f, follow) in &files {
        findings.extend(lint::lint_file(f, *follow));
    }
    let count = |pred: &dyn Fn(&lint::Finding) -> bool| findings.iter().filter(|f| pred(f)).count();
    let unparsable = count(&|f| f.rule == lint::Rule::Unparsable);
    let errors = count(&|f| f.severity == lint::Severity::Error) - unparsable;
    let warnings = count(&|f| f.severity == lint::Severity::Warning);
    if format == LintFormat::Sarif {
        let root = repository_root();
        console::json(&lint::sarif::log(&findings, root.as_deref()));
    } else if format == LintFormat::Json {
        console::json(&json!({
            "files": files.len(),
            "errors": errors,
            "warnings": warnings,
            "unparsable": unparsable,
            "findings": findings,
        }));
    } else {
        // A finding quotes the workflow (a job's or step's name): one line, escaped.
        for f in &findings {
            println!("{}", crate::util::escape(&f.to_string()));
        }
        let unreadable = if unparsable > 0 {
            format!(", {unparsable} not readable as a workflow")
        } else {
            String::new()
        };
        console::info(format!(
            "{} workflow(s), {errors} error(s), {warnings} warning(s){unreadable}",
            files.len()
        ));
    }
    Ok(if unparsable > 0 {
        exit::USAGE
    } else if errors > 0 {
        exit::TESTS_FAILED
    } else {
        exit::SUCCESS
    })
}
