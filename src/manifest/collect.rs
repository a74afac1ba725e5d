//! Test lists a project's code declares (`collect:`): a family whose entries are printed
//! at run time by a command of the project (SGLang's `register_cuda_ci(est_time=…)`
//! calls, read by `test/run_suite.py`), instead of written out under `each:`. This file
//! owns the key as written ([`CollectSpec`]), the bounds of what a collector may print,
//! and what it printed read into entries ([`parse_output`]), each checked; the entries
//! then become batches exactly as `each:` entries do. Running the command (in a
//! disposable container, never on the host) is `run::collect`'s.

use std::time::Duration;

use indexmap::IndexMap;
use serde::Deserialize;
use serde::de::{SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::units::Span;

use super::check::Checker;
use super::each::{MAX_BATCHES, RawEntry};
use super::error::ManifestError;
use super::values::is_name;

/// How long a collector runs when `collect.timeout` is not written.
pub const DEFAULT_COLLECT_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest `collect.timeout`: a list is read, not tested.
pub const MAX_COLLECT_TIMEOUT: Duration = Duration::from_secs(600);
/// The most a collector may print on its standard output: 4 MiB (SGLang's 1,217
/// entries take about 150 KiB). One byte more and it is killed.
pub const MAX_COLLECT_BYTES: usize = 4 << 20;
/// The most GPUs an entry may ask where the host policy names no pool of its own.
pub const MAX_ENTRY_GPUS: u32 = 1024;
/// The longest text of an entry (a file, a name, arguments, a suite).
const MAX_TEXT: usize = 4096;
/// The longest expected time: 30 days, as `est_time:`.
const MAX_EST_SECONDS: f64 = 30.0 * 24.0 * 3600.0;

/// `collect:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCollect {
    run: String,
    timeout: Option<Span>,
    suite: Option<String>,
}

/// A test list the project's code declares: the command that prints it, run in a
/// disposable container of the family's image.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CollectSpec {
    /// A shell command (`sh -c`), run in `/src`.
    pub run: String,
    /// Its wall time; past it, it is killed and the run refused.
    #[serde(serialize_with = "super::values::ser_display")]
    pub timeout: Span,
    /// Only the entries of this suite are the family's (one collector, many suites).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suite: Option<String>,
    /// The image it runs in: the family's (a key of `images`).
    pub image: String,
}

/// What the collectors printed, by family, each entry checked: what
/// [`super::Manifest::with_collected`] makes batches of.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Collected {
    pub lists: IndexMap<String, Vec<CollectedEntry>>,
}

/// One entry as a collector printed it, checked.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CollectedEntry {
    pub file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Seconds, 0 or more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub est_time: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suite: Option<String>,
}

impl CollectedEntry {
    /// The entry as `each:` would have it.
    pub(super) fn raw(&self) -> RawEntry {
        RawEntry::collected(
            self.file.clone(),
            self.name.clone(),
            self.gpus,
            self.gpu_model.clone(),
            self.args.clone(),
            self.est_time.map(|s| Span(Duration::from_secs_f64(s))),
            self.suite.clone(),
        )
    }
}

/// `batches.<family>.collect`, checked.
pub(super) fn collect_spec(
    check: &Checker<'_>,
    family: &str,
    image: &str,
    raw: RawCollect,
) -> Result<CollectSpec, ManifestError> {
    let at = |k: &'static str| ["batches", family, "collect", k];
    if raw.run.trim().is_empty() || raw.run.contains('\0') {
        return Err(check.at(
            &at("run"),
            "must be a command (`sh -c`) that prints the list",
        ));
    }
    let timeout = raw.timeout.unwrap_or(Span(DEFAULT_COLLECT_TIMEOUT));
    if timeout.0.is_zero() || timeout.0 > MAX_COLLECT_TIMEOUT {
        return Err(check.at(
            &at("timeout"),
            format!(
                "must be more than 0s and at most 10m, got {timeout}: a list is read, not tested"
            ),
        ));
    }
    if let Some(s) = &raw.suite
        && !plain_text(s)
    {
        return Err(check.at(&at("suite"), "must be plain text of one line"));
    }
    Ok(CollectSpec {
        run: raw.run,
        timeout,
        suite: raw.suite,
        image: image.to_string(),
    })
}

/// Text of one line, without control characters, at most [`MAX_TEXT`] bytes.
fn plain_text(s: &str) -> bool {
    s.len() <= MAX_TEXT && !s.chars().any(char::is_control)
}

/// Reads a collector's standard output: a JSON list of entries, or one entry a line
/// (JSON lines, blank lines skipped); at most [`MAX_BATCHES`] entries, each an object
/// of `file` (required), `name`, `est_time`, `gpus`, `gpu_model`, `args`, `suite`, and
/// `gpus` at most `max_gpus` (`max_gpus.1` says whose bound it is). The error says
/// where (the line, or the entry) and what.
pub fn parse_output(out: &[u8], max_gpus: (u32, &str)) -> Result<Vec<CollectedEntry>, String> {
    let text = std::str::from_utf8(out)
        .map_err(|e| format!("its output is not UTF-8 text (at byte {})", e.valid_up_to()))?;
    let trimmed = text.trim_start();
    let values: Vec<(String, Value)> = if trimmed.starts_with('[') {
        let Bounded(list) = serde_json::from_str::<Bounded>(trimmed)
            .map_err(|e| format!("its output is not a JSON list of entries: {e}"))?;
        list.into_iter()
            .enumerate()
            .map(|(i, v)| (format!("entry {i}"), v))
            .collect()
    } else {
        let lines: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .collect();
        if lines.len() > MAX_BATCHES {
            return Err(too_many(lines.len()));
        }
        lines
            .into_iter()
            .map(|(i, l)| {
                serde_json::from_str::<Value>(l)
                    .map(|v| (format!("line {}", i + 1), v))
                    .map_err(|e| format!("line {}: not JSON: {e}", i + 1))
            })
            .collect::<Result<_, _>>()?
    };
    if values.is_empty() {
        return Err("printed no entry".into());
    }
    values
        .into_iter()
        .map(|(at, v)| entry(v, max_gpus).map_err(|e| format!("{at}: {e}")))
        .collect()
}

/// The refusal of `n` entries.
fn too_many(n: usize) -> String {
    format!("printed {n} entries; a manifest holds at most {MAX_BATCHES} batches")
}

/// A JSON list of at most [`MAX_BATCHES`] values: a million entries are refused at the
/// first one past the bound, not held.
struct Bounded(Vec<Value>);

impl<'de> Deserialize<'de> for Bounded {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Bounded;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of entries")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bounded, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = seq.next_element::<Value>()? {
                    if out.len() == MAX_BATCHES {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_BATCHES} entries; a manifest holds at most {MAX_BATCHES} batches"
                        )));
                    }
                    out.push(v);
                }
                Ok(Bounded(out))
            }
        }
        d.deserialize_seq(V)
    }
}

/// One entry, checked.
fn entry(v: Value, (max_gpus, whose): (u32, &str)) -> Result<CollectedEntry, String> {
    let Value::Object(mut o) = v else {
        return Err(format!(
            "an entry must be an object (`{{\"file\": …}}`), got {}",
            kind(&v)
        ));
    };
    const KEYS: [&str; 7] = [
        "file",
        "name",
        "est_time",
        "gpus",
        "gpu_model",
        "args",
        "suite",
    ];
    if let Some(k) = o.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(format!(
            "unknown key `{}`; an entry has {}",
            crate::util::escape(k),
            KEYS.join(", ")
        ));
    }
    let file = text(&mut o, "file")?.ok_or("`file` is missing")?;
    if !crate::util::is_plain_relative(&file) || !plain_text(&file) {
        return Err(format!(
            "file `{}` is not a path relative to the source (no `..`, no leading `/`, one line)",
            crate::util::escape(&file)
        ));
    }
    let name = text(&mut o, "name")?;
    if let Some(n) = &name
        && !is_name(n, true)
    {
        return Err(format!(
            "name `{}` is not a batch name: letters, digits, `_`, `.` and `-`, starting with a letter or digit",
            crate::util::escape(n)
        ));
    }
    let est_time = match o.remove("est_time") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n))
            if n.as_f64()
                .is_some_and(|s| (0.0..=MAX_EST_SECONDS).contains(&s)) =>
        {
            n.as_f64()
        }
        Some(other) => {
            return Err(format!(
                "est_time must be a number of seconds from 0 to 30 days (2592000), got {}",
                crate::util::escape(&other.to_string())
            ));
        }
    };
    let gpus = match o.remove("gpus") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|g| g <= u64::from(max_gpus)) => {
            n.as_u64().map(|g| g as u32)
        }
        Some(other) => {
            return Err(format!(
                "gpus must be a whole number from 0 to {max_gpus} ({whose}), got {}",
                crate::util::escape(&other.to_string())
            ));
        }
    };
    let gpu_model = text(&mut o, "gpu_model")?;
    if let Some(g) = &gpu_model {
        super::check_model_glob(g).map_err(|why| format!("gpu_model: {why}"))?;
    }
    Ok(CollectedEntry {
        file,
        name,
        est_time,
        gpus,
        gpu_model,
        args: text(&mut o, "args")?,
        suite: text(&mut o, "suite")?,
    })
}

/// Key `k` of an entry: plain text of one line, or not there (`null`).
fn text(o: &mut Map<String, Value>, k: &str) -> Result<Option<String>, String> {
    match o.remove(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if plain_text(&s) => Ok(Some(s)),
        Some(Value::String(s)) => Err(format!(
            "{k} `{}` is not plain text of one line (no control character, at most {MAX_TEXT} bytes)",
            crate::util::escape(&s.chars().take(80).collect::<String>())
        )),
        Some(other) => Err(format!("{k} must be a string, got {}", kind(&other))),
    }
}

/// What a JSON value is, for a message.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: (u32, &str) = (8, "the host policy's pool");

    #[test]
    fn lists_and_lines_read_alike() {
        let list = br#"[{"file": "test/a.py", "est_time": 0, "gpus": 1, "suite": "s"},
            {"file": "test/b.py", "est_time": 12.5, "name": "b", "args": "-k x"}]"#;
        let lines = b"{\"file\": \"test/a.py\", \"est_time\": 0, \"gpus\": 1, \"suite\": \"s\"}\n\n{\"file\": \"test/b.py\", \"est_time\": 12.5, \"name\": \"b\", \"args\": \"-k x\"}\n";
        let a = parse_output(list, POLICY).unwrap();
        assert_eq!(a, parse_output(lines, POLICY).unwrap());
        assert_eq!(a[0].est_time, Some(0.0));
        assert_eq!(a[1].name.as_deref(), Some("b"));
    }

    #[test]
    fn hostile_entries_are_refused_saying_where() {
        for (out, want) in [
            (
                &b"{\"file\": \"a.py\"}\n{\"file\": \"b.py\", \"name\": \"x\\ny\"}"[..],
                "line 2: name `x\\ny` is not plain text of one line",
            ),
            (
                b"[{\"file\": \"a/../../etc/passwd\"}]",
                "entry 0: file `a/../../etc/passwd` is not a path relative",
            ),
            (
                b"[{\"file\": \"a.py\", \"name\": \"a/b\"}]",
                "entry 0: name `a/b` is not a batch name",
            ),
            (
                b"[{\"file\": \"a.py\", \"name\": \"..\"}]",
                "entry 0: name `..` is not a batch name",
            ),
            (
                b"[{\"file\": \"a.py\", \"est_time\": -1}]",
                "entry 0: est_time must be a number of seconds from 0 to 30 days (2592000), got -1",
            ),
            (
                b"[{\"file\": \"a.py\", \"est_time\": \"10\"}]",
                "got \"10\"",
            ),
            (
                b"[{\"file\": \"a.py\", \"gpus\": 9}]",
                "entry 0: gpus must be a whole number from 0 to 8 (the host policy's pool), got 9",
            ),
            (b"[{\"file\": \"a.py\", \"gpus\": 1.5}]", "got 1.5"),
            (b"{\"file\": \"a.py\"\n", "line 1: not JSON"),
            (b"[{\"file\": \"a.py\"}", "not a JSON list of entries"),
            (
                b"[{\"file\": \"a.py\", \"colour\": 1}]",
                "entry 0: unknown key `colour`",
            ),
            (b"[]", "printed no entry"),
            (b"\xff", "not UTF-8"),
        ] {
            let err = parse_output(out, POLICY).unwrap_err();
            assert!(err.contains(want), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn a_million_entries_are_refused_at_the_bound() {
        let list = format!("[{}{{}}]", "{},".repeat(999_999));
        let err = parse_output(list.as_bytes(), POLICY).unwrap_err();
        assert!(err.contains("more than 10000 entries"), "{err}");
        let lines = "{}\n".repeat(1_000_000);
        let err = parse_output(lines.as_bytes(), POLICY).unwrap_err();
        assert!(err.contains("printed 1000000 entries"), "{err}");
    }
}
