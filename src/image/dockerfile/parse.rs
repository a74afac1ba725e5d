//! A Dockerfile's text into instructions, as BuildKit's parser reads it
//! (`frontend/dockerfile/parser/parser.go` in moby/buildkit, ported line for line where
//! it matters): parser directives, the escape character, line continuations joined with
//! nothing between them, comment and empty lines inside a continuation dropped, flags
//! taken from the front of an instruction with their quotes removed, and heredocs where
//! the engine's BuildKit reads them ([`Dialect`]).
//!
//! Where two BuildKit versions read the same text differently, and cibox cannot tell
//! which one the engine runs, the text is refused ([`ParseError`]) rather than guessed.

use super::node::{Heredoc, Node, ParseError, fail};
use super::words;

/// How the engine's BuildKit reads a Dockerfile, where versions differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dialect {
    /// Heredocs (`RUN <<EOF`): BuildKit 0.10 and later (Docker 23.0, API 1.42). Before,
    /// the lines after one are instructions of their own.
    pub heredocs: bool,
}

impl Dialect {
    /// The dialect of an engine with this API version (`major.minor`).
    pub fn of_api(version: &str) -> Dialect {
        let mut parts = version
            .trim()
            .split('.')
            .map(|p| p.parse::<u64>().unwrap_or(0));
        let api = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        Dialect {
            heredocs: api >= (1, 42),
        }
    }

    /// Today's BuildKit.
    pub const CURRENT: Dialect = Dialect { heredocs: true };
}

/// The parser's state of directives: the escape character and whether more may come.
struct Directives {
    escape: char,
    done: bool,
    seen: Vec<String>,
    /// A `# check=` directive was read: versions before BuildKit 0.14 stop reading
    /// directives there, later ones go on.
    check_at: Option<usize>,
}

/// The longest line bufio.Scanner reads (BuildKit refuses longer ones).
const MAX_LINE: usize = 64 * 1024 - 1;

impl Directives {
    fn new() -> Directives {
        Directives {
            escape: '\\',
            done: false,
            seen: Vec::new(),
            check_at: None,
        }
    }

    /// Reads a line as a possible parser directive (`# escape=`), once they are over
    /// nothing more.
    fn line(&mut self, line: &str, n: usize) -> Result<(), ParseError> {
        if self.done {
            return Ok(());
        }
        let Some((key, value)) = directive(line) else {
            self.done = true;
            return Ok(());
        };
        if !["syntax", "escape", "check"].contains(&key.as_str()) {
            self.done = true;
            return Ok(());
        }
        if let Some(at) = self.check_at {
            return Err(fail(
                n,
                format!(
                    "a `{key}` parser directive after the `check` directive of line {at}: BuildKit before 0.14 reads no directive after `check`, later ones do; put `check` last"
                ),
            ));
        }
        if self.seen.contains(&key) {
            return Err(fail(
                n,
                format!("only one {key} parser directive can be used"),
            ));
        }
        self.seen.push(key.clone());
        match key.as_str() {
            "escape" => match value {
                "\\" => self.escape = '\\',
                "`" => self.escape = '`',
                other => {
                    return Err(fail(
                        n,
                        format!("invalid escape token '{other}' does not match ` or \\"),
                    ));
                }
            },
            "check" => self.check_at = Some(n),
            _ => {}
        }
        Ok(())
    }
}

/// `# key = value` (key as written lower case, value trimmed), as BuildKit's directive
/// regular expression `^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$` reads a line.
fn directive(line: &str) -> Option<(String, &str)> {
    directive_with(line, "#")
}

fn directive_with<'a>(line: &'a str, comment: &str) -> Option<(String, &'a str)> {
    let rest = line.strip_prefix(comment)?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(rest.len());
    let key = &rest[..end];
    if !key.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    let value = rest[end..].trim_start().strip_prefix('=')?.trim();
    (!value.is_empty()).then(|| (key.to_ascii_lowercase(), value))
}

/// Where the Dockerfile asks for a frontend of its own (`# syntax=IMAGE`), the line and
/// the image, as any BuildKit version detects it: a `# syntax` (or `// syntax`) among
/// the first comment lines that look like directives (after a byte order mark and a
/// `#!` line), or a JSON object's `syntax` key.
pub fn syntax_directive(text: &str) -> Option<(usize, String)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split('\n').enumerate().peekable();
    if lines.peek().is_some_and(|(_, l)| l.starts_with("#!")) {
        lines.next();
    }
    for comment in ["#", "//"] {
        for (i, line) in lines.clone() {
            let line = line.trim_end_matches(['\r', '\n']).trim_start();
            match directive_with(line, comment) {
                Some((key, value)) if key == "syntax" => return Some((i + 1, value.to_string())),
                Some(_) => continue,
                None => break,
            }
        }
    }
    let json: serde_json::Value = serde_json::from_str(text).ok()?;
    json.get("syntax")
        .and_then(|v| v.as_str())
        .map(|v| (1, v.to_string()))
}

fn is_comment(line: &str) -> bool {
    line.trim_start().starts_with('#')
}

/// BuildKit's continuation check: the line ends with the escape character (then
/// spaces or tabs), not itself escaped; returns the line without it.
fn trim_continuation(line: &str, escape: char) -> (String, bool) {
    let body = line.trim_end_matches([' ', '\t']);
    let Some(before) = body.strip_suffix(escape) else {
        return (line.to_string(), true);
    };
    if before.is_empty() || !before.ends_with(escape) {
        return (before.to_string(), false);
    }
    (line.to_string(), true)
}

/// The Dockerfile's lines, each without its line ending; a carriage return anywhere
/// but before a line feed is refused (BuildKit versions strip one or all of them).
fn lines(text: &str) -> Result<Vec<&str>, ParseError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut out = Vec::new();
    for (i, raw) in text.split_inclusive('\n').enumerate() {
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.contains('\r') {
            return Err(fail(
                i + 1,
                "a carriage return inside a line (BuildKit versions read it differently)",
            ));
        }
        if line.len() > MAX_LINE {
            return Err(fail(
                i + 1,
                format!("dockerfile line greater than max allowed size of {MAX_LINE}"),
            ));
        }
        out.push(line);
    }
    Ok(out)
}

/// Reads a Dockerfile's instructions as BuildKit does, in `dialect`; with them the
/// escape character its directives set. A `syntax` directive is refused: the
/// frontend it names would read the rest.
pub fn parse(text: &str, dialect: Dialect) -> Result<(Vec<Node>, char), ParseError> {
    if let Some((line, image)) = syntax_directive(text) {
        return Err(fail(
            line,
            format!(
                "a `syntax` parser directive asks for the frontend image `{image}`, which would decide every step; cibox builds with the engine's own frontend only: remove the line"
            ),
        ));
    }
    read_nodes(text, dialect)
}

/// [`parse`] without the `syntax` check: BuildKit's parser itself, for its test files.
pub(super) fn read_nodes(text: &str, dialect: Dialect) -> Result<(Vec<Node>, char), ParseError> {
    let lines = lines(text)?;
    let mut d = Directives::new();
    let mut nodes = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let raw = lines[i];
        let first = raw.trim_start();
        d.line(first, i + 1)?;
        i += 1;
        let start = i;
        let body = if is_comment(first) { "" } else { first };
        let (mut line, mut end) = trim_continuation(body, d.escape);
        if end && line.is_empty() {
            continue;
        }
        let mut joins = Vec::new();
        while !end && i < lines.len() {
            let next = lines[i];
            i += 1;
            if is_comment(next) || next.trim_start().is_empty() {
                continue;
            }
            let (piece, e) = trim_continuation(next, d.escape);
            joins.push(line.len());
            line.push_str(&piece);
            end = e;
        }
        let mut node = words::node(&line, d.escape, start)?;
        node.end_line = i;
        check_joins(&node, &line, &joins, start)?;
        if dialect.heredocs && words::can_contain_heredoc(&node) && line.contains("<<") {
            for name in words::heredoc_names(&line, start)? {
                let (content, next) = heredoc_body(&lines, i, &name, start)?;
                node.heredocs.push(Heredoc {
                    name: name.name,
                    content,
                });
                i = next;
            }
            node.end_line = i;
        }
        nodes.push(node);
    }
    if nodes.is_empty() {
        return Err(fail(lines.len(), "file with no instructions"));
    }
    Ok((nodes, d.escape))
}

/// A continuation joined inside the keyword or a flag: cibox refuses what a reader may
/// take for two words (`COPY --fr\` + `om=…`).
fn check_joins(node: &Node, line: &str, joins: &[usize], start: usize) -> Result<(), ParseError> {
    let lead = line.len() - line.trim_start().len();
    let keyword_end = lead + node.keyword.len();
    let flags_end = line.len() - words::after_flags(line, node).len();
    for &at in joins {
        let before = line[..at].chars().next_back();
        let after = line[at..].chars().next();
        let inside_word =
            before.is_some_and(|c| !c.is_whitespace()) && after.is_some_and(|c| !c.is_whitespace());
        if inside_word && at <= keyword_end {
            return Err(fail(
                start,
                format!(
                    "the instruction `{}` is split by a line continuation inside its keyword; write the keyword on one line",
                    node.keyword
                ),
            ));
        }
        if inside_word && at < flags_end {
            return Err(fail(
                start,
                "a flag of this instruction is split by a line continuation; write each flag on one line",
            ));
        }
    }
    Ok(())
}

/// A heredoc's content from line `from` (0-based) to its terminator, and the line after.
fn heredoc_body(
    lines: &[&str],
    from: usize,
    doc: &words::HeredocName,
    start: usize,
) -> Result<(String, usize), ParseError> {
    let mut content = String::new();
    let mut i = from;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let candidate = if doc.chomp {
            line.trim_start_matches('\t')
        } else {
            line
        };
        if candidate == doc.name {
            return Ok((content, i));
        }
        content.push_str(line);
        content.push('\n');
    }
    Err(fail(start, "unterminated heredoc"))
}
