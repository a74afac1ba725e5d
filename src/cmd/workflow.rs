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
use crate::workflow::context::{self, Selection};
use crate::workflow::{confined, lint, render};

/// What `workflow render` and `workflow lint` refuse or cannot do.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowCommandError {
    #[error(
        "workflows dir {} does not exist ({key} in {}); `cibox init` writes a start",
        .dir.display(),
        .manifest.display()
    )]
    NoWorkflowsDir {
        dir: PathBuf,
        manifest: PathBuf,
        key: &'static str,
    },
    #[error("--print {wanted}: no template renders it; the outputs are {}", .outputs.join(", "))]
    NoSuchOutput {
        wanted: String,
        outputs: Vec<String>,
    },
    #[error(
        "--print {wanted}: more than one output has that name, of different CIs: {}; {how}",
        .candidates.join(" and ")
    )]
    AmbiguousOutput {
        wanted: String,
        candidates: Vec<String>,
        how: &'static str,
    },
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
            | WorkflowCommandError::NoSuchOutput { .. }
            | WorkflowCommandError::AmbiguousOutput { .. }
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

/// One folder of templates: GitHub's workflows or Buildkite's pipelines, held open.
struct TemplateFolder {
    /// As the manifest names it, from its folder.
    rel: PathBuf,
    dir: PathBuf,
    folder: Folder,
    flavor: render::Flavor,
    templates: Vec<PathBuf>,
}

/// The template folders of the manifest: `workflows.dir` (GitHub) and, when set,
/// `workflows.buildkite`. A missing GitHub folder is an error only where there is no
/// Buildkite one.
fn template_folders(m: &manifest::Manifest) -> Result<Vec<TemplateFolder>> {
    let mut wanted = vec![(m.workflows.dir.clone(), render::Flavor::GitHub)];
    if let Some(bk) = &m.workflows.buildkite {
        wanted.push((bk.clone(), render::Flavor::Buildkite));
    }
    let mut out = Vec::new();
    for (rel, flavor) in wanted {
        let dir = m.resolve(&rel.to_string_lossy());
        if !dir.is_dir() {
            if flavor == render::Flavor::GitHub && m.workflows.buildkite.is_some() {
                continue;
            }
            return Err(WorkflowCommandError::NoWorkflowsDir {
                dir,
                manifest: m.path.clone(),
                key: match flavor {
                    render::Flavor::GitHub => "workflows.dir",
                    render::Flavor::Buildkite => "workflows.buildkite",
                },
            }
            .into());
        }
        // Held open from the manifest's folder down, no name a link: a pull request that
        // commits a link where a workflow is rendered (or a folder on the way) gets it
        // neither read for `--check` nor written through.
        let folder = Folder::open(&m.dir)
            .and_then(|f| f.open_path(&rel))
            .map_err(|source| WorkflowCommandError::Folder {
                dir: dir.clone(),
                source: crate::nofollow::said_of_links(source),
            })?;
        let templates = render::templates(&dir)?;
        out.push(TemplateFolder {
            rel,
            dir,
            folder,
            flavor,
            templates,
        });
    }
    if out.iter().all(|f| f.templates.is_empty()) {
        let dirs: Vec<String> = out.iter().map(|f| f.dir.display().to_string()).collect();
        return Err(WorkflowCommandError::NoTemplates {
            dir: PathBuf::from(dirs.join(" or ")),
        }
        .into());
    }
    Ok(out)
}

/// What a rendered output warns about: runner labels that miss a batch's GPU model
/// (GitHub), a GPU step a fork's build reaches unblocked (Buildkite).
fn render_warnings(m: &manifest::Manifest, r: &render::Rendered) -> Vec<String> {
    let name = output_name(&r.output);
    match r.flavor {
        render::Flavor::GitHub => crate::workflow::models::label_warnings(m, name, &r.text),
        render::Flavor::Buildkite => {
            let shown = r.output.strip_prefix(&m.dir).unwrap_or(&r.output);
            crate::workflow::buildkite::lint::warnings(m, &shown.to_string_lossy(), &r.text)
        }
    }
}

/// `workflow render --print OUTPUT`: that one output on stdout, nothing written. OUTPUT
/// names one output of one CI: a file name two templates render (one GitHub's, one
/// Buildkite's) is refused, and so is a path both render.
fn print_one(
    m: &manifest::Manifest,
    folders: &[TemplateFolder],
    wanted: &str,
    selection: Option<&Selection>,
) -> Result<u8> {
    let mut names = Vec::new();
    // (folder, template, its output's path from the manifest's folder)
    let mut by_name = Vec::new();
    let mut by_path = Vec::new();
    for f in folders {
        for t in &f.templates {
            let out_name = output_name(t).trim_end_matches(".j2").to_string();
            let rel = f.rel.join(&out_name);
            if Path::new(wanted) == rel {
                by_path.push((f, t, rel.clone()));
            } else if wanted == out_name {
                by_name.push((f, t, rel.clone()));
            }
            names.push(rel.display().to_string());
        }
    }
    let found = if by_path.is_empty() { by_name } else { by_path };
    let shown = || crate::util::escape(wanted).into_owned();
    match found.as_slice() {
        [] => Err(WorkflowCommandError::NoSuchOutput {
            wanted: shown(),
            outputs: names,
        }
        .into()),
        [(f, t, _)] => {
            let r = confined::render(&m.path, t, f.flavor, selection, m.collected.as_ref())?;
            for w in render_warnings(m, &r) {
                console::warn(w);
            }
            print_rendered(&r.text)?;
            Ok(exit::SUCCESS)
        }
        many => {
            let candidates: Vec<String> = many
                .iter()
                .map(|(f, _, rel)| format!("{} ({})", rel.display(), ci_name(f.flavor)))
                .collect();
            let one_path = many.iter().all(|(_, _, rel)| *rel == many[0].2);
            Err(WorkflowCommandError::AmbiguousOutput {
                wanted: shown(),
                candidates,
                how: if one_path {
                    "workflows.dir and workflows.buildkite name one folder: give each CI a folder of its own"
                } else {
                    "give the output's path from the manifest's folder"
                },
            }
            .into())
        }
    }
}

/// A CI as a message names it.
fn ci_name(flavor: render::Flavor) -> &'static str {
    match flavor {
        render::Flavor::GitHub => "GitHub",
        render::Flavor::Buildkite => "Buildkite",
    }
}

/// `cibox __render-template --flavor F TEMPLATE`: one template of the manifest rendered
/// and printed, in the bounded process `workflow render` runs it in.
pub fn render_template(
    ctx: &Context,
    flavor: &str,
    template: &Path,
    selection: Option<&Selection>,
    collected_stdin: bool,
) -> Result<u8> {
    let mut m = ctx.manifest()?;
    if collected_stdin {
        m = confined::with_collected_stdin(m)?;
    }
    let flavor = match flavor {
        "buildkite" => render::Flavor::Buildkite,
        _ => render::Flavor::GitHub,
    };
    let r = render::render(template, &context::context_with(&m, selection), flavor)?;
    print_rendered(&r.text)?;
    Ok(exit::SUCCESS)
}

/// A rendered workflow on standard output, flushed.
fn print_rendered(text: &str) -> std::result::Result<(), WorkflowCommandError> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|source| WorkflowCommandError::Write {
            path: PathBuf::from("(standard output)"),
            source,
        })
}

pub fn render(
    ctx: &Context,
    check: bool,
    print: Option<&str>,
    diff: Option<(String, String)>,
) -> Result<u8> {
    let m = ctx.manifest_to_render(print.is_some())?;
    let folders = template_folders(&m)?;
    if let Some(wanted) = print {
        // The selection `changed` makes (a manifest without `changed:` changes no
        // group: every batch is selected, none names one).
        let selection = match diff {
            Some((base, head)) => Some(Selection {
                groups: match &m.changed {
                    Some(cfg) => {
                        crate::changed::changed_groups(&m, cfg, &base, &head, console::warn)?
                    }
                    None => Vec::new(),
                },
                base,
                head,
            }),
            None => None,
        };
        return print_one(&m, &folders, wanted, selection.as_ref());
    }
    // Render everything first: a bad template writes nothing at all. Each in a process
    // of its own, bounded: a template is a pull request's.
    let mut rendered: Vec<(usize, render::Rendered)> = Vec::new();
    for (i, f) in folders.iter().enumerate() {
        for t in &f.templates {
            rendered.push((i, confined::render(&m.path, t, f.flavor, None, None)?));
        }
    }
    let mut stale = 0;
    let mut outputs = Vec::new();
    for (i, r) in &rendered {
        let folder = &folders[*i].folder;
        let name = output_name(&r.output);
        for w in render_warnings(&m, r) {
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
                outputs.push(
                    json!({"template": r.template, "output": r.output, "ci": r.flavor.as_str(),
                    "state": if current.is_some() { "stale" } else { "missing" }, "diff": diff}),
                );
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
        outputs.push(json!({"template": r.template, "output": r.output, "ci": r.flavor.as_str(), "state": state}));
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
    let report = lint::report::Report {
        files: files.len(),
        findings,
    };
    if format == LintFormat::Sarif {
        let root = repository_root();
        console::json(&lint::sarif::log(&report.findings, root.as_deref()));
    } else if format == LintFormat::Json {
        console::json(&report.to_json());
    } else {
        for line in report.lines() {
            println!("{line}");
        }
        console::info(report.summary());
    }
    Ok(report.exit_code())
}
