//! `cibox workflow render [--check]` and `cibox workflow lint`.

use serde_json::json;

use super::Context;
use crate::error::{Error, Result};
use crate::exit;
use crate::report;
use crate::workflow::{lint, render};

pub fn render(ctx: &Context, check: bool) -> Result<u8> {
    let m = ctx.manifest()?;
    let dir = m.resolve(&m.workflows.dir.to_string_lossy());
    if !dir.is_dir() {
        return Err(Error::Usage(format!(
            "workflows dir {} does not exist (workflows.dir in {})",
            dir.display(),
            m.path.display()
        )));
    }
    let templates = render::templates(&dir).map_err(Error::Usage)?;
    if templates.is_empty() {
        return Err(Error::Usage(format!(
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
        .map_err(Error::Usage)?;
    let mut stale = 0;
    for r in &rendered {
        let current = std::fs::read_to_string(&r.output).ok();
        if current.as_deref() == Some(r.text.as_str()) {
            continue;
        }
        if check {
            stale += 1;
            print!(
                "{}",
                render::diff(&r.output, current.as_deref().unwrap_or(""), &r.text)
            );
            report::info(format!(
                "{} {}",
                r.output.display(),
                if current.is_some() {
                    "differs from its template"
                } else {
                    "is missing"
                }
            ));
        } else {
            std::fs::write(&r.output, &r.text)
                .map_err(|e| Error::Infra(format!("writing {}: {e}", r.output.display())))?;
            report::info(format!(
                "wrote {} from {}",
                r.output.display(),
                r.template.display()
            ));
        }
    }
    if check && stale > 0 {
        report::info(format!(
            "{stale} workflow(s) out of date: run `cibox workflow render`"
        ));
        return Ok(exit::TESTS_FAILED);
    }
    Ok(exit::SUCCESS)
}

pub fn lint(ctx: &Context) -> Result<u8> {
    let m = ctx.manifest()?;
    let dir = m.resolve(&m.workflows.dir.to_string_lossy());
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| Error::Usage(format!("workflows dir {}: {e}", dir.display())))?;
    let mut files: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    files.sort();
    let mut findings = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f)
            .map_err(|e| Error::Usage(format!("{}: {e}", f.display())))?;
        let doc = crate::yaml::parse(&text)
            .map_err(|e| {
                Error::Usage(format!(
                    "{}:{}: not YAML: {}",
                    f.display(),
                    e.mark,
                    e.message
                ))
            })?
            .map(|n| n.to_json())
            .unwrap_or_default();
        findings.extend(lint::lint(f, &doc));
    }
    let errors = findings
        .iter()
        .filter(|f| f.severity == lint::Severity::Error)
        .count();
    if ctx.json {
        report::json(&json!({"files": files.len(), "errors": errors, "findings": findings}));
    } else {
        for f in &findings {
            let sev = match f.severity {
                lint::Severity::Error => "error",
                lint::Severity::Warning => "warning",
            };
            println!("{sev}: {}: job {}: {}", f.file, f.job, f.reason);
        }
        report::info(format!(
            "{} workflow(s), {errors} error(s), {} warning(s)",
            files.len(),
            findings.len() - errors
        ));
    }
    Ok(if errors > 0 {
        exit::TESTS_FAILED
    } else {
        exit::SUCCESS
    })
}
