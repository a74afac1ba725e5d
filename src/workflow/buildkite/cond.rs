//! A Buildkite step's `if:` judged by what it can evaluate to in a build of a fork's
//! pull request: `build.pull_request.repository.fork` is `true` there,
//! `build.pull_request.id` is set, and every other value (the branch, the message, the
//! labels, `build.env(…)`) may be anything. The answer is three-valued, and
//! conservative: [`Truth::True`] when the condition holds for every such build,
//! [`Truth::False`] when for none, [`Truth::Maybe`] otherwise, and for anything it
//! cannot read (a syntax it does not know, a regex match, a comparison of values of
//! different kinds, an `!` or a mix of `&&` and `||` whose grouping Buildkite might
//! read otherwise and that would change the answer, a condition over 4096 bytes or
//! nested over 32 deep).
//!
//! The syntax is Buildkite's (docs: *Using conditionals*): `==`, `!=`, `=~`, `!~`,
//! `&&`, `||`, `!`, `includes`, parentheses, `true`, `false`, `null`, numbers,
//! strings in `"` or `'`, regular expressions in `/…/`, arrays, dotted variables and
//! function calls (`build.env("X")`).

/// What a condition evaluates to in every build of a fork's pull request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truth {
    True,
    False,
    Maybe,
}

/// The longest condition read; a longer one is [`Truth::Maybe`].
const MAX_LEN: usize = 4096;
/// The deepest nesting read.
const MAX_DEPTH: usize = 32;

/// What `cond` evaluates to in a build of a fork's pull request.
pub fn in_fork_build(cond: &str) -> Truth {
    if cond.len() > MAX_LEN {
        return Truth::Maybe;
    }
    let Some(tokens) = lex(cond) else {
        return Truth::Maybe;
    };
    let mut p = Parser { tokens, at: 0 };
    match p.expr(0) {
        Some(e) if p.at == p.tokens.len() => e.eval().truth(),
        _ => Truth::Maybe,
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Num(i64),
    Regex,
    Op(&'static str),
    Open(char),
    Close(char),
    Comma,
}

fn lex(text: &str) -> Option<Vec<Token>> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
        match c {
            c if c.is_whitespace() => i += 1,
            '(' | '[' => {
                out.push(Token::Open(c));
                i += 1;
            }
            ')' | ']' => {
                out.push(Token::Close(c));
                i += 1;
            }
            ',' => {
                out.push(Token::Comma);
                i += 1;
            }
            '"' | '\'' | '/' => {
                let mut s = String::new();
                i += 1;
                loop {
                    match chars.get(i)? {
                        '\\' => {
                            s.push(*chars.get(i + 1)?);
                            i += 2;
                        }
                        q if *q == c => break,
                        other => {
                            s.push(*other);
                            i += 1;
                        }
                    }
                }
                i += 1;
                if c == '/' {
                    while chars.get(i).is_some_and(char::is_ascii_alphabetic) {
                        i += 1; // flags
                    }
                    out.push(Token::Regex);
                } else {
                    out.push(Token::Str(s));
                }
            }
            _ if ["&&", "||", "==", "!=", "=~", "!~", "<=", ">="].contains(&two.as_str()) => {
                out.push(Token::Op(
                    ["&&", "||", "==", "!=", "=~", "!~", "<=", ">="]
                        .into_iter()
                        .find(|o| *o == two)?,
                ));
                i += 2;
            }
            '!' | '<' | '>' => {
                out.push(Token::Op(match c {
                    '!' => "!",
                    '<' => "<",
                    _ => ">",
                }));
                i += 1;
            }
            c if c.is_ascii_digit() || c == '-' => {
                let start = i;
                i += 1;
                while chars.get(i).is_some_and(char::is_ascii_digit) {
                    i += 1;
                }
                let n: String = chars[start..i].iter().collect();
                out.push(Token::Num(n.parse().ok()?));
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while chars
                    .get(i)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
                {
                    i += 1;
                }
                out.push(Token::Ident(chars[start..i].iter().collect()));
            }
            _ => return None,
        }
    }
    Some(out)
}

/// A value as far as it is known in every fork's build.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Bool(bool),
    Str(String),
    Num(i64),
    Null,
    /// Any value; `set` when it is known not to be null.
    Unknown {
        set: bool,
    },
}

impl Value {
    fn truth(&self) -> Truth {
        match self {
            Value::Bool(true) => Truth::True,
            Value::Bool(false) => Truth::False,
            _ => Truth::Maybe,
        }
    }

    fn of(t: Truth) -> Value {
        match t {
            Truth::True => Value::Bool(true),
            Truth::False => Value::Bool(false),
            Truth::Maybe => Value::Unknown { set: false },
        }
    }

    /// A variable's value in a build of a fork's pull request.
    fn variable(name: &str) -> Value {
        match name {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "null" => Value::Null,
            "build.pull_request.repository.fork" => Value::Bool(true),
            "build.pull_request.id" => Value::Unknown { set: true },
            _ => Value::Unknown { set: false },
        }
    }

    /// Whether the two are equal, where that is known.
    fn equals(&self, other: &Value) -> Truth {
        use Value::*;
        let known = |same: bool| if same { Truth::True } else { Truth::False };
        match (self, other) {
            (Bool(a), Bool(b)) => known(a == b),
            (Str(a), Str(b)) => known(a == b),
            (Num(a), Num(b)) => known(a == b),
            (Null, Null) => Truth::True,
            // Null is equal to nothing else, whatever the evaluator.
            (Null, Bool(_) | Str(_) | Num(_) | Unknown { set: true })
            | (Bool(_) | Str(_) | Num(_) | Unknown { set: true }, Null) => Truth::False,
            _ => Truth::Maybe,
        }
    }
}

fn not(t: Truth) -> Truth {
    match t {
        Truth::True => Truth::False,
        Truth::False => Truth::True,
        Truth::Maybe => Truth::Maybe,
    }
}

fn and(a: Truth, b: Truth) -> Truth {
    match (a, b) {
        (Truth::False, _) | (_, Truth::False) => Truth::False,
        (Truth::True, Truth::True) => Truth::True,
        _ => Truth::Maybe,
    }
}

fn or(a: Truth, b: Truth) -> Truth {
    not(and(not(a), not(b)))
}

/// The same answer both ways, or [`Truth::Maybe`].
fn agree(a: Truth, b: Truth) -> Truth {
    if a == b { a } else { Truth::Maybe }
}

/// A condition, parsed.
enum Expr {
    Value(Value),
    Not(Box<Expr>),
    /// `left OP right`.
    Compare(&'static str, Box<Expr>, Box<Expr>),
    /// Operands joined by `&&` (true) and `||` (false), no parentheses among them.
    Logic(Vec<Expr>, Vec<bool>),
}

impl Expr {
    fn eval(&self) -> Value {
        match self {
            Expr::Value(v) => v.clone(),
            Expr::Not(e) => Value::of(not(e.eval().truth())),
            Expr::Compare(op, left, right) => {
                let (l, r) = (left.eval(), right.eval());
                match *op {
                    "==" => Value::of(l.equals(&r)),
                    "!=" => Value::of(not(l.equals(&r))),
                    _ => Value::Unknown { set: false },
                }
            }
            Expr::Logic(operands, ands) => {
                let truths: Vec<Truth> = operands.iter().map(|e| e.eval().truth()).collect();
                Value::of(agree(
                    precedence(&truths, ands),
                    left_to_right(&truths, ands),
                ))
            }
        }
    }
}

/// `&&` binding tighter: the `||` of the runs of `&&`.
fn precedence(truths: &[Truth], ands: &[bool]) -> Truth {
    let (mut sum, mut run) = (Truth::False, truths[0]);
    for (is_and, t) in ands.iter().zip(&truths[1..]) {
        if *is_and {
            run = and(run, *t);
        } else {
            sum = or(sum, run);
            run = *t;
        }
    }
    or(sum, run)
}

/// Each operator in turn, left to right.
fn left_to_right(truths: &[Truth], ands: &[bool]) -> Truth {
    let mut acc = truths[0];
    for (is_and, t) in ands.iter().zip(&truths[1..]) {
        acc = if *is_and { and(acc, *t) } else { or(acc, *t) };
    }
    acc
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn eat(&mut self, t: &Token) -> bool {
        let hit = self.peek() == Some(t);
        if hit {
            self.at += 1;
        }
        hit
    }

    /// Operands joined by `&&` and `||`.
    fn expr(&mut self, depth: usize) -> Option<Expr> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut operands = vec![self.unary(depth + 1)?];
        let mut ands = Vec::new();
        while let Some(Token::Op(op @ ("&&" | "||"))) = self.peek() {
            ands.push(*op == "&&");
            self.at += 1;
            operands.push(self.unary(depth + 1)?);
        }
        Some(if ands.is_empty() {
            operands.pop()?
        } else {
            Expr::Logic(operands, ands)
        })
    }

    /// `!X`, or a comparison. `!a == b` could be read as `(!a) == b` or `!(a == b)`: not
    /// read at all.
    fn unary(&mut self, depth: usize) -> Option<Expr> {
        if depth > MAX_DEPTH {
            return None;
        }
        if self.eat(&Token::Op("!")) {
            let operand = self.negated(depth + 1)?;
            return match self.comparison_op() {
                Some(_) => None,
                None => Some(Expr::Not(Box::new(operand))),
            };
        }
        let left = self.primary(depth + 1)?;
        match self.comparison_op() {
            None => Some(left),
            Some(op) => {
                self.at += 1;
                let right = self.primary(depth + 1)?;
                if self.comparison_op().is_some() {
                    return None; // `a == b == c`
                }
                Some(Expr::Compare(op, Box::new(left), Box::new(right)))
            }
        }
    }

    /// What a `!` applies to: a primary, or another `!` and its own.
    fn negated(&mut self, depth: usize) -> Option<Expr> {
        if depth > MAX_DEPTH {
            return None;
        }
        if self.eat(&Token::Op("!")) {
            return Some(Expr::Not(Box::new(self.negated(depth + 1)?)));
        }
        self.primary(depth + 1)
    }

    /// The comparison operator next, if one is.
    fn comparison_op(&self) -> Option<&'static str> {
        match self.peek()? {
            Token::Op(op @ ("==" | "!=" | "=~" | "!~" | "<" | ">" | "<=" | ">=")) => Some(op),
            Token::Ident(w) if w == "includes" => Some("includes"),
            _ => None,
        }
    }

    fn primary(&mut self, depth: usize) -> Option<Expr> {
        if depth > MAX_DEPTH {
            return None;
        }
        let token = self.peek()?.clone();
        self.at += 1;
        let value = match token {
            Token::Open('(') => {
                let inner = self.expr(depth + 1)?;
                return self.eat(&Token::Close(')')).then_some(inner);
            }
            Token::Open(_) => {
                self.list(']', depth)?;
                Value::Unknown { set: true }
            }
            Token::Str(s) => Value::Str(s),
            Token::Num(n) => Value::Num(n),
            Token::Regex => Value::Unknown { set: true },
            Token::Ident(_) if self.eat(&Token::Open('(')) => {
                // A function (`build.env("X")`): any value.
                self.list(')', depth)?;
                Value::Unknown { set: false }
            }
            Token::Ident(name) => Value::variable(&name),
            _ => return None,
        };
        Some(Expr::Value(value))
    }

    /// Expressions separated by commas, up to `close` (the opening one eaten).
    fn list(&mut self, close: char, depth: usize) -> Option<()> {
        if self.eat(&Token::Close(close)) {
            return Some(());
        }
        loop {
            self.expr(depth + 1)?;
            if self.eat(&Token::Close(close)) {
                return Some(());
            }
            if !self.eat(&Token::Comma) {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Truth::{self, *};

    fn judge(cond: &str) -> Truth {
        super::in_fork_build(cond)
    }

    #[test]
    fn a_condition_is_judged_by_what_it_can_be_in_a_forks_build() {
        const F: &str = "build.pull_request.repository.fork";
        for (cond, want) in [
            (format!("{F} == false"), False),
            (format!("{F} != true"), False),
            (format!("!{F}"), False),
            (format!("false == {F}"), False),
            (F.to_string(), True),
            (format!("{F} == true"), True),
            // The attack's: null is never what a fork's build has; nor is a branch
            // "never" known not to be the build's.
            (format!("{F} == null"), False),
            (format!("{F} != null"), True),
            (format!("{F} && build.branch == \"never\""), Maybe),
            (format!("{F} == false && build.branch != \"x\""), False),
            (format!("{F} == false || build.branch == \"x\""), Maybe),
            (format!("({F} || build.branch == 'x') && {F}"), True),
            (format!("{F} || build.message =~ /skip/i"), True),
            ("build.pull_request.id == null".to_string(), False),
            (format!("build.pull_request.id != null && {F}"), True),
            ("build.env(\"FORK\") == \"1\"".to_string(), Maybe),
            (
                "build.pull_request.labels includes \"ok\"".to_string(),
                Maybe,
            ),
            ("true".to_string(), True),
            // A mix of `&&` and `||` read both ways: here the groupings agree…
            (
                format!("{F} == false && build.branch == 'a' || {F} == false"),
                False,
            ),
            // …and here they do not: `(T || M) && F` is false, `T || (M && F)` true.
            (format!("{F} || build.branch == 'a' && {F} == false"), Maybe),
            // What cannot be read may run.
            (format!("!{F} == true"), Maybe),
            (format!("{F} == false &&"), Maybe),
            (format!("{F} === false"), Maybe),
            (format!("{F} == \"false\""), Maybe),
            ("(".repeat(100) + "true" + &")".repeat(100), Maybe),
            ("x".repeat(5000), Maybe),
        ] {
            assert_eq!(judge(&cond), want, "{cond}");
        }
    }
}
