//! An instruction's line into its keyword, flags and arguments, as BuildKit's
//! `split_command.go` and `line_parsers.go` read it: flags are taken from the front
//! with their quotes and escapes removed; the arguments are read by the keyword's own
//! rule (JSON or words, `NAME=value` pairs, a string).

use super::node::{Args, Node, ParseError, fail, go_quote};

/// Go's `unicode.IsSpace` for one byte read as a rune, as `extractBuilderFlags` does.
fn byte_is_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ' | 0x85 | 0xa0)
}

/// `[\t\v\f\r ]`, BuildKit's white space between words.
fn is_ws(c: char) -> bool {
    matches!(c, '\t' | '\x0b' | '\x0c' | '\r' | ' ')
}

/// Splits at runs of [`is_ws`], as Go's `regexp.Split` of `[\t\v\f\r ]+` does.
fn ws_split(s: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    while out.len() + 1 < n {
        let Some(start) = rest.find(is_ws) else {
            break;
        };
        let end = rest[start..]
            .find(|c| !is_ws(c))
            .map_or(rest.len(), |e| start + e);
        out.push(rest[..start].to_string());
        rest = &rest[end..];
    }
    out.push(rest.to_string());
    out
}

/// The instruction on `line` (continuations joined), starting on line `at`.
pub(super) fn node(line: &str, escape: char, at: usize) -> Result<Node, ParseError> {
    let (keyword, flags, args) = split_command(line, escape, at)?;
    let args = dispatch(&keyword, &args, escape, at)?;
    Ok(Node {
        keyword,
        flags,
        args,
        original: line.to_string(),
        line: at,
        end_line: at,
        heredocs: Vec::new(),
    })
}

/// The keyword, the flags and the rest (trimmed), as `splitCommand` splits them.
fn split_command(
    line: &str,
    escape: char,
    at: usize,
) -> Result<(String, Vec<String>, String), ParseError> {
    let parts = ws_split(line.trim(), 2);
    let keyword = parts[0].clone();
    let Some(rest) = parts.get(1) else {
        return Ok((keyword, Vec::new(), String::new()));
    };
    let (args, flags) = extract_flags(rest, escape, at)?;
    Ok((keyword, flags, args.trim().to_string()))
}

/// What of `line` follows the keyword and its flags.
pub(super) fn after_flags<'a>(line: &'a str, node: &Node) -> &'a str {
    let trimmed = line.trim_start();
    let rest = &trimmed[node.keyword.len().min(trimmed.len())..];
    let mut pos = 0;
    let bytes = rest.as_bytes();
    loop {
        while pos < bytes.len() && byte_is_space(bytes[pos]) {
            pos += 1;
        }
        if !(bytes.len() > pos + 1 && bytes[pos] == b'-' && bytes[pos + 1] == b'-') {
            return &rest[pos..];
        }
        let mut quote = None;
        while pos < bytes.len() {
            let b = bytes[pos];
            match quote {
                None if byte_is_space(b) => break,
                None if b == b'"' || b == b'\'' => quote = Some(b),
                Some(q) if b == q => quote = None,
                _ => {}
            }
            pos += 1;
        }
    }
}

/// `extractBuilderFlags`: the words at the front that start with `--`, their quotes
/// and escapes removed, and the rest. A flag with a quote, or a byte that is not
/// ASCII, is refused: BuildKit reads it byte by byte, and a reader may not.
fn extract_flags(line: &str, escape: char, at: usize) -> Result<(String, Vec<String>), ParseError> {
    let b = line.as_bytes();
    let esc = escape as u8;
    let mut words = Vec::new();
    let mut pos = 0;
    loop {
        while pos < b.len() && byte_is_space(b[pos]) {
            pos += 1;
        }
        if pos == b.len() {
            return Ok((String::new(), words));
        }
        if !(b[pos] == b'-' && pos + 1 < b.len() && b[pos + 1] == b'-') {
            return Ok((line[pos..].to_string(), words));
        }
        let start = pos;
        let mut word = Vec::new();
        let mut quote: Option<u8> = None;
        while pos < b.len() {
            let c = b[pos];
            if quote.is_none() && byte_is_space(c) {
                break;
            }
            pos += 1;
            if !c.is_ascii() {
                return Err(fail(
                    at,
                    "a flag holds a character that is not ASCII; BuildKit reads flags byte by byte",
                ));
            }
            match quote {
                None if c == b'\'' || c == b'"' => quote = Some(c),
                Some(q) if c == q => quote = None,
                _ if c == esc => {
                    if pos < b.len() {
                        word.push(b[pos]);
                        pos += 1;
                    }
                }
                _ => word.push(c),
            }
        }
        let raw = &line[start..pos];
        if escape != '\\' && raw.contains(['\\', '`']) {
            return Err(fail(
                at,
                format!(
                    "the flag `{raw}` holds an escape character: BuildKit 0.8 reads flags with `\\` as their escape whatever the escape directive says, later versions with the directive's; write it without"
                ),
            ));
        }
        if raw.contains(['"', '\'']) {
            return Err(fail(
                at,
                format!(
                    "a quote inside the flag `{raw}`: cibox reads flags only as written plainly; write it without quotes"
                ),
            ));
        }
        let word = String::from_utf8(word).unwrap_or_default();
        if word == "--" {
            return Ok((line[pos..].to_string(), words));
        }
        if !word.is_empty() {
            words.push(word);
        }
    }
}

/// The arguments of `keyword`, by its rule.
fn dispatch(keyword: &str, rest: &str, escape: char, at: usize) -> Result<Args, ParseError> {
    let kw = keyword.to_ascii_lowercase();
    match kw.as_str() {
        "add" | "copy" | "volume" => maybe_json_list(rest, at),
        "arg" => Ok(if rest.is_empty() {
            Args::None
        } else {
            Args::List {
                items: parse_words(rest, escape),
                json: false,
            }
        }),
        "cmd" | "entrypoint" | "run" | "shell" => maybe_json(rest, at),
        "env" | "label" => name_val(rest, &kw, escape, at),
        "expose" | "from" => Ok(whitespace_list(rest)),
        "healthcheck" => health(rest, at),
        "maintainer" | "stopsignal" | "user" | "workdir" => Ok(if rest.is_empty() {
            Args::None
        } else {
            Args::Single(rest.to_string())
        }),
        "onbuild" => {
            if rest.is_empty() {
                return Ok(Args::None);
            }
            if ws_split(rest, 2)[0].eq_ignore_ascii_case("onbuild") {
                // BuildKit refuses it too; read no deeper (a line of them is deep).
                return Err(fail(
                    at,
                    "Chaining ONBUILD via `ONBUILD ONBUILD` isn't allowed",
                ));
            }
            Ok(Args::Sub(Box::new(node(rest, escape, at)?)))
        }
        _ => Ok(Args::None),
    }
}

fn whitespace_list(rest: &str) -> Args {
    if rest.is_empty() {
        return Args::None;
    }
    Args::List {
        items: ws_split(rest, usize::MAX),
        json: false,
    }
}

/// A JSON array of strings, `None` when `rest` is not one; an array holding anything
/// else is an error, as BuildKit's.
fn json(rest: &str, at: usize) -> Result<Option<Vec<String>>, ParseError> {
    let rest = rest.trim_start();
    if !rest.starts_with('[') {
        return Ok(None);
    }
    let Ok(values) = serde_json::from_str::<Vec<serde_json::Value>>(rest) else {
        return Ok(None);
    };
    values
        .into_iter()
        .map(|v| match v {
            serde_json::Value::String(s) => Ok(s),
            _ => Err(fail(
                at,
                "when using JSON array syntax, arrays must be comprised of strings only",
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn maybe_json(rest: &str, at: usize) -> Result<Args, ParseError> {
    if rest.is_empty() {
        return Ok(Args::None);
    }
    Ok(match json(rest, at)? {
        Some(items) => Args::List { items, json: true },
        None => Args::Single(rest.to_string()),
    })
}

fn maybe_json_list(rest: &str, at: usize) -> Result<Args, ParseError> {
    Ok(match json(rest, at)? {
        Some(items) => Args::List { items, json: true },
        None => whitespace_list(rest),
    })
}

fn health(rest: &str, at: usize) -> Result<Args, ParseError> {
    let sep = rest
        .find(|c: char| c.is_ascii_whitespace())
        .unwrap_or(rest.len());
    if sep == 0 {
        return Ok(Args::None);
    }
    let next = rest[sep..].trim_start_matches(|c: char| c.is_ascii_whitespace());
    Ok(Args::Health(
        rest[..sep].to_string(),
        Box::new(maybe_json(next, at)?),
    ))
}

/// `parseNameVal`: `KEY value` (old) or `KEY=value …`.
fn name_val(rest: &str, kw: &str, escape: char, at: usize) -> Result<Args, ParseError> {
    let words = parse_words(rest, escape);
    if words.is_empty() {
        return Ok(Args::None);
    }
    if !words[0].contains('=') {
        let parts = ws_split(rest, 2);
        if parts.len() < 2 {
            return Err(fail(
                at,
                format!("{} must have two arguments", kw.to_ascii_uppercase()),
            ));
        }
        return Ok(Args::Pairs(vec![(
            parts[0].clone(),
            parts[1].clone(),
            String::new(),
        )]));
    }
    let mut pairs = Vec::new();
    for w in words {
        let Some((k, v)) = w.split_once('=') else {
            return Err(fail(
                at,
                format!(
                    "Syntax error - can't find = in {}. Must be of the form: name=value",
                    go_quote(&w)
                ),
            ));
        };
        pairs.push((k.to_string(), v.to_string(), "=".to_string()));
    }
    Ok(Args::Pairs(pairs))
}

/// `parseWords`: words split at white space outside quotes, the quotes and escapes
/// kept (they are removed when a word is expanded).
pub fn parse_words(rest: &str, escape: char) -> Vec<String> {
    #[derive(PartialEq)]
    enum Phase {
        Spaces,
        Word,
        Quote(char),
    }
    let mut words = Vec::new();
    let mut phase = Phase::Spaces;
    let mut blank_ok = false;
    let mut word = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(ch) = chars.next() {
        if phase == Phase::Spaces {
            if ch.is_whitespace() {
                continue;
            }
            phase = Phase::Word;
        }
        match phase {
            Phase::Word => {
                if ch.is_whitespace() {
                    phase = Phase::Spaces;
                    if blank_ok || !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                    blank_ok = false;
                    continue;
                }
                if ch == '\'' || ch == '"' {
                    phase = Phase::Quote(ch);
                    blank_ok = true;
                }
                if ch == escape {
                    let Some(next) = chars.next() else {
                        continue;
                    };
                    word.push(ch);
                    word.push(next);
                    continue;
                }
                word.push(ch);
            }
            Phase::Quote(q) => {
                if ch == q {
                    phase = Phase::Word;
                }
                if ch == escape && q != '\'' {
                    let Some(next) = chars.next() else {
                        phase = Phase::Word;
                        continue;
                    };
                    word.push(ch);
                    word.push(next);
                    continue;
                }
                word.push(ch);
            }
            Phase::Spaces => unreachable!("left above"),
        }
    }
    if phase != Phase::Spaces && (blank_ok || !word.is_empty()) {
        words.push(word);
    }
    words
}

/// Whether the instruction may carry heredocs (`RUN`, `COPY`, `ADD`, also under
/// `ONBUILD`; not in JSON form).
pub(super) fn can_contain_heredoc(node: &Node) -> bool {
    let inner = match &node.args {
        Args::Sub(sub) if node.keyword.eq_ignore_ascii_case("onbuild") => sub.as_ref(),
        _ => node,
    };
    ["run", "copy", "add"].contains(&inner.keyword.to_ascii_lowercase().as_str())
        && !inner.args.is_json()
}

/// A heredoc an instruction names (`<<EOF`, `<<-"EOF"`).
pub(super) struct HeredocName {
    pub name: String,
    pub chomp: bool,
}

/// The heredocs a line names, as `heredocsFromLine` finds them: its shell words (quotes
/// and escapes kept, `<<` and the blanks after it one word with what follows), each
/// read by `^(\d*)<<(-?)\s*([^<]*)$`.
pub(super) fn heredoc_names(line: &str, at: usize) -> Result<Vec<HeredocName>, ParseError> {
    let mut docs = Vec::new();
    for word in shell_words_raw(line) {
        let digits = word.len() - word.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let Some(rest) = word[digits..].strip_prefix("<<") else {
            continue;
        };
        let (chomp, rest) = match rest.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let rest = rest.trim_start();
        if rest.is_empty() || rest.contains('<') {
            continue;
        }
        let name = super::lex::unquote_word(rest)
            .map_err(|why| fail(at, format!("heredoc `{rest}`: {why}")))?;
        if name.is_empty() {
            continue;
        }
        docs.push(HeredocName { name, chomp });
    }
    Ok(docs)
}

/// Shell words with quotes and escapes kept; `<<` takes the blanks after it.
fn shell_words_raw(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                word.push(c);
                if c == q {
                    quote = None;
                } else if c == '\\' && q == '"' {
                    word.extend(chars.next());
                }
            }
            None if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            None => {
                word.push(c);
                if c == '"' || c == '\'' {
                    quote = Some(c);
                } else if c == '\\' {
                    word.extend(chars.next());
                } else if c == '<' && chars.peek() == Some(&'<') {
                    word.push(chars.next().unwrap_or('<'));
                    while chars.peek().is_some_and(|c| c.is_whitespace()) {
                        word.push(chars.next().unwrap_or(' '));
                    }
                }
            }
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}
