//! Finding `${{ … }}` in workflow text and naming the contexts an expression reads.
//!
//! The parsing itself is `github-actions-expressions` (zizmor's parser); this module only
//! cuts expressions out of the surrounding text and compares context paths.

use github_actions_expressions::{
    Expr, SpannedExpr,
    call::{Call, Function},
    context::Context,
};

/// One `${{ … }}` in a piece of text: where it starts (a byte offset of `${{`), its whole
/// text with the delimiters, and its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Embedded<'a> {
    pub offset: usize,
    pub raw: &'a str,
    pub body: &'a str,
}

/// Every `${{ … }}` in `text`, in order. A `}}` inside a single-quoted string does not end
/// the expression (`''` inside a string toggles twice, so it needs no special case). An
/// unterminated `${{` ends the scan: GitHub refuses such a workflow anyway.
pub fn embedded(text: &str) -> Vec<Embedded<'_>> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(start) = text[from..].find("${{").map(|i| from + i) {
        let body_start = start + 3;
        let bytes = text.as_bytes();
        let mut quoted = false;
        let mut end = None;
        let mut i = body_start;
        while i < bytes.len() {
            match bytes[i] {
                b'\'' => quoted = !quoted,
                b'}' if !quoted && bytes.get(i + 1) == Some(&b'}') => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        let Some(end) = end else { break };
        out.push(Embedded {
            offset: start,
            raw: &text[start..end + 2],
            body: text[body_start..end].trim(),
        });
        from = end + 2;
    }
    out
}

/// The longest expression body we parse. Real conditions are a few hundred bytes; the
/// parser and our walks recurse once per operator, so a long chain of `&&` in a hostile
/// file could otherwise overflow the stack.
pub const MAX_EXPRESSION_BYTES: usize = 4096;

/// Why an expression was not parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unparsed {
    /// Longer than [`MAX_EXPRESSION_BYTES`].
    TooLong,
    /// Not an expression (GitHub refuses the workflow).
    Invalid(String),
}

/// Parses an expression body (without `${{ }}`), refusing very long ones.
pub fn parse(body: &str) -> Result<SpannedExpr<'_>, Unparsed> {
    if body.len() > MAX_EXPRESSION_BYTES {
        return Err(Unparsed::TooLong);
    }
    Expr::parse(body).map_err(|e| Unparsed::Invalid(one_line(&e.to_string())))
}

/// Text on one line, for messages: newlines and runs of spaces folded, at most 200
/// characters.
pub fn one_line(text: &str) -> String {
    let folded = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if folded.chars().count() > 200 {
        format!("{}…", folded.chars().take(200).collect::<String>())
    } else {
        folded
    }
}

/// The body of an `if:` value: GitHub evaluates `if:` as an expression with or without
/// the `${{ }}` around it. `None` when the value holds `${{ }}` and anything else, even a
/// trailing newline (`if: |` block): then it is a non-empty string, always true.
pub fn condition_body(text: &str) -> Option<&str> {
    if !text.contains("${{") {
        return Some(text.trim());
    }
    match embedded(text).as_slice() {
        [only] if only.offset == 0 && only.raw.len() == text.len() => Some(only.body),
        _ => None,
    }
}

/// A context as a lower-case dotted path (`github.event.pull_request.title`), with `*`
/// for a star or a computed index. `None` for a context on a function call's result.
pub fn path(ctx: &Context<'_>) -> Option<String> {
    ctx.as_pattern()
}

/// Whether a context path matches a pattern segment by segment (`*` matches one
/// segment), the path being at least as long as the pattern.
pub fn under(path: &str, pattern: &str) -> bool {
    let mut p = path.split('.');
    for want in pattern.split('.') {
        match p.next() {
            Some(got) if want == "*" || got == "*" || got == want => {}
            _ => return false,
        }
    }
    true
}

/// Whether a path is under the pattern or above it: `toJSON(github.event)` carries every
/// field of the event, the untrusted ones included.
pub fn related(path: &str, pattern: &str) -> bool {
    under(path, pattern) || under(pattern, path)
}

/// All context paths an expression mentions (conditions included).
pub fn all_paths(e: &SpannedExpr<'_>) -> Vec<String> {
    e.contexts()
        .into_iter()
        .filter_map(|(c, _)| path(c))
        .collect()
}

/// The context paths whose value can become the expression's value (not those only
/// compared or tested): what ends up in a script when the expression is inlined. A
/// context on a call's result (`fromJSON(steps.x.outputs.y).z`) carries the contexts of
/// the call.
pub fn value_paths(e: &SpannedExpr<'_>) -> Vec<String> {
    let mut out = Vec::new();
    for (c, _) in e.dataflow_contexts() {
        match path(c) {
            Some(p) => out.push(p),
            None => {
                for part in &c.parts {
                    out.extend(all_paths(part));
                }
            }
        }
    }
    out
}

/// The text an expression makes, as far as literals decide it: literals as they print,
/// contexts as `<path>`, `format()` with a literal pattern filled in, anything else `?`.
/// `format('refs/{0}/{1}/merge', 'pull', github.event.number)` gives
/// `refs/pull/<github.event.number>/merge`.
pub fn shape(e: &SpannedExpr<'_>) -> String {
    match &e.inner {
        Expr::Literal(l) => l.as_str().into_owned(),
        Expr::Context(c) => match path(c) {
            Some(p) => format!("<{p}>"),
            None => "?".into(),
        },
        Expr::Call(Call {
            func: Function::Format,
            args,
        }) => match args.split_first() {
            Some((first, rest)) if matches!(first.inner, Expr::Literal(_)) => {
                let pattern = shape(first);
                let values: Vec<String> = rest.iter().map(shape).collect();
                fill(&pattern, &values)
            }
            _ => "?".into(),
        },
        _ => "?".into(),
    }
}

/// `format()`'s pattern with `{N}` replaced by the Nth value and `{{`, `}}` unescaped.
fn fill(pattern: &str, values: &[String]) -> String {
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
        } else if let Some(end) = tail.find('}')
            && let Ok(n) = tail[1..end].parse::<usize>()
        {
            out.push_str(values.get(n).map(String::as_str).unwrap_or("?"));
            rest = &tail[end + 1..];
        } else {
            out.push_str(&tail[..1]);
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The context path of an expression that is a bare context.
pub fn context_path(e: &Expr<'_>) -> Option<String> {
    match e {
        Expr::Context(c) => path(c),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_expressions_out_of_text() {
        let t = "echo ${{ a.b }} and ${{ format('}}{0}', c) }} ${{ x";
        let found = embedded(t);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].body, "a.b");
        assert_eq!(found[1].body, "format('}}{0}', c)");
        assert_eq!(&t[found[1].offset..found[1].offset + 3], "${{");
    }

    #[test]
    fn conditions_with_and_without_delimiters() {
        assert_eq!(condition_body(" a == b "), Some("a == b"));
        assert_eq!(condition_body("${{ a == b }}"), Some("a == b"));
        assert_eq!(condition_body("${{ a }} && b"), None);
        // A block scalar keeps its newline: a string, always true.
        assert_eq!(condition_body("${{ a == b }}\n"), None);
        assert_eq!(condition_body("${{ a == b }} "), None);
    }

    #[test]
    fn values_through_calls_and_limits() {
        let e = parse("fromJSON(steps.x.outputs.y).z").unwrap();
        assert_eq!(value_paths(&e), vec!["steps.x.outputs.y".to_string()]);
        let e = parse("a == b && c.d").unwrap();
        assert_eq!(value_paths(&e), vec!["c.d".to_string()]);
        let long = vec!["a"; 3000].join(" && ");
        assert_eq!(parse(&long).err(), Some(Unparsed::TooLong));
        assert!(matches!(parse("a &&"), Err(Unparsed::Invalid(_))));
    }

    #[test]
    fn the_shape_of_formatted_text() {
        let s = |e: &str| shape(&parse(e).unwrap());
        assert_eq!(
            s("format('refs/{0}/{1}/merge', 'pull', github.event.number)"),
            "refs/pull/<github.event.number>/merge"
        );
        assert_eq!(s("format('{{0}} {1}', 'a')"), "{0} ?");
        assert_eq!(s("format(github.event.issue.title, 'a')"), "?");
        assert_eq!(s("'refs/pull/1/head'"), "refs/pull/1/head");
        assert_eq!(s("join(a.b, '/')"), "?");
    }

    #[test]
    fn paths_match_by_segment() {
        assert!(under(
            "github.event.pull_request.title",
            "github.event.pull_request.title"
        ));
        assert!(under(
            "github.event.commits.*.message",
            "github.event.commits.*.message"
        ));
        assert!(!under(
            "github.event.pull_request",
            "github.event.pull_request.title"
        ));
        assert!(related("github.event", "github.event.pull_request.title"));
        assert!(!related(
            "github.event_name",
            "github.event.pull_request.title"
        ));
    }
}
