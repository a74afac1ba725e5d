//! A word with its variables put in, its quotes and escapes removed, as BuildKit's
//! shell lexer (`frontend/dockerfile/shell/lex.go`) reads the words that name images
//! (`FROM`, `--platform`, the defaults of `ARG`s before the first `FROM`).
//!
//! Only what every BuildKit version reads alike: `$NAME`, `${NAME}`, and the `:-`,
//! `:+` and `:?` forms (BuildKit 0.8 reads `${X-w}` and `${X+w}` as nothing). Pattern
//! forms (`${NAME%x}`, `${NAME#x}`, `${NAME/x/y}`), positional and special parameters
//! (`$1`, `$@`) came in later versions and are refused.

use std::collections::HashMap;

/// Reads `word` as BuildKit does, with `vars` set and `escape` the escape character.
pub fn process_word(
    word: &str,
    vars: &HashMap<String, String>,
    escape: char,
) -> Result<String, String> {
    let chars: Vec<char> = word.chars().collect();
    let mut lexer = Lexer {
        chars: &chars,
        pos: 0,
        vars,
        escape,
        depth: 0,
    };
    lexer.until(None)
}

/// A heredoc's name without its quotes and escapes (nothing put in).
pub fn unquote_word(word: &str) -> Result<String, String> {
    let empty = HashMap::new();
    let chars: Vec<char> = word.chars().collect();
    if chars.contains(&'$') {
        return Err("a heredoc name with `$` is not read alike by every BuildKit".into());
    }
    let mut lexer = Lexer {
        chars: &chars,
        pos: 0,
        vars: &empty,
        escape: '\\',
        depth: 0,
    };
    lexer.until(None)
}

struct Lexer<'a> {
    chars: &'a [char],
    pos: usize,
    vars: &'a HashMap<String, String>,
    escape: char,
    /// How many `${…}` hold the one being read.
    depth: usize,
}

/// The deepest `${…}` read inside another: a line of 64 KiB could nest thousands.
const MAX_DEPTH: usize = 32;

impl Lexer<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek();
        self.pos += usize::from(c.is_some());
        c
    }

    /// Up to `stop` (consumed), or the end where `stop` is `None`.
    fn until(&mut self, stop: Option<char>) -> Result<String, String> {
        let mut out = String::new();
        while let Some(c) = self.peek() {
            if Some(c) == stop {
                self.next();
                return Ok(out);
            }
            match c {
                '$' => out.push_str(&self.dollar()?),
                '\'' => out.push_str(&self.single_quote()?),
                '"' => out.push_str(&self.double_quote()?),
                _ => {
                    self.next();
                    if c == self.escape {
                        match self.next() {
                            Some(n) => out.push(n),
                            None => break,
                        }
                    } else {
                        out.push(c);
                    }
                }
            }
        }
        match stop {
            Some(s) => Err(format!(
                "unexpected end of statement while looking for matching {s}"
            )),
            None => Ok(out),
        }
    }

    fn single_quote(&mut self) -> Result<String, String> {
        self.next();
        let mut out = String::new();
        loop {
            match self.next() {
                None => {
                    return Err(
                        "unexpected end of statement while looking for matching single-quote"
                            .into(),
                    );
                }
                Some('\'') => return Ok(out),
                Some(c) => out.push(c),
            }
        }
    }

    fn double_quote(&mut self) -> Result<String, String> {
        self.next();
        let mut out = String::new();
        loop {
            match self.peek() {
                None => {
                    return Err(
                        "unexpected end of statement while looking for matching double-quote"
                            .into(),
                    );
                }
                Some('"') => {
                    self.next();
                    return Ok(out);
                }
                Some('$') => out.push_str(&self.dollar()?),
                Some(c) => {
                    self.next();
                    if c == self.escape {
                        match self.peek() {
                            None => continue,
                            Some(n) if n == '"' || n == '$' || n == self.escape => {
                                self.next();
                                out.push(n);
                                continue;
                            }
                            Some(_) => {}
                        }
                    }
                    out.push(c);
                }
            }
        }
    }

    /// A name: ASCII letters, digits and `_`; what else BuildKit versions read as a name
    /// (digits first, special parameters, letters beyond ASCII) is refused.
    fn name(&mut self) -> Result<String, String> {
        let mut name = String::new();
        while let Some(c) = self.peek() {
            if name.is_empty() && (c.is_ascii_digit() || "@*#?-$!".contains(c)) {
                return Err(format!(
                    "`${c}` (a positional or special parameter) is not read alike by every BuildKit"
                ));
            }
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                self.next();
            } else if c.is_alphanumeric() {
                return Err(format!(
                    "a variable name with `{c}` (not ASCII) is not read alike by every BuildKit"
                ));
            } else {
                break;
            }
        }
        Ok(name)
    }

    fn dollar(&mut self) -> Result<String, String> {
        self.next();
        if self.peek() != Some('{') {
            let name = self.name()?;
            if name.is_empty() {
                return Ok("$".into());
            }
            return Ok(self.vars.get(&name).cloned().unwrap_or_default());
        }
        self.next();
        match self.peek() {
            None => return Err("syntax error: missing '}'".into()),
            Some('{' | '}' | ':') => return Err("syntax error: bad substitution".into()),
            _ => {}
        }
        let name = self.name()?;
        let mut op = String::new();
        let Some(c) = self.next() else {
            return Err("syntax error: missing '}'".into());
        };
        if c == '}' {
            return Ok(self.vars.get(&name).cloned().unwrap_or_default());
        }
        op.push(c);
        if c == ':' {
            op.extend(self.next());
        }
        let kind = op.trim_start_matches(':');
        if !op.starts_with(':') || !["-", "+", "?"].contains(&kind) {
            return Err(format!(
                "`${{{name}{op}…}}`: this substitution is not read alike by every BuildKit (only :-, :+ and :?; BuildKit 0.8 reads `${{X-w}}` and `${{X+w}}` as empty)"
            ));
        }
        if self.depth >= MAX_DEPTH {
            return Err(format!("`${{…}}` nested more than {MAX_DEPTH} deep"));
        }
        self.depth += 1;
        let word = self.until(Some('}'));
        self.depth -= 1;
        let word = word?;
        let value = self.vars.get(&name);
        let null_unset = op.starts_with(':');
        let unset = value.is_none() || (null_unset && value.is_some_and(|v| v.is_empty()));
        Ok(match kind {
            "-" if unset => word,
            "-" => value.cloned().unwrap_or_default(),
            "+" if unset => String::new(),
            "+" => word,
            _ if unset => {
                return Err(format!(
                    "{name}: {}",
                    if word.is_empty() {
                        "is not allowed to be unset or empty".to_string()
                    } else {
                        word
                    }
                ));
            }
            _ => value.cloned().unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(w: &str) -> Result<String, String> {
        let vars: HashMap<String, String> = [("A", "a"), ("E", ""), ("SP", "x y")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        process_word(w, &vars, '\\')
    }

    #[test]
    fn words_read_as_buildkit_reads_them() {
        for (w, want) in [
            ("${A:-x}", "a"),
            ("${B:-x}", "x"),
            ("${E:-x}", "x"),
            ("${A:+y}", "y"),
            ("${B:+y}", ""),
            ("r/$A/$B/\\$A", "r/a//$A"),
            ("${B:-${A}z}", "az"),
            ("\"evil\":1", "evil:1"),
            ("'$A'", "$A"),
            ("\"$A\\\"\"", "a\""),
            ("a\\:b", "a:b"),
            ("$", "$"),
            ("x$", "x$"),
            ("\"a\\b\"", "a\\b"),
        ] {
            assert_eq!(word(w).as_deref(), Ok(want), "{w}");
        }
    }

    #[test]
    fn what_versions_read_differently_is_refused() {
        for w in [
            "${A%a}", "${A#a}", "${A/a/b}", "$1", "$@", "${A:=x}", "$Ä", "${", "${}", "\"a", "'a",
        ] {
            assert!(word(w).is_err(), "{w}");
        }
        assert!(word("${B:?must}").unwrap_err().contains("must"));
        // Nesting is bounded: a 64 KiB line of `${A:-` would recurse thousands deep.
        let deep = format!("{}x{}", "${B:-".repeat(10_000), "}".repeat(10_000));
        assert!(word(&deep).unwrap_err().contains("nested"));
        let ok = format!("{}x{}", "${B:-".repeat(8), "}".repeat(8));
        assert_eq!(word(&ok).as_deref(), Ok("x"));
    }
}
