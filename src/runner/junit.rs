//! Reading the JUnit XML a batch writes: totals, failures, errors, and skips with their
//! reasons. Counts come from the `<testcase>` elements, not from suite attributes that
//! runners fill in inconsistently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use quick_xml::Reader;
use quick_xml::events::{BytesStart, Event};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Passed,
    Failed,
    Error,
    Skipped,
}

/// One test case as the report gives it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Case {
    pub classname: String,
    pub name: String,
    pub outcome: Outcome,
    /// The failure, error or skip message.
    pub message: Option<String>,
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

impl Totals {
    pub fn of(cases: &[Case]) -> Totals {
        let mut t = Totals {
            total: cases.len(),
            ..Totals::default()
        };
        for c in cases {
            match c.outcome {
                Outcome::Passed => t.passed += 1,
                Outcome::Failed => t.failed += 1,
                Outcome::Error => t.errors += 1,
                Outcome::Skipped => {
                    t.skipped += 1;
                    let reason = c
                        .message
                        .clone()
                        .filter(|m| !m.is_empty())
                        .unwrap_or_else(|| "no reason given".into());
                    *t.skipped_reasons.entry(reason).or_default() += 1;
                }
            }
        }
        t
    }
}

fn attr(e: &BytesStart<'_>, name: &str) -> Option<String> {
    e.try_get_attribute(name).ok().flatten().and_then(|a| {
        a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .ok()
            .map(|v| v.into_owned())
    })
}

fn case(e: &BytesStart<'_>) -> Case {
    Case {
        classname: attr(e, "classname").unwrap_or_default(),
        name: attr(e, "name").unwrap_or_default(),
        outcome: Outcome::Passed,
        message: None,
        time_s: attr(e, "time").and_then(|t| t.parse().ok()),
        file: attr(e, "file"),
        line: attr(e, "line").and_then(|l| l.parse().ok()),
    }
}

/// Parses one JUnit XML document.
pub fn parse(xml: &str) -> Result<Vec<Case>, String> {
    let mut reader = Reader::from_str(xml);
    let mut cases = Vec::new();
    let mut current: Option<Case> = None;
    let mut in_result = false;
    loop {
        let event = reader
            .read_event()
            .map_err(|e| format!("at byte {}: {e}", reader.buffer_position()))?;
        match event {
            Event::Start(e) if e.name().as_ref() == "testcase" => current = Some(case(&e)),
            // `<testcase …/>`: passed, nothing inside.
            Event::Empty(e) if e.name().as_ref() == "testcase" => cases.push(case(&e)),
            Event::Start(e) | Event::Empty(e)
                if matches!(e.name().as_ref(), "failure" | "error" | "skipped") =>
            {
                if let Some(c) = current.as_mut() {
                    let outcome = match e.name().as_ref() {
                        "failure" => Outcome::Failed,
                        "error" => Outcome::Error,
                        _ => Outcome::Skipped,
                    };
                    // A failure outranks a skip written in the same case.
                    if c.outcome == Outcome::Passed || outcome != Outcome::Skipped {
                        c.outcome = outcome;
                        c.message = attr(&e, "message");
                    }
                    in_result = true;
                }
            }
            Event::Text(t) if in_result => {
                if let Some(c) = current.as_mut()
                    && c.message.as_deref().is_none_or(str::is_empty)
                {
                    let text = t.xml_content(quick_xml::XmlVersion::Implicit1_0);
                    let first = text
                        .lines()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or("")
                        .trim();
                    if !first.is_empty() {
                        c.message = Some(first.to_string());
                    }
                }
            }
            Event::End(e) => match e.name().as_ref() {
                "testcase" => cases.extend(current.take()),
                "failure" | "error" | "skipped" => in_result = false,
                _ => {}
            },
            Event::Eof => break,
            _ => {}
        }
    }
    Ok(cases)
}

/// Reads a report the container wrote, never following a symlink (one planted in place
/// of the file must not make cibox read, and report, a host file).
pub fn read(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut text = String::new();
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)?
        .read_to_string(&mut text)?;
    Ok(text)
}

/// Every `*.xml` under `dir` (recursively), sorted; symlinks are neither followed nor
/// listed.
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
    fn malformed_xml_is_an_error() {
        assert!(parse("<testsuite><testcase name='a'></testsuite>").is_err());
    }
}
