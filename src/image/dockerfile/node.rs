//! What the parser makes: an instruction ([`Node`]) with its flags and arguments
//! ([`Args`], as BuildKit's parser dumps them in its test files), and the error of a
//! Dockerfile that is not read ([`ParseError`]).

/// A Dockerfile cibox does not read as the builder would, or that the builder refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {why}")]
pub struct ParseError {
    pub line: usize,
    pub why: String,
}

pub fn fail(line: usize, why: impl Into<String>) -> ParseError {
    ParseError {
        line,
        why: why.into(),
    }
}

/// A heredoc's body (`RUN <<EOF`…`EOF`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heredoc {
    pub name: String,
    pub content: String,
}

/// One instruction, as the parser reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The keyword as written (`from`, `RUN`).
    pub keyword: String,
    /// The flags before the arguments (`--from=x`), their quotes and escapes removed.
    pub flags: Vec<String>,
    pub args: Args,
    /// The whole instruction, continuations joined.
    pub original: String,
    /// The lines it starts and ends on (1-based).
    pub line: usize,
    pub end_line: usize,
    pub heredocs: Vec<Heredoc>,
}

impl Node {
    /// The keyword, upper case.
    pub fn command(&self) -> String {
        self.keyword.to_ascii_uppercase()
    }

    /// BuildKit's dump of the node (`(copy ["--from=a"] "x" "y")`), as its parser
    /// tests compare.
    #[cfg(test)]
    pub fn dump(&self) -> String {
        let mut s = self.keyword.to_lowercase();
        if !self.flags.is_empty() {
            s.push_str(" [");
            let quoted: Vec<String> = self.flags.iter().map(|f| go_quote(f)).collect();
            s.push_str(&quoted.join(" "));
            s.push(']');
        }
        s.push_str(&self.args.dump());
        s.trim().to_string()
    }
}

/// Go's `strconv.Quote`.
pub fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An instruction's arguments, by the rule its keyword reads them with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Args {
    None,
    /// Words or a JSON array's strings (`json`).
    List {
        items: Vec<String>,
        json: bool,
    },
    /// The rest of the line as one string (`RUN` in shell form, `USER`, …).
    Single(String),
    /// `ENV`, `LABEL`: key, value and the separator (`=`, or empty in `KEY value`).
    Pairs(Vec<(String, String, String)>),
    /// `HEALTHCHECK`: its type, then its command.
    Health(String, Box<Args>),
    /// `ONBUILD`: the instruction it holds.
    Sub(Box<Node>),
}

impl Args {
    #[cfg(test)]
    pub fn dump(&self) -> String {
        let mut s = String::new();
        match self {
            Args::None => {}
            Args::List { items, .. } => {
                for i in items {
                    s.push(' ');
                    s.push_str(&go_quote(i));
                }
            }
            Args::Single(v) => {
                s.push(' ');
                s.push_str(&go_quote(v));
            }
            Args::Pairs(pairs) => {
                for (k, v, sep) in pairs {
                    for x in [k, v, sep] {
                        s.push(' ');
                        s.push_str(&go_quote(x));
                    }
                }
            }
            Args::Health(kind, cmd) => {
                s.push(' ');
                s.push_str(&go_quote(kind));
                s.push_str(&cmd.dump());
            }
            Args::Sub(node) => {
                s.push_str(" (");
                s.push_str(&node.dump());
                s.push(')');
            }
        }
        s
    }

    /// The words or strings, where the rule gave a list.
    pub fn items(&self) -> &[String] {
        match self {
            Args::List { items, .. } => items,
            _ => &[],
        }
    }

    pub fn is_json(&self) -> bool {
        matches!(self, Args::List { json: true, .. })
    }
}
