//! Reporters render the runner's [`Event`]s: the terminal (output with batch prefixes,
//! wait lines, verdict lines), GitHub Actions (log groups, annotations, step outputs,
//! step summary) and the reports folder (`log.txt`, `result.json`, `summary.md`,
//! merged `junit.xml`). The runner knows none of them; a front end picks its set.

pub mod files;
pub mod github;
mod hardware;
pub mod pump;
pub mod terminal;
pub mod timeline;
pub mod wire;

pub use crate::report::error::ReporterError;
use crate::report::event::Event;
use crate::report::outcome::BatchResult;
use crate::report::record::reproduce_line;

/// Something that renders the runner's events. An error is the runner's to handle: a
/// batch whose `log.txt` cannot be made fails as an infrastructure error, a run whose
/// `result.json` or `summary.md` cannot be written ends with one.
pub trait Reporter: Send {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError>;
}

/// Several reporters, in order. An error stops the event there: the reporters after
/// the one that failed do not see it (a run whose `summary.md` cannot be written
/// publishes no GitHub summary either).
#[derive(Default)]
pub struct Fanout(Vec<Box<dyn Reporter>>);

impl Fanout {
    pub fn new() -> Fanout {
        Fanout::default()
    }

    pub fn with(mut self, reporter: impl Reporter + 'static) -> Fanout {
        self.0.push(Box::new(reporter));
        self
    }
}

impl Reporter for Fanout {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError> {
        self.0.iter_mut().try_for_each(|r| r.handle(event))
    }
}

/// The picture of the run beside `summary.md` (see [`timeline`]).
pub const TIMELINE_FILE: &str = "timeline.svg";

/// The most failing tests a summary lists per batch.
const MAX_FAILING_LISTED: usize = 50;
/// The longest summary: GitHub refuses step summaries over 1 MiB.
const MAX_SUMMARY_BYTES: usize = 512 * 1024;

/// Test output as Markdown text: one line, with a backslash before each character that
/// Markdown or HTML would read as markup where it stands, so a test name cannot forge a
/// table row, a link, emphasis or a tag; and no other, so the file still reads as plain
/// text in a terminal (`(256m)`, not `\(256m\)`).
pub fn markdown_text(text: &str) -> String {
    let chars: Vec<char> = text
        .chars()
        .map(|c| {
            if matches!(c, '\n' | '\r' | '\t') {
                ' '
            } else {
                c
            }
        })
        .filter(|c| !c.is_control())
        .skip_while(|c| *c == ' ')
        .collect();
    let mut out = String::with_capacity(text.len());
    for (i, &c) in chars.iter().enumerate() {
        let before = i.checked_sub(1).map(|j| chars[j]);
        let after = chars.get(i + 1).copied();
        let escape = match c {
            // Code spans, emphasis, tags, table cells, strikethrough.
            '`' | '*' | '<' | '|' | '~' => true,
            // A link: `[text](url)`, `[text][ref]`, or a definition `[ref]: url`, which
            // only the start of a line can hold. `[[gpu]]` and `test_x[1]` stay plain.
            '[' => i == 0,
            ']' => after.is_some_and(|a| matches!(a, '(' | '[' | ':')),
            // Only a backslash before punctuation escapes it.
            '\\' => after.is_some_and(|a| a.is_ascii_punctuation()),
            // Inside a word an underscore is a letter.
            '_' => {
                !(before.is_some_and(char::is_alphanumeric)
                    && after.is_some_and(char::is_alphanumeric))
            }
            // An entity (`&amp;`, `&#60;`).
            '&' => after.is_some_and(|a| a == '#' || a.is_ascii_alphabetic()),
            // At the start of a line: a heading, list item, quote or setext underline.
            '#' | '-' | '+' | '=' | '>' => i == 0,
            // An ordered list item: digits at the start, then `.` or `)`.
            '.' | ')' => {
                i > 0
                    && chars[..i].iter().all(char::is_ascii_digit)
                    && after.is_none_or(|a| a == ' ')
            }
            _ => false,
        };
        if escape {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `text` as an inline code span: fenced with more backticks than it holds, on one line.
pub fn code_span(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let longest = one_line
        .split(|c| c != '`')
        .map(str::len)
        .max()
        .unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    format!("{fence} {one_line} {fence}")
}

/// `summary.md`: one table row per batch, then the failing tests and replay commands;
/// cut at [`MAX_SUMMARY_BYTES`] with a note.
pub fn summary_markdown(results: &[BatchResult]) -> String {
    let mut s = summary_uncut(results);
    if s.len() > MAX_SUMMARY_BYTES {
        s = crate::report::junit::truncate(s, MAX_SUMMARY_BYTES);
        s.push_str("\n\n(summary cut at 512 KiB; see each batch's result.json and junit.xml)\n");
    }
    s
}

fn summary_uncut(results: &[BatchResult]) -> String {
    let mut s = String::from(
        "## cibox run\n\n| batch | status | tests | passed | failed | errors | skipped | GPUs | duration |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results.iter().map(|b| &b.record) {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s |\n",
            r.batch,
            r.status.as_str(),
            r.tests.total,
            r.tests.passed,
            r.tests.failed,
            r.tests.errors,
            r.tests.skipped,
            r.gpus.len(),
            r.duration_s
        ));
    }
    let picture = timeline::mermaid(results);
    if !picture.is_empty() {
        s.push_str("\n### Timeline\n\n");
        s.push_str(&picture);
        s.push_str(&format!(
            "\nPer GPU, each batch's wait for its GPUs, then its run (red: it did not pass). The same picture without GitHub: `{TIMELINE_FILE}` beside `summary.md`.\n"
        ));
    }
    for b in results.iter().filter(|b| !b.passed()) {
        let r = &b.record;
        s.push_str(&format!("\n### {} ({})\n\n", r.batch, r.status.as_str()));
        if let Some(m) = &r.message {
            s.push_str(&format!("{}\n\n", markdown_text(m)));
        }
        let failing: Vec<_> = b.failing().collect();
        for c in failing.iter().take(MAX_FAILING_LISTED) {
            s.push_str(&format!(
                "- {}: {}\n",
                code_span(&c.id()),
                markdown_text(c.message.as_deref().unwrap_or("(no message)"))
            ));
        }
        let unlisted = (r.tests.failed + r.tests.errors).saturating_sub(MAX_FAILING_LISTED);
        if unlisted > 0 {
            s.push_str(&format!("- … and {unlisted} more\n"));
        }
        s.push_str(&format!(
            "\nReplay locally: `{}`\n",
            reproduce_line(&b.record_path)
        ));
    }
    s.push_str(&hardware::summary_section(results));
    s
}

/// A run of three batches (passed; failed with two failing tests; timed out), for the
/// reporters' snapshot tests.
#[cfg(test)]
pub(crate) mod sample {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use crate::report::junit::{Case, CaseStatus, Totals};
    use crate::report::outcome::{BatchResult, RunResult, Status};
    use crate::plan::SourceInfo;
    use crate::report::record::{GpuHardware, GpuRef, Hardware, RunRecord};

    fn case(name: &str, status: CaseStatus, message: Option<&str>, file: Option<&str>) -> Case {
        Case {
            classname: "tests.test_model".into(),
            name: name.into(),
            status,
            message: message.map(str::to_string),
            time_s: Some(0.5),
            file: file.map(str::to_string),
            line: file.map(|_| 42),
        }
    }

    fn result(batch: &str, status: Status, message: Option<&str>, cases: Vec<Case>) -> BatchResult {
        let tests = Totals::of(&cases);
        let record = RunRecord {
            schema: 1,
            batch: batch.into(),
            status,
            exit_code: status.exit_code(None),
            image: format!("sha256:{}", "a".repeat(64)),
            image_name: "default".into(),
            layer: None,
            lockset: format!("sha256:{}", "b".repeat(64)),
            source: SourceInfo {
                sha: Some("c".repeat(40)),
                dirty: Some(false),
                path: "/src/p".into(),
            },
            gpus: vec![GpuRef {
                index: 0,
                uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                node: None,
            }],
            host: "gpu-host".into(),
            scope: "gh-1-1".into(),
            run: "0123456789abcdef".into(),
            container: format!("cibox-p-gh-1-1-{batch}-01234567"),
            fast: false,
            started_at: "2026-11-30T03:00:00Z".into(),
            finished_at: "2026-11-30T03:00:12Z".into(),
            duration_s: 12.25,
            gpu_wait_s: 0.0,
            hardware: Some(Hardware {
                gpus: vec![GpuHardware {
                    index: 0,
                    uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                    name: Some("NVIDIA H100 80GB HBM3".into()),
                    memory_mib: Some(81559),
                    driver: Some("550.54.15".into()),
                    cuda: Some("12.4".into()),
                    compute_capability: Some("9.0".into()),
                }],
                kernel: "6.1.0-18-amd64".into(),
                engine: "20.10.24+dfsg1".into(),
                gpus_unknown: None,
            }),
            tests,
            cibox_version: "0.1.0".into(),
            manifest_digest: format!("sha256:{}", "d".repeat(64)),
            gpu_count: 1,
            env: BTreeMap::new(),
            failed_tests: Vec::new(),
            message: message.map(str::to_string),
            container_exit_code: None,
            output_bytes: 0,
            cases_left_out: 0,
            reports: Default::default(),
            loosened: serde_json::Value::Object(Default::default()),
            changed_file: None,
            caches: Vec::new(),
            slurm: None,
        };
        BatchResult {
            record,
            cases,
            record_path: PathBuf::from(format!("/r/{batch}/result.json")),
            container_left: false,
        }
    }

    pub fn run() -> RunResult {
        RunResult {
            run: "0123456789abcdef".into(),
            batches: vec![
                result(
                    "unit",
                    Status::Passed,
                    None,
                    vec![case("test_ok", CaseStatus::Passed, None, None)],
                ),
                result(
                    "4a",
                    Status::Failed,
                    Some("1 failed, 1 errors"),
                    vec![
                        case("test_ok", CaseStatus::Passed, None, None),
                        case(
                            "test_loss",
                            CaseStatus::Failed,
                            Some("loss 0.9 > 0.5: diverged, again"),
                            Some("tests/test_model.py"),
                        ),
                        case("test_nccl", CaseStatus::Error, None, None),
                    ],
                ),
                result(
                    "8b",
                    Status::Timeout,
                    Some("the batch hit its timeout of 30m"),
                    Vec::new(),
                ),
            ],
            stopped_by: None,
            reports: PathBuf::from("/r"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn summary_markdown_of_a_mixed_run() {
        insta::assert_snapshot!(crate::report::reporter::summary_markdown(
            &crate::report::reporter::sample::run().batches
        ));
    }

    #[test]
    fn test_names_cannot_forge_markdown() {
        assert_eq!(
            crate::report::reporter::markdown_text("x\n| forged | row |\n<img src=x>"),
            "x \\| forged \\| row \\| \\<img src=x>"
        );
        // Plain text stays plain: no escape where Markdown reads no markup.
        assert_eq!(
            crate::report::reporter::markdown_text(
                "the batch went over its memory limit (256m); see log.txt, test_x."
            ),
            "the batch went over its memory limit (256m); see log.txt, test_x."
        );
        // Markup where it stands is escaped.
        assert_eq!(
            crate::report::reporter::markdown_text("# 1. _em_ *b* [l](u) ~s~ &amp; a\\*"),
            "\\# 1. \\_em\\_ \\*b\\* [l\\](u) \\~s\\~ \\&amp; a\\\\\\*"
        );
        assert_eq!(
            crate::report::reporter::markdown_text("[r]: http://x and [a][r] but [[gpu]] and t[1]"),
            "\\[r\\]: http://x and [a\\][r] but [[gpu]] and t[1]"
        );
        assert_eq!(
            crate::report::reporter::markdown_text("12. item"),
            "12\\. item"
        );
        assert_eq!(
            crate::report::reporter::markdown_text("0.9 > 0.5"),
            "0.9 > 0.5"
        );
        assert_eq!(crate::report::reporter::markdown_text("- item"), "\\- item");
        assert_eq!(crate::report::reporter::code_span("a`b"), "`` a`b ``");
        assert_eq!(crate::report::reporter::code_span("t::x\ny"), "` t::x y `");
    }
}
