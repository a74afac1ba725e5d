//! `*.yml.j2` → `*.yml` with minijinja. Delimiters `<% %>`, `<< >>`, `<# #>` so GitHub's
//! `${{ … }}` passes through untouched; undefined variables are errors; the output
//! must parse as YAML and pass `workflow lint`; rendering is deterministic.
//!
//! `<< x >>` inserts text, as in Jinja. Quoting is the template's choice, per context,
//! through filters: `ghstr` (a GitHub expression string literal), `shell` (one POSIX
//! shell word), `tojson` (JSON) and `yaml` (a YAML flow value). minijinja would
//! otherwise JSON-escape every value in a `.yml.j2` file, which breaks label checks,
//! job ids and shell lines alike.

use std::path::{Path, PathBuf};

use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value as TemplateValue};
use serde_json::{Value, json};

use crate::manifest::Manifest;

/// One rendered template.
pub struct Rendered {
    pub template: PathBuf,
    pub output: PathBuf,
    pub text: String,
}

/// The template context: the manifest, with layers resolved to batch lists.
pub fn context(m: &Manifest) -> Value {
    let batch = |name: &str| {
        let b = &m.batches[name];
        json!({
            "name": name,
            "description": b.description,
            "gpus": b.gpus,
            "timeout": b.timeout.to_string(),
            "timeout_minutes": b.timeout.0.as_secs().div_ceil(60),
            "env": b.env,
            "fast_env": b.fast_env,
            "allow_empty": b.allow_empty,
            "tests": b.tests,
            "meta": b.meta,
            "image": b.image,
            "family": b.family,
            "test_file": b.env.get("CIBOX_TEST_FILE").filter(|_| b.family.is_some()),
        })
    };
    let batches: Vec<Value> = m.batches.keys().map(|n| batch(n)).collect();
    let layers: serde_json::Map<String, Value> = m
        .layers
        .iter()
        .map(|(name, l)| {
            let max_gpus = l
                .batches
                .iter()
                .map(|b| m.batches[b].gpus)
                .max()
                .unwrap_or(0);
            let max_minutes = l
                .batches
                .iter()
                .map(|b| m.batches[b].timeout.0.as_secs().div_ceil(60))
                .max()
                .unwrap_or(0);
            (
                name.clone(),
                json!({
                    "name": name,
                    "description": l.description,
                    "fast": l.fast,
                    "batches": l.batches,
                    "batch_list": l.batches.iter().map(|b| batch(b)).collect::<Vec<_>>(),
                    "max_gpus": max_gpus,
                    "max_timeout_minutes": max_minutes,
                    "meta": l.meta,
                    "image": l.image,
                }),
            )
        })
        .collect();
    // `changed`, with its run template's timeout in whole minutes for `timeout-minutes`.
    let mut changed = serde_json::to_value(&m.changed).unwrap_or(Value::Null);
    if let Some(run) = m.changed.as_ref().and_then(|c| c.run.as_ref())
        && let Some(obj) = changed.get_mut("run").and_then(Value::as_object_mut)
    {
        obj.insert(
            "timeout_minutes".into(),
            json!(run.timeout.0.as_secs().div_ceil(60)),
        );
    }
    // Each test list with its entries' batches, for a matrix of them.
    let families: serde_json::Map<String, Value> = m
        .families
        .iter()
        .map(|(name, entries)| {
            (
                name.clone(),
                json!({
                    "name": name,
                    "batches": entries,
                    "batch_list": entries.iter().map(|b| batch(b)).collect::<Vec<_>>(),
                }),
            )
        })
        .collect();
    json!({
        "project": m.project,
        "batches": batches,
        "families": families,
        "layers": layers,
        "image": m.image,
        "images": m.images,
        "changed": changed,
        "cibox_version": env!("CARGO_PKG_VERSION"),
    })
}

/// Why the workflows could not be rendered: a configuration error (nothing is written).
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("workflows dir {}: {source}", .dir.display())]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", .template.display())]
    Unreadable {
        template: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// minijinja refused the template, or failed rendering it.
    #[error(
        "{}{}: {kind}{}{}",
        .template.display(),
        .line.map(|l| format!(":{l}")).unwrap_or_default(),
        .undefined.as_ref().map(|u| format!(": `{u}` is not defined")).unwrap_or_default(),
        .detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default()
    )]
    Template {
        template: PathBuf,
        line: Option<usize>,
        kind: minijinja::ErrorKind,
        /// What was undefined, when minijinja gives only its span.
        undefined: Option<String>,
        detail: Option<String>,
    },
    #[error(
        "{}: the rendered output is not YAML: line {line} (of the output, banner included): {message}",
        .template.display()
    )]
    NotYaml {
        template: PathBuf,
        line: usize,
        message: String,
    },
    #[error(
        "{}: the rendered output fails `workflow lint` (nothing written): {}",
        .template.display(),
        .errors.join("; ")
    )]
    FailsLint {
        template: PathBuf,
        /// The lint's errors, one line each.
        errors: Vec<String>,
    },
}

impl crate::error::ErrorKind for RenderError {
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }
}

/// The `*.yml.j2` files of a folder, sorted.
pub fn templates(dir: &Path) -> Result<Vec<PathBuf>, RenderError> {
    let entries = std::fs::read_dir(dir).map_err(|source| RenderError::Dir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".yml.j2") || n.ends_with(".yaml.j2"))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// A GitHub expression string literal: single quotes, a quote inside doubled.
pub fn gh_string(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// One POSIX shell word: as is when it holds only characters no shell treats specially,
/// else single-quoted (a quote inside becomes `'\''`).
pub fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn to_text(v: &TemplateValue) -> String {
    match v.as_str() {
        Some(s) => s.to_string(),
        None => v.to_string(),
    }
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .block_delimiters("<%", "%>")
            .variable_delimiters("<<", ">>")
            .comment_delimiters("<#", "#>")
            .keep_trailing_newline(true)
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("valid delimiters"),
    );
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.add_filter("ghstr", |v: TemplateValue| gh_string(&to_text(&v)));
    env.add_filter("shell", |v: TemplateValue| shell_word(&to_text(&v)));
    // JSON is YAML (1.2) in flow style: strings double-quoted and escaped, lists and maps
    // in brackets, so a value can never open a new key or block.
    env.add_filter(
        "yaml",
        |v: TemplateValue| -> Result<String, minijinja::Error> {
            serde_json::to_string(&v).map_err(|e| {
                minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
            })
        },
    );
    env
}

/// Renders one template with the banner; checks the result is YAML.
pub fn render(template: &Path, ctx: &Value) -> Result<Rendered, RenderError> {
    let name = template
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("template")
        .to_string();
    // A template a pull request committed as a link is not followed (it could name any
    // file cibox, maybe root, may read).
    let source = crate::util::open_plain(template, false)
        .and_then(|(mut f, _)| {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut f, &mut text).map(|_| text)
        })
        .map_err(|source| RenderError::Unreadable {
            template: template.to_path_buf(),
            source: crate::nofollow::said_of_links(source),
        })?;
    let env = environment();
    let tmpl = env
        .template_from_named_str(&name, &source)
        .map_err(|e| describe(template, &e))?;
    let body = tmpl
        .render(minijinja::value::Serde(ctx))
        .map_err(|e| describe(template, &e))?;
    let banner = format!(
        "# Generated by cibox {} from {name}. Do not edit: edit the template and run `cibox workflow render`.\n",
        env!("CARGO_PKG_VERSION")
    );
    let text = banner + &body;
    crate::yaml::parse(&text).map_err(|e| RenderError::NotYaml {
        template: template.to_path_buf(),
        line: e.mark.line,
        message: e.message,
    })?;
    let output = template.with_file_name(name.trim_end_matches(".j2"));
    // What we write must be a workflow our own lint accepts: a value can change what a
    // condition means or what a script runs.
    let out_name = name.trim_end_matches(".j2");
    let errors: Vec<String> = super::lint::lint_source(out_name, &text, &|_| None)
        .into_iter()
        .filter(|f| f.severity == super::lint::Severity::Error)
        .map(|f| f.to_string())
        .collect();
    if !errors.is_empty() {
        return Err(RenderError::FailsLint {
            template: template.to_path_buf(),
            errors,
        });
    }
    Ok(Rendered {
        template: template.to_path_buf(),
        output,
        text,
    })
}

fn describe(template: &Path, e: &minijinja::Error) -> RenderError {
    // Name what was undefined: minijinja gives only the span of the expression.
    let undefined = match (e.kind(), e.range(), e.template_source(), e.detail()) {
        (minijinja::ErrorKind::UndefinedError, Some(r), Some(src), None) => {
            src.get(r).map(|t| t.trim().to_string())
        }
        _ => None,
    };
    RenderError::Template {
        template: template.to_path_buf(),
        line: e.line(),
        kind: e.kind(),
        undefined,
        detail: e.detail().map(str::to_string),
    }
}

/// A unified diff of `old` → `new`, labelled with the path.
pub fn diff(path: &Path, old: &str, new: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .header(
            &format!("a/{}", path.display()),
            &format!("b/{}", path.display()),
        )
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_filters() {
        assert_eq!(gh_string("run-ci"), "'run-ci'");
        assert_eq!(gh_string("it's"), "'it''s'");
        assert_eq!(shell_word("tests/a_b-1.py"), "tests/a_b-1.py");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("$(rm -rf /)"), "'$(rm -rf /)'");
        assert_eq!(shell_word("a'b"), "'a'\\''b'");
    }
}
