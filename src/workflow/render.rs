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

use indexmap::IndexMap;
use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value as TemplateValue};
use serde_json::{Value, json};

use super::models::model_label;
use crate::manifest::Manifest;

/// One rendered template.
pub struct Rendered {
    pub template: PathBuf,
    pub output: PathBuf,
    pub text: String,
    pub flavor: Flavor,
}

/// What a template renders: a GitHub Actions workflow (checked by `workflow lint`) or
/// a Buildkite pipeline (checked against Buildkite's schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    GitHub,
    Buildkite,
}

impl Flavor {
    pub fn as_str(self) -> &'static str {
        match self {
            Flavor::GitHub => "github",
            Flavor::Buildkite => "buildkite",
        }
    }
}

/// The model a batch's GPUs must be, when it has GPUs and names one.
fn gpu_model(b: &crate::manifest::Batch) -> Option<&str> {
    b.gpu_model.as_deref().filter(|_| b.gpus > 0)
}

/// The template context: the manifest, with layers resolved to batch lists. Each
/// batch's value is made once and shared by every list that holds it (`batches`, each
/// layer's and family's `batch_list`), so many layers of `all` cost a reference per
/// batch, not a copy.
pub fn context(m: &Manifest) -> TemplateValue {
    let batch_values: IndexMap<&str, TemplateValue> = m
        .batches
        .iter()
        .map(|(name, b)| {
            let v = json!({
                "name": name,
                "description": b.description,
                "gpus": b.gpus,
                "gpu_model": gpu_model(b),
                "gpu_model_label": gpu_model(b).map(model_label),
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
                "nodes": b.nodes,
                "est_time": b.est_time.map(|e| e.to_string()),
                "est_seconds": b.est_time.map(|e| e.0.as_secs_f64()),
                "retries": b.retries.count,
                "soft_fail": b.soft_fail,
            });
            (
                name.as_str(),
                TemplateValue::from(minijinja::value::Serde(&v)),
            )
        })
        .collect();
    let batch_list = |names: &[String]| -> TemplateValue {
        names
            .iter()
            .filter_map(|n| batch_values.get(n.as_str()).cloned())
            .collect()
    };
    let map = |pairs: Vec<(&str, TemplateValue)>| TemplateValue::from_pairs(pairs);
    let plain = |v: Value| TemplateValue::from(minijinja::value::Serde(&v));
    let batches: TemplateValue = batch_values.values().cloned().collect();
    let layers = map(m
        .layers
        .iter()
        .map(|(name, l)| {
            let max_gpus = l
                .batches
                .iter()
                .map(|b| m.batches[b].gpus)
                .max()
                .unwrap_or(0);
            let mut gpu_models: Vec<&str> = Vec::new();
            for glob in l.batches.iter().filter_map(|b| gpu_model(&m.batches[b])) {
                if !gpu_models.contains(&glob) {
                    gpu_models.push(glob);
                }
            }
            let max_minutes = l
                .batches
                .iter()
                .map(|b| m.batches[b].timeout.0.as_secs().div_ceil(60))
                .max()
                .unwrap_or(0);
            (
                name.as_str(),
                map(vec![
                    ("name", TemplateValue::from(name.as_str())),
                    ("description", plain(json!(l.description))),
                    ("fast", TemplateValue::from(l.fast)),
                    ("fail_fast", TemplateValue::from(l.fail_fast)),
                    ("batches", plain(json!(l.batches))),
                    ("batch_list", batch_list(&l.batches)),
                    ("max_gpus", TemplateValue::from(max_gpus)),
                    ("gpu_models", plain(json!(gpu_models))),
                    ("max_timeout_minutes", TemplateValue::from(max_minutes)),
                    ("meta", plain(l.meta.clone())),
                    ("image", plain(json!(l.image))),
                ]),
            )
        })
        .collect());
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
    let families = map(m
        .families
        .iter()
        .map(|(name, entries)| {
            (
                name.as_str(),
                map(vec![
                    ("name", TemplateValue::from(name.as_str())),
                    ("batches", plain(json!(entries))),
                    ("batch_list", batch_list(entries)),
                ]),
            )
        })
        .collect());
    map(vec![
        ("project", TemplateValue::from(m.project.as_str())),
        ("batches", batches),
        ("families", families),
        ("layers", layers),
        (
            "image",
            plain(serde_json::to_value(&m.image).unwrap_or(Value::Null)),
        ),
        (
            "images",
            plain(serde_json::to_value(&m.images).unwrap_or(Value::Null)),
        ),
        ("changed", plain(changed)),
        (
            "cibox_version",
            TemplateValue::from(env!("CARGO_PKG_VERSION")),
        ),
    ])
}

/// Why the workflows could not be rendered: a configuration error (nothing is written).
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// What the render's own process said (see `workflow::confined`).
    #[error("{message}")]
    InChild {
        message: String,
        details: Vec<String>,
    },
    /// The render's process went over its memory or CPU bound, or died.
    #[error(
        "{}: went over what a render may use ({} GiB of memory, {} s of CPU): {how}; a template that builds values without end cannot be rendered",
        .template.display(),
        MEMORY >> 30,
        CPU
    )]
    OverBounds { template: PathBuf, how: String },
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
        "{}: larger than {} KiB, the most a template may be",
        .template.display(),
        MAX_TEMPLATE_BYTES >> 10
    )]
    TooLarge { template: PathBuf },
    #[error("{}: not UTF-8 text (byte {byte})", .template.display())]
    NotUtf8 { template: PathBuf, byte: usize },
    #[error(
        "template {}: ran out of its instruction budget{}: a render may take about {FUEL} steps and handle about {} MiB of data; nothing written",
        .template.display(),
        .line.map(|l| format!(" (at line {l})")).unwrap_or_default(),
        (FUEL * 64) >> 20
    )]
    OutOfFuel {
        template: PathBuf,
        line: Option<usize>,
    },
    #[error(
        "template {}: rendered output over {} MiB, the most a workflow file may be (what `workflow lint` reads); nothing written",
        .template.display(),
        MAX_OUTPUT_BYTES >> 20
    )]
    OutputTooLarge { template: PathBuf },
    #[error("{}: the rendered output is not UTF-8", .template.display())]
    OutputNotUtf8 { template: PathBuf },
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
        "{}: the rendered pipeline fails Buildkite's pipeline schema at {at} (line {line} of the output): {message}; nothing written",
        .template.display()
    )]
    FailsSchema {
        template: PathBuf,
        /// Where in the pipeline: `steps.2.key`.
        at: String,
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

    fn details(&self) -> &[String] {
        match self {
            RenderError::InChild { details, .. } => details,
            _ => &[],
        }
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

/// The fuel one render may burn (minijinja's `fuel`): about one per instruction and
/// one per 64 bytes of data a template makes or handles (output included), so it bounds
/// both the time a render takes and what it can allocate (about 320 MiB). The example
/// templates use a few thousand; a template over a manifest of 10,000 batches some
/// hundred thousand.
pub const FUEL: u64 = 5_000_000;

/// The most a rendered workflow may hold: what `workflow lint` reads (GitHub's own
/// limit on a workflow file is lower).
pub const MAX_OUTPUT_BYTES: usize = super::lint::MAX_FILE_BYTES as usize;

/// The most address space a render's process may map: far above what a render within
/// its fuel needs (a few hundred MiB at most), far below what hurts a runner.
pub const MEMORY: u64 = 2 << 30;
/// The most CPU time a render's process may use: a render within its fuel takes a
/// second or two.
pub const CPU: u64 = 30;
/// The largest template read.
pub const MAX_TEMPLATE_BYTES: u64 = 1 << 20;

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(FUEL));
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
    env.add_filter("partitions", partitions);
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

/// The most parts a template may split batches into.
const MAX_TEMPLATE_PARTS: u32 = 256;

/// `batch_list | partitions(N)`: the batches split into N parts as `--partition K/N`
/// splits them by their `est_time` (a run's `--timings` may move batches between
/// parts; the parts stay N): each part's `index`, `count`, `arg` (`K/N`), `batches`
/// (names) and expected `serial_seconds` and `work_seconds`, for a matrix of N jobs.
fn partitions(list: TemplateValue, count: u32) -> Result<TemplateValue, minijinja::Error> {
    let bad = |why: String| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, why);
    if !(1..=MAX_TEMPLATE_PARTS).contains(&count) {
        return Err(bad(format!(
            "partitions({count}): give 1 to {MAX_TEMPLATE_PARTS} parts"
        )));
    }
    let mut items = Vec::new();
    for b in list.try_iter()? {
        let field = |k: &str| {
            b.get_attr(k)
                .ok()
                .filter(|v| !v.is_undefined() && !v.is_none())
        };
        let name = field("name")
            .and_then(|v| v.as_str().map(str::to_string))
            .ok_or_else(|| {
                bad("partitions: give it a list of batches (a layer's `batch_list`)".into())
            })?;
        let number = |k: &str| field(k).and_then(|v| f64::try_from(v).ok());
        let est = number("est_seconds")
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(|s| {
                (
                    std::time::Duration::from_secs_f64(s),
                    crate::timing::Source::Estimated,
                )
            });
        let slots = crate::timing::slots(
            number("gpus").unwrap_or(0.0) as u32,
            number("nodes").unwrap_or(1.0) as u32,
        );
        items.push((name, est, slots));
    }
    let expected = crate::timing::Expected::from_known(items);
    let parts: Vec<Value> = crate::timing::partition::split(&expected, count)
        .into_iter()
        .map(|p| {
            json!({
                "index": p.index,
                "count": count,
                "arg": format!("{}/{count}", p.index),
                "batches": p.batches,
                "serial_seconds": p.serial.as_secs_f64(),
                "work_seconds": p.work,
            })
        })
        .collect();
    Ok(TemplateValue::from(minijinja::value::Serde(&parts)))
}

/// Collects a render's output up to [`MAX_OUTPUT_BYTES`]; past that the write fails
/// (and the render with it), and `over` says why.
struct Bounded {
    text: Vec<u8>,
    over: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > MAX_OUTPUT_BYTES {
            self.over = true;
            return Err(std::io::Error::other("rendered output over the bound"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads a template: a plain file (no link: a template a pull request committed as one
/// could name any file cibox, maybe root, may read; no FIFO) of at most
/// [`MAX_TEMPLATE_BYTES`], UTF-8.
fn read_template(template: &Path) -> Result<String, RenderError> {
    use std::io::Read;
    let unreadable = |source: std::io::Error| RenderError::Unreadable {
        template: template.to_path_buf(),
        source: crate::nofollow::said_of_links(source),
    };
    let (file, _) = crate::util::open_plain(template, false).map_err(unreadable)?;
    let mut bytes = Vec::new();
    file.take(MAX_TEMPLATE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_TEMPLATE_BYTES {
        return Err(RenderError::TooLarge {
            template: template.to_path_buf(),
        });
    }
    String::from_utf8(bytes).map_err(|e| RenderError::NotUtf8 {
        template: template.to_path_buf(),
        byte: e.utf8_error().valid_up_to(),
    })
}

/// Renders one template with the banner; checks the result is YAML. The render runs
/// on a budget ([`FUEL`]) and its output is bounded ([`MAX_OUTPUT_BYTES`]): a template
/// is a pull request's, and a loop of its own must not run or grow without end.
pub fn render(
    template: &Path,
    ctx: &TemplateValue,
    flavor: Flavor,
) -> Result<Rendered, RenderError> {
    let name = template
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("template")
        .to_string();
    let source = read_template(template)?;
    let env = environment();
    let tmpl = env
        .template_from_named_str(&name, &source)
        .map_err(|e| describe(template, &e))?;
    let mut out = Bounded {
        text: Vec::new(),
        over: false,
    };
    let rendered = tmpl.render_captured_to(ctx.clone(), &mut out);
    if out.over {
        return Err(RenderError::OutputTooLarge {
            template: template.to_path_buf(),
        });
    }
    match rendered {
        Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => {
            return Err(RenderError::OutOfFuel {
                template: template.to_path_buf(),
                line: e.line(),
            });
        }
        Err(e) => return Err(describe(template, &e)),
        Ok(captured) => {
            if let Some((used, _)) = captured.state().fuel_levels() {
                crate::console::debug(format!(
                    "template {}: rendered with {used} of {FUEL} fuel",
                    template.display()
                ));
            }
        }
    }
    let body = String::from_utf8(std::mem::take(&mut out.text)).map_err(|_| {
        RenderError::OutputNotUtf8 {
            template: template.to_path_buf(),
        }
    })?;
    let banner = format!(
        "# Generated by cibox {} from {name}. Do not edit: edit the template and run `cibox workflow render`.\n",
        env!("CARGO_PKG_VERSION")
    );
    let text = banner + &body;
    let tree = crate::yaml::parse(&text).map_err(|e| RenderError::NotYaml {
        template: template.to_path_buf(),
        line: e.mark.line,
        message: e.message,
    })?;
    let output = template.with_file_name(name.trim_end_matches(".j2"));
    if flavor == Flavor::Buildkite {
        // What `buildkite-agent pipeline upload` would take: Buildkite's own schema.
        let json = tree.as_ref().map(|t| t.to_json()).unwrap_or(Value::Null);
        if let Err(e) = super::buildkite::schema::check(&json) {
            let line = tree.as_ref().map_or(1, |t| t.locate(&e.path).mark.line);
            return Err(RenderError::FailsSchema {
                template: template.to_path_buf(),
                at: e.at(),
                line,
                message: e.message,
            });
        }
        return Ok(Rendered {
            template: template.to_path_buf(),
            output,
            text,
            flavor,
        });
    }
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
        flavor,
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

/// How long a diff may take before it settles for a coarser one.
const DIFF_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A unified diff of `old` → `new`, labelled with the path.
pub fn diff(path: &Path, old: &str, new: &str) -> String {
    similar::TextDiff::configure()
        .timeout(DIFF_TIMEOUT)
        .diff_lines(old, new)
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

    /// Renders `source` as a template of its own over `ctx`.
    fn render_text(source: &str, ctx: serde_json::Value) -> Result<Rendered, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bomb.yml.j2");
        std::fs::write(&path, source).unwrap();
        render(
            &path,
            &TemplateValue::from(minijinja::value::Serde(&ctx)),
            Flavor::GitHub,
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_template_runs_on_a_budget_and_its_output_is_bounded() {
        // 10^10 iterations: out of fuel, not on for ever.
        let e = render_text(
            "on: push\n<% for a in range(100000) %><% for b in range(100000) %><% endfor %><% endfor %>",
            json!({}),
        )
        .err()
        .unwrap();
        assert!(
            e.contains("bomb.yml.j2: ran out of its instruction budget"),
            "{e}"
        );
        // A 1 MB string printed a million times: the output bound, long before memory.
        let big = "x".repeat(1 << 20);
        let e = render_text(
            "on: push\n<% for c in big %><< big >><% endfor %>",
            json!({ "big": big }),
        )
        .err()
        .unwrap();
        assert!(e.contains("bomb.yml.j2: rendered output over 1 MiB"), "{e}");
        // Doubling a value in a few steps allocates, not renders: the budget charges it.
        let e = render_text(
            "on: push\n<% set ns = namespace(x=big) %><% for i in range(40) %><% set ns.x = ns.x ~ ns.x %><% endfor %>",
            json!({ "big": big }),
        )
        .err()
        .unwrap();
        assert!(e.contains("ran out of its instruction budget"), "{e}");
        // What real templates do is far inside both.
        let ok = render_text(
            "on: push\njobs:\n<% for b in batches %>  j<< loop.index >>: {runs-on: ubuntu-latest, steps: [{run: << b | shell >>}]}\n<% endfor %>",
            json!({ "batches": (0..2000).map(|i| format!("b{i}")).collect::<Vec<_>>() }),
        )
        .unwrap();
        assert!(ok.text.contains("j2000:"), "{}", ok.text);
    }

    #[test]
    fn templates_get_each_batchs_gpu_model_and_a_runner_label_for_it() {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1m, run: [x], gpu_model: \"*H100*\"}\nbatches:\n  h: {gpus: 2}\n  a: {gpus: 1, gpu_model: \"NVIDIA A100*\"}\n  cpu: {gpus: 0}\nlayers:\n  gpu: {batches: all}\n";
        let m = Manifest::parse(text, Path::new("cibox.yaml")).unwrap();
        let ctx = context(&m);
        let value = |i: usize, key: &str| {
            ctx.get_attr("batches")
                .and_then(|b| b.get_item_by_index(i))
                .and_then(|b| b.get_attr(key))
                .unwrap()
        };
        let batch = |i: usize, key: &str| value(i, key).to_string();
        assert_eq!(batch(0, "gpu_model"), "*H100*");
        assert_eq!(batch(0, "gpu_model_label"), "h100");
        assert_eq!(batch(1, "gpu_model_label"), "nvidia-a100");
        // A CPU batch asks no model, whatever `defaults` says.
        assert!(value(2, "gpu_model").is_none());
        assert!(!value(1, "gpu_model").is_none());
        let models = ctx
            .get_attr("layers")
            .and_then(|l| l.get_attr("gpu"))
            .and_then(|l| l.get_attr("gpu_models"))
            .unwrap();
        assert_eq!(models.to_string(), "['*H100*', 'NVIDIA A100*']");
        assert_eq!(model_label("*RTX 5090*"), "rtx-5090");
        assert_eq!(model_label("?"), "");
    }

    #[test]
    fn a_layer_splits_into_as_many_matrix_entries_as_a_template_asks() {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1h, run: [x]}\nbatches:\n  a: {gpus: 8, est_time: 10m}\n  b: {gpus: 1, est_time: 30m}\n  c: {gpus: 2, est_time: 20m}\n  d: {gpus: 1}\nlayers:\n  gpu: {batches: all, fail_fast: true}\n";
        let m = Manifest::parse(text, Path::new("cibox.yaml")).unwrap();
        let ctx = context(&m);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu.yml.j2");
        std::fs::write(
            &path,
            "on: push\njobs:\n  gpu:\n    runs-on: ubuntu-latest\n    timeout-minutes: 120\n    strategy:\n      matrix:\n        include:\n<% for p in layers.gpu.batch_list | partitions(3) %>\n          - {part: << p.arg | yaml >>, batches: << p.batches | yaml >>, minutes: << (p.serial_seconds / 60) | round | int >>}\n<% endfor %>\n    steps:\n      - run: cibox layer run gpu --partition ${{ matrix.part }} # << layers.gpu.fail_fast >>\n",
        )
        .unwrap();
        let out = render(&path, &ctx, Flavor::GitHub).unwrap().text;
        // Work: a 4800, c 2400, b 1800, d (the mean, 20m) 1200 GPU-seconds.
        assert!(
            out.contains(r#"- {part: "1/3", batches: ["a"], minutes: 10}"#),
            "{out}"
        );
        assert!(
            out.contains(r#"- {part: "2/3", batches: ["c"], minutes: 20}"#),
            "{out}"
        );
        assert!(
            out.contains(r#"- {part: "3/3", batches: ["b","d"], minutes: 50}"#),
            "{out}"
        );
        assert!(out.contains("# True"), "{out}");
        std::fs::write(&path, "on: push\n<< batches | partitions(0) >>\n").unwrap();
        let e = render(&path, &ctx, Flavor::GitHub)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("give 1 to 256 parts"), "{e}");
        std::fs::write(&path, "on: push\n<< [1, 2] | partitions(2) >>\n").unwrap();
        let e = render(&path, &ctx, Flavor::GitHub)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("a layer's `batch_list`"), "{e}");
    }

    #[test]
    fn layers_share_their_batches_values() {
        // 200 layers of `all` over 2,000 batches: each list holds the batches' values,
        // not copies of them.
        let mut text = String::from(
            "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1m, gpus: 0, run: [x], env: {E: \"some value\"}}\nbatches:\n",
        );
        for i in 0..2000 {
            text.push_str(&format!("  b{i}: {{}}\n"));
        }
        text.push_str("layers:\n");
        for i in 0..200 {
            text.push_str(&format!("  l{i}: {{batches: all}}\n"));
        }
        let m = Manifest::parse(&text, Path::new("cibox.yaml")).unwrap();
        let ctx = context(&m);
        let first = ctx
            .get_attr("batches")
            .and_then(|b| b.get_item_by_index(0))
            .unwrap();
        let in_layer = ctx
            .get_attr("layers")
            .and_then(|l| l.get_attr("l199"))
            .and_then(|l| l.get_attr("batch_list"))
            .and_then(|b| b.get_item_by_index(0))
            .unwrap();
        type Map = IndexMap<TemplateValue, TemplateValue>;
        let (a, b) = (
            first.downcast_object_ref::<Map>().unwrap(),
            in_layer.downcast_object_ref::<Map>().unwrap(),
        );
        assert!(std::ptr::eq(a, b), "a layer's batch is a copy");
        assert_eq!(
            in_layer
                .get_attr("env")
                .unwrap()
                .get_attr("E")
                .unwrap()
                .as_str(),
            Some("some value")
        );
    }

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
