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
use serde_json::Value;

use super::context::partitions;
pub use super::error::RenderError;

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

/// An undefined value given to a quoting filter is an error, as printed it would be
/// (strict undefined lets a filter take one): `<< nope | shell >>` must not write `''`.
fn defined(v: &TemplateValue) -> Result<(), minijinja::Error> {
    if v.is_undefined() {
        return Err(minijinja::Error::from(minijinja::ErrorKind::UndefinedError));
    }
    Ok(())
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
    env.add_filter("ghstr", |v: TemplateValue| {
        defined(&v).map(|()| gh_string(&to_text(&v)))
    });
    env.add_filter("shell", |v: TemplateValue| {
        defined(&v).map(|()| shell_word(&to_text(&v)))
    });
    // JSON is YAML (1.2) in flow style: strings double-quoted and escaped, lists and maps
    // in brackets, so a value can never open a new key or block.
    env.add_filter(
        "yaml",
        |v: TemplateValue| -> Result<String, minijinja::Error> {
            defined(&v)?;
            serde_json::to_string(&v).map_err(|e| {
                minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
            })
        },
    );
    env
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
        (minijinja::ErrorKind::UndefinedError, Some(r), Some(src), None) => undefined_name(src, r),
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

/// The filters of ours that refuse an undefined value; minijinja's span is then the
/// filter's name, and the value is what comes before it.
const QUOTING_FILTERS: [&str; 4] = ["ghstr", "shell", "yaml", "partitions"];

/// What was undefined, from minijinja's span `r` of `src`: the expression itself, or,
/// when the span is a quoting filter's name, the expression given to it
/// (`<< b.nope | shell >>`: `b.nope`, given to `shell`).
fn undefined_name(src: &str, r: std::ops::Range<usize>) -> Option<String> {
    let text = src.get(r.clone())?.trim();
    if !QUOTING_FILTERS.contains(&text) {
        return Some(format!("`{text}` is not defined"));
    }
    let before = src.get(..r.start)?.trim_end().strip_suffix('|')?.trim_end();
    let start = ["<<", "<%", "(", ",", "=", "~", " in ", " if ", "|"]
        .iter()
        .filter_map(|d| before.rfind(d).map(|i| i + d.len()))
        .max()
        .unwrap_or(0);
    let value = before[start..].trim();
    (!value.is_empty()).then(|| format!("`{value}` is not defined (given to `{text}`)"))
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
    use crate::manifest::Manifest;
    use crate::workflow::context::context;
    use serde_json::json;

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
    fn an_undefined_value_is_named_even_through_a_filter() {
        // Issue 48: `u.yml.j2:7: undefined value` named nothing; a quoting filter took
        // an undefined value and wrote `''`.
        for (src, want) in [
            (
                "<< nope >>",
                "u.yml.j2:2: undefined value: `nope` is undefined",
            ),
            ("<< b.meta.q >>", "`b.meta.q` is undefined"),
            (
                "<< b.meta.q | yaml >>",
                "u.yml.j2:2: undefined value: `b.meta.q` is not defined (given to `yaml`)",
            ),
            (
                "<< nope | shell >>",
                "`nope` is not defined (given to `shell`)",
            ),
            (
                "x: << [1, nope | ghstr] >>",
                "`nope` is not defined (given to `ghstr`)",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("u.yml.j2");
            let text = format!("on: push\n<% for b in batches %>{src}<% endfor %>\n");
            std::fs::write(&path, text).unwrap();
            let ctx = json!({"batches": [{"meta": {}}]});
            let e = render(
                &path,
                &TemplateValue::from(minijinja::value::Serde(&ctx)),
                Flavor::GitHub,
            )
            .err()
            .unwrap()
            .to_string();
            assert!(e.contains(want), "{src}: {e}");
        }
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
