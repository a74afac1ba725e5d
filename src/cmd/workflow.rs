//! `cibox workflow render [--check]` and `cibox workflow lint`.

use super::error::CommandError;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::context::Context;
use crate::cli::LintFormat;
use crate::console;
use crate::error::{ErrorKind, Result};
use crate::exit::{self, Failure};
use crate::manifest;
use crate::nofollow::Folder;
use crate::workflow::{lint, render};

/// What `workflow render` and `workflow lint` refuse or cannot do.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowCommandError {
    #[error(
        "workflows dir {} does not exist (workflows.dir in {}); `cibox init` writes a start",
        .dir.display(),
        .manifest.display()
    )]
    NoWorkflowsDir { dir: PathBuf, manifest: PathBuf },
    #[error("no *.yml.j2 template in {}", .dir.display())]
    NoTemplates { dir: PathBuf },
    /// A rendered workflow could not be written.
    #[error("writing {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A folder of workflows to lint cannot be read.
    #[error("workflows folder {}: {source}", .dir.display())]
    Folder {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A path given to lint is neither a file nor a folder one can read.
    #[error("{}: {source}: give workflow files or folders", .path.display())]
    NoSuchTarget {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A rendered workflow's file in the checkout cannot be read as one (a link, a
    /// folder).
    #[error("{}: {source}", .path.display())]
    Output {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no workflows folder at {}: give workflow files or folders to lint", .dir.display())]
    NoWorkflowsFolder { dir: PathBuf },
    #[error("`--json` and `--format`: give one of them")]
    JsonAndFormat,
}

impl ErrorKind for WorkflowCommandError {
    fn failure(&self) -> Failure {
        match self {
            WorkflowCommandError::Write { .. } => Failure::Infra,
            WorkflowCommandError::NoWorkflowsDir { .. }
            | WorkflowCommandError::NoTemplates { .. }
            | WorkflowCommandError::Folder { .. }
            | WorkflowCommandError::NoSuchTarget { .. }
            | WorkflowCommandError::Output { .. }
            | WorkflowCommandError::NoWorkflowsFolder { .. }
            | WorkflowCommandError::JsonAndFormat => Failure::Usage,
        }
    }
}

/// The file name of a rendered workflow (its template's, less `.j2`).
fn output_name(output: &std::path::Path) -> &str {
    output
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
}

pub fn render(ctx: &Context, check: bool) -> Result<u8> {
    let m = ctx.manifest()?;
    let dir = m.resolve(&m.workflows.dir.to_string_lossy());
    if !dir.is_dir() {
        return Err(WorkflowCommandError::NoWorkflowsDir {
            dir,
            manifest: m.path.clone(),
        }
        .into());
    }
    // Held open from the manifest's folder down, no name a link: a pull request that
    // commits a link where a workflow is rendered (or a folder on the way) gets it
    // neither read for `--check` nor written through.
    let folder = Folder::open(&m.dir)
        .and_then(|f| f.open_path(&m.workflows.dir))
        .map_err(|source| WorkflowCommandError::Folder {
            dir: dir.clone(),
            source: crate::nofollow::said_of_links(source),
        })?;
    let templates = render::templates(&dir)?;
    if templates.is_empty() {
        return Err(WorkflowCommandError::NoTemplates { dir }.into());
    }
    let context = render::context(&m);
    // Render everything first: a bad template writes nothing at all.
    let rendered: Vec<render::Rendered> = templates
        .iter()
        .map(|t| render::render(t, &context))
        .collect::<std::result::Result<_, _>>()?;
    let mut stale = 0;
    let mut outputs = Vec::new();
    for r in &rendered {
        let name = output_name(&r.output);
        for w in crate::workflow::models::label_warnings(&m, name, &r.text) {
            console::warn(w);
        }
        // The banner comes on top of what a render may write.
        let current = match folder.read_text(name, render::MAX_OUTPUT_BYTES as u64 + 4096) {
            Ok(current) => current,
            // More than a render may write: not worth reading, and said in the diff.
            Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => Some(format!(
                "(larger than {} MiB, the most a render writes: not shown)
",
                render::MAX_OUTPUT_BYTES >> 20
            )),
            Err(source) => {
                return Err(WorkflowCommandError::Output {
                    path: r.output.clone(),
                    source: crate::nofollow::said_of_links(source),
                }
                .into());
            }
        };
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
            folder
                .write_replacing(name, r.text.as_bytes())
                .map_err(|source| WorkflowCommandError::Write {
                    path: r.output.clone(),
                    source,
                })?;
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
        let entries = std::fs::read_dir(dir).map_err(|source| WorkflowCommandError::Folder {
            dir: dir.to_path_buf(),
            source,
        })?;
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
                Err(source) => {
                    return Err(WorkflowCommandError::NoSuchTarget {
                        path: p.clone(),
                        source,
                    }
                    .into());
                }
            }
        }
        return Ok(files);
    }
    let cwd = std::env::current_dir().map_err(CommandError::CurrentFolder)?;
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
        return Err(WorkflowCommandError::NoWorkflowsFolder { dir }.into());
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
            return Err(WorkflowCommandError::JsonAndFormat.into());
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
