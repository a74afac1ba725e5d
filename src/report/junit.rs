//! Reading the JUnit XML a batch writes: totals, failures, errors, and skips with their
//! reasons. Counts come from the `<testcase>` elements, not from suite attributes that
//! runners fill in inconsistently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use quick_xml::Reader;
use quick_xml::events::{BytesStart, Event};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CaseStatus {
    Passed,
    Failed,
    Error,
    Skipped,
}

/// One test case as the report gives it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Case {
    pub classname: String,
    pub name: String,
    pub status: CaseStatus,
    /// The failure, error or skip message.
    pub message: Option<String>,
    /// The text inside a failure or error (pytest's traceback), at most
    /// [`MAX_TRACE`] bytes of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub time_s: Option<f64>,
    /// The file and line a runner attached, when it did (for CI annotations).
    pub file: Option<String>,
    pub line: Option<u32>,
}

impl Case {
    pub fn id(&self) -> String {
        if self.classname.is_empty() {
            self.name.clone()
        } else {
            format!("{}::{}", self.classname, self.name)
        }
    }
}

/// The most of one report file that is read: reports are parsed on the host, outside the
/// container's memory limit, so a batch must not be able to make them arbitrarily big.
pub const MAX_FILE_BYTES: u64 = 64 << 20;
/// The most test cases kept per batch (for the merged `junit.xml`, the summary, the
/// annotations); cases beyond are still counted.
pub const MAX_CASES_KEPT: usize = 20_000;
/// The longest name, class name or message kept; longer ones end in `…`.
pub const MAX_TEXT: usize = 1024;
/// The most of one failure's text (its traceback) kept; more ends in `…`.
pub const MAX_TRACE: usize = 16 << 10;
/// The most failure text kept per batch, all cases together; cases beyond keep their
/// message only.
pub const MAX_TRACE_TOTAL: usize = 4 << 20;

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut.
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// Totals over all of a batch's JUnit files (docs/interface.md §7, `tests`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Totals {
    pub total: usize,
    pub passed: usize,
    pub failed: usize,
    pub errors: usize,
    pub skipped: usize,
    pub skipped_reasons: BTreeMap<String, usize>,
}

/// The most distinct skip reasons counted apart; the rest count as "other reasons".
const MAX_SKIP_REASONS: usize = 100;

impl Totals {
    pub fn of(cases: &[Case]) -> Totals {
        let mut t = Totals::default();
        for c in cases {
            t.count(c);
        }
        t
    }

    /// Counts one case.
    pub fn count(&mut self, c: &Case) {
        self.total += 1;
        match c.status {
            CaseStatus::Passed => self.passed += 1,
            CaseStatus::Failed => self.failed += 1,
            CaseStatus::Error => self.errors += 1,
            CaseStatus::Skipped => {
                self.skipped += 1;
                let mut reason = c
                    .message
                    .clone()
                    .filter(|m| !m.is_empty())
                    .unwrap_or_else(|| "no reason given".into());
                if !self.skipped_reasons.contains_key(&reason)
                    && self.skipped_reasons.len() >= MAX_SKIP_REASONS
                {
                    reason = "other reasons".into();
                }
                *self.skipped_reasons.entry(reason).or_default() += 1;
            }
        }
    }
}

/// A batch's reports: the cases kept (at most [`MAX_CASES_KEPT`], failing ones first
/// in line) and the totals over all of them.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    pub cases: Vec<Case>,
    pub totals: Totals,
    /// Cases counted but not kept.
    pub dropped: usize,
    /// Where kept passing (or skipped) cases are, for a failure to take the place of.
    replaceable: Vec<usize>,
    /// Bytes of failure text kept so far.
    trace_bytes: usize,
}

impl Collected {
    /// Adds a case: counted always, kept while there is room (a failing case takes
    /// the place of a kept passing one, so failures are never the ones dropped).
    pub fn add(&mut self, mut c: Case) {
        self.totals.count(&c);
        let trace = c.text.as_ref().map_or(0, String::len);
        if self.trace_bytes + trace > MAX_TRACE_TOTAL {
            c.text = None;
        } else {
            self.trace_bytes += trace;
        }
        let failing = matches!(c.status, CaseStatus::Failed | CaseStatus::Error);
        if self.cases.len() < MAX_CASES_KEPT {
            if !failing {
                self.replaceable.push(self.cases.len());
            }
            self.cases.push(c);
            return;
        }
        self.dropped += 1;
        if failing && let Some(i) = self.replaceable.pop() {
            self.cases[i] = c;
        }
    }
}

fn attr(e: &BytesStart<'_>, name: &str) -> Option<String> {
    e.try_get_attribute(name).ok().flatten().and_then(|a| {
        a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .ok()
            .map(|v| v.into_owned())
    })
}

fn text_attr(e: &BytesStart<'_>, name: &str) -> Option<String> {
    attr(e, name).map(|v| truncate(v, MAX_TEXT))
}

fn case(e: &BytesStart<'_>) -> Case {
    Case {
        classname: text_attr(e, "classname").unwrap_or_default(),
        name: text_attr(e, "name").unwrap_or_default(),
        status: CaseStatus::Passed,
        message: None,
        text: None,
        time_s: attr(e, "time").and_then(|t| t.parse().ok()),
        file: text_attr(e, "file"),
        line: attr(e, "line").and_then(|l| l.parse().ok()),
    }
}

/// Adds `more` to a failure's text, up to [`MAX_TRACE`] bytes.
fn keep_text(c: &mut Case, more: &str) {
    if !matches!(c.status, CaseStatus::Failed | CaseStatus::Error) {
        return;
    }
    let text = c.text.get_or_insert_with(String::new);
    if text.len() > MAX_TRACE {
        return; // already cut
    }
    text.push_str(more);
    if text.len() > MAX_TRACE {
        *text = truncate(std::mem::take(text), MAX_TRACE);
    }
}

/// Parses one JUnit XML document into `out`.
pub fn parse_into(xml: &str, out: &mut Collected) -> Result<(), String> {
    let mut reader = Reader::from_str(xml);
    let mut current: Option<Case> = None;
    let mut in_result = false;
    loop {
        let event = reader
            .read_event()
            .map_err(|e| format!("at byte {}: {e}", reader.buffer_position()))?;
        let opens = matches!(event, Event::Start(_));
        match event {
            Event::Start(e) if e.name().as_ref() == "testcase" => current = Some(case(&e)),
            // `<testcase …/>`: passed, nothing inside.
            Event::Empty(e) if e.name().as_ref() == "testcase" => out.add(case(&e)),
            Event::Start(e) | Event::Empty(e)
                if matches!(e.name().as_ref(), "failure" | "error" | "skipped") =>
            {
                if let Some(c) = current.as_mut() {
                    let status = match e.name().as_ref() {
                        "failure" => CaseStatus::Failed,
                        "error" => CaseStatus::Error,
                        _ => CaseStatus::Skipped,
                    };
                    // A failure outranks a skip written in the same case.
                    if c.status == CaseStatus::Passed || status != CaseStatus::Skipped {
                        c.status = status;
                        c.message = text_attr(&e, "message");
                        c.text = None;
                    }
                    // `<failure …/>` has no text: what follows is not its.
                    in_result = opens;
                }
            }
            // `&gt;` and the like: events of their own in a text.
            Event::GeneralRef(r) if in_result => {
                let ch = match r.resolve_char_ref() {
                    Ok(Some(ch)) => Some(ch),
                    _ => match r.as_ref() {
                        "lt" => Some('<'),
                        "gt" => Some('>'),
                        "amp" => Some('&'),
                        "apos" => Some('\''),
                        "quot" => Some('"'),
                        _ => None,
                    },
                };
                if let (Some(c), Some(ch)) = (current.as_mut(), ch) {
                    keep_text(c, ch.encode_utf8(&mut [0; 4]));
                }
            }
            Event::CData(t) if in_result => {
                if let Some(c) = current.as_mut() {
                    keep_text(c, &t.into_inner());
                }
            }
            Event::Text(t) if in_result => {
                let text = t.xml_content(quick_xml::XmlVersion::Implicit1_0);
                if let Some(c) = current.as_mut() {
                    keep_text(c, &text);
                }
                if let Some(c) = current.as_mut()
                    && c.message.as_deref().is_none_or(str::is_empty)
                {
                    let first = text
                        .lines()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or("")
                        .trim();
                    if !first.is_empty() {
                        c.message = Some(truncate(first.to_string(), MAX_TEXT));
                    }
                }
            }
            Event::End(e) => match e.name().as_ref() {
                "testcase" => {
                    if let Some(c) = current.take() {
                        out.add(c);
                    }
                }
                "failure" | "error" | "skipped" => in_result = false,
                _ => {}
            },
            Event::Eof => break,
            _ => {}
        }
    }
    Ok(())
}

/// Reads a report the container wrote, never following a symlink (one planted in place
/// of the file must not make cibox read, and report, a host file), never blocking on a
/// FIFO, and never more than [`MAX_FILE_BYTES`].
pub fn read(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let (file, md) = crate::util::open_plain(path, false)?;
    if md.len() > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} bytes; reports of at most {} MiB are read",
                md.len(),
                MAX_FILE_BYTES >> 20
            ),
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES).read_to_end(&mut bytes)?;
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))
}

/// The folder in a batch's folder that holds what attempt `n` (1-based) left, when
/// the batch ran again.
pub fn attempt_folder(n: u32) -> String {
    format!("attempt-{n}")
}

/// Whether `name` is an attempt's folder ([`attempt_folder`]): cibox's name, which no
/// batch's `/reports` may take.
pub fn is_attempt_folder(name: &str) -> bool {
    name.strip_prefix("attempt-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Every `*.xml` under `dir` (recursively), sorted; symlinks are neither followed nor
/// listed; attempt folders ([`is_attempt_folder`]) at its top are left out.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            // What earlier attempts of the batch left is theirs, not this attempt's.
            if ft.is_dir() && d == dir && is_attempt_folder(&e.file_name().to_string_lossy()) {
                continue;
            }
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() && p.extension().is_some_and(|x| x == "xml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses one JUnit XML document.
    fn parse(xml: &str) -> Result<Vec<Case>, String> {
        let mut collected = Collected::default();
        parse_into(xml, &mut collected)?;
        Ok(collected.cases)
    }

    #[test]
    fn counts_each_outcome_and_skip_reason() {
        let xml = r#"<?xml version="1.0"?>
<testsuites><testsuite name="s" tests="5">
  <testcase classname="t.a" name="ok" time="0.1"/>
  <testcase classname="t.a" name="bad"><failure message="assert 1 == 2">trace</failure></testcase>
  <testcase classname="t.b" name="boom"><error message="">ImportError: x
more</error></testcase>
  <testcase classname="t.b" name="gpu"><skipped message="needs 2 GPUs"/></testcase>
  <testcase classname="t.b" name="gpu2"><skipped message="needs 2 GPUs"/></testcase>
  <testcase classname="t.c" name="plain"></testcase>
</testsuite></testsuites>"#;
        let cases = parse(xml).unwrap();
        let t = Totals::of(&cases);
        assert_eq!(
            (t.total, t.passed, t.failed, t.errors, t.skipped),
            (6, 2, 1, 1, 2)
        );
        assert_eq!(t.skipped_reasons["needs 2 GPUs"], 2);
        assert_eq!(cases[1].message.as_deref(), Some("assert 1 == 2"));
        assert_eq!(cases[2].message.as_deref(), Some("ImportError: x"));
        assert_eq!(cases[1].id(), "t.a::bad");
    }

    #[test]
    fn cases_beyond_the_cap_are_counted_and_failures_kept() {
        let mut c = Collected::default();
        let case = |name: String, status| Case {
            classname: String::new(),
            name,
            status,
            message: Some("x".repeat(5000)),
            text: None,
            time_s: None,
            file: None,
            line: None,
        };
        for i in 0..MAX_CASES_KEPT + 10 {
            c.add(case(format!("ok{i}"), CaseStatus::Passed));
        }
        c.add(case("bad".into(), CaseStatus::Failed));
        assert_eq!(c.cases.len(), MAX_CASES_KEPT);
        assert_eq!(c.totals.total, MAX_CASES_KEPT + 11);
        assert_eq!(c.totals.failed, 1);
        assert!(
            c.cases.iter().any(|k| k.name == "bad"),
            "a failure is never dropped"
        );
        let xml = format!(
            "<testsuite><testcase name='{}'><failure message='{}'/></testcase></testsuite>",
            "n".repeat(5000),
            "m".repeat(5000)
        );
        let cases = parse(&xml).unwrap();
        assert!(cases[0].name.len() <= MAX_TEXT + '…'.len_utf8());
        assert!(cases[0].message.as_ref().unwrap().ends_with('…'));
    }

    #[test]
    fn malformed_xml_is_an_error() {
        assert!(parse("<testsuite><testcase name='a'></testsuite>").is_err());
    }
}
