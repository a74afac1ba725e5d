//! A small YAML document tree that keeps the position of every node.
//!
//! serde_yaml is archived; we parse with `saphyr-parser` (the maintained successor of
//! yaml-rust, pure Rust, actively released) and build our own tree from its events so
//! that every error can name a line and column, duplicate keys are refused (YAML says
//! they are errors; most loaders silently keep the last one), and typed structs are
//! filled through serde from a `serde_json::Value` view of the tree.

use std::collections::HashMap;
use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle};
use serde_json::Value;

/// A position in the source text: 1-based line and column, as editors show them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mark {
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

#[derive(Debug, Clone)]
pub enum NodeValue {
    /// A scalar with its text; `plain` is false for quoted and block scalars, which are
    /// always strings (YAML core schema).
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    /// Entries in source order.
    Map(Vec<(Node, Node)>),
}

#[derive(Debug, Clone)]
pub struct Node {
    pub value: NodeValue,
    pub mark: Mark,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{mark}: {message}")]
pub struct YamlError {
    pub mark: Mark,
    pub message: String,
}

fn mark_of(m: &saphyr_parser::Marker) -> Mark {
    Mark {
        line: m.line(),
        col: m.col() + 1,
    }
}

/// The most nodes a document may have once its aliases are expanded. A manifest of a
/// hundred batches has a few thousand; nested aliases can otherwise make a 500-byte
/// file expand to gigabytes ("billion laughs").
pub const MAX_NODES: usize = 100_000;
/// The deepest a document may nest (a manifest needs five or six levels); deeper trees
/// would also cost stack in every recursive walk.
pub const MAX_DEPTH: usize = 64;
/// The most text (scalar bytes) a document may hold once its aliases are expanded: an
/// alias of a long string would otherwise copy it again and again.
pub const MAX_TEXT_BYTES: usize = 16 << 20;

/// What a node weighs once its aliases are expanded: values, and bytes of text.
#[derive(Debug, Clone, Copy, Default)]
struct Weight {
    nodes: usize,
    bytes: usize,
}

impl Weight {
    fn add(&mut self, other: Weight) {
        self.nodes += other.nodes;
        self.bytes += other.bytes;
    }

    fn too_big(self) -> bool {
        self.nodes > MAX_NODES || self.bytes > MAX_TEXT_BYTES
    }
}

/// A collection's own node: one value, no text.
const ONE: Weight = Weight { nodes: 1, bytes: 0 };

/// A collection still open: what it holds so far.
enum Frame {
    Seq {
        mark: Mark,
        anchor: usize,
        items: Vec<Node>,
        weight: Weight,
    },
    Map {
        mark: Mark,
        anchor: usize,
        entries: Vec<(Node, Node)>,
        /// The keys so far, so a duplicate is found in constant time.
        keys: HashMap<String, Mark>,
        /// A key waiting for its value.
        pending: Option<Node>,
        weight: Weight,
    },
}

/// A node just finished, on its way into the collection around it (or to the root).
struct Finished {
    node: Node,
    /// Its anchor (0: none).
    anchor: usize,
    /// What it weighs once its aliases are expanded.
    weight: Weight,
    /// What it adds to the document now: a collection only its own node (its contents
    /// were counted as they came); an alias its whole copy.
    adds: Weight,
}

/// The tree being built from the parser's events, and what bounds it.
#[derive(Default)]
struct TreeBuilder {
    /// The collections open around the current event, innermost last.
    stack: Vec<Frame>,
    /// Each anchored node with its weight, so an alias is paid for before it is copied.
    anchors: HashMap<usize, (Node, Weight)>,
    root: Option<Node>,
    /// Documents started so far: only one is allowed.
    documents: usize,
    /// What the document weighs so far, aliases expanded.
    total: Weight,
}

/// Parses one YAML document. An empty document gives `None`. Linear in the size of
/// the expanded document, which is bounded by [`MAX_NODES`], [`MAX_TEXT_BYTES`] and
/// [`MAX_DEPTH`].
pub fn parse(src: &str) -> Result<Option<Node>, YamlError> {
    let mut tree = TreeBuilder::default();
    for item in Parser::new_from_str(src) {
        let (event, span) = item.map_err(|e| YamlError {
            mark: mark_of(e.marker()),
            message: e.info().to_string(),
        })?;
        let mark = mark_of(&span.start);
        if let Some(finished) = tree.event(event, mark)? {
            tree.attach(finished, mark)?;
        }
    }
    Ok(tree.root)
}

/// The refusal of a document past the bounds, at `mark`.
fn too_big(mark: Mark, what: &str) -> YamlError {
    YamlError {
        mark,
        message: format!(
            "the document is too large: {what} (at most {MAX_NODES} values once aliases are expanded, nested at most {MAX_DEPTH} deep)"
        ),
    }
}

impl TreeBuilder {
    /// Takes one event: a collection opens (nothing finished yet), or a node is
    /// finished (a scalar, an alias, a collection that closes).
    fn event(&mut self, event: Event<'_>, mark: Mark) -> Result<Option<Finished>, YamlError> {
        match event {
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(YamlError {
                        mark,
                        message: "only one YAML document is allowed here".into(),
                    });
                }
                Ok(None)
            }
            Event::Scalar(text, style, anchor, _tag) => {
                let weight = Weight {
                    nodes: 1,
                    bytes: text.len(),
                };
                Ok(Some(Finished {
                    node: Node {
                        value: NodeValue::Scalar {
                            text: text.into_owned(),
                            plain: style == ScalarStyle::Plain,
                        },
                        mark,
                    },
                    anchor,
                    weight,
                    adds: weight,
                }))
            }
            Event::Alias(id) => self.alias(id, mark).map(Some),
            Event::SequenceStart(anchor, _) => {
                self.open(
                    Frame::Seq {
                        mark,
                        anchor,
                        items: Vec::new(),
                        weight: ONE,
                    },
                    mark,
                )?;
                Ok(None)
            }
            Event::MappingStart(anchor, _) => {
                self.open(
                    Frame::Map {
                        mark,
                        anchor,
                        entries: Vec::new(),
                        keys: HashMap::new(),
                        pending: None,
                        weight: ONE,
                    },
                    mark,
                )?;
                Ok(None)
            }
            Event::SequenceEnd => match self.stack.pop() {
                Some(Frame::Seq {
                    mark,
                    anchor,
                    items,
                    weight,
                }) => Ok(Some(Finished {
                    node: Node {
                        value: NodeValue::Seq(items),
                        mark,
                    },
                    anchor,
                    weight,
                    adds: ONE,
                })),
                _ => unreachable!("parser emits balanced sequence events"),
            },
            Event::MappingEnd => match self.stack.pop() {
                Some(Frame::Map {
                    mark,
                    anchor,
                    entries,
                    weight,
                    ..
                }) => Ok(Some(Finished {
                    node: Node {
                        value: NodeValue::Map(merge_keys(entries)?),
                        mark,
                    },
                    anchor,
                    weight,
                    adds: ONE,
                })),
                _ => unreachable!("parser emits balanced mapping events"),
            },
            _ => Ok(None),
        }
    }

    /// A copy of the anchored node, refused when it would take the document past the
    /// bounds.
    fn alias(&self, id: usize, mark: Mark) -> Result<Finished, YamlError> {
        let Some((node, weight)) = self.anchors.get(&id) else {
            return Err(YamlError {
                mark,
                message: "alias to an unknown anchor".into(),
            });
        };
        let mut after = self.total;
        after.add(*weight);
        if after.too_big() {
            return Err(too_big(mark, "its aliases expand too far"));
        }
        Ok(Finished {
            node: node.clone(),
            anchor: 0,
            weight: *weight,
            adds: *weight,
        })
    }

    /// Opens a collection, unless the document already nests as deep as it may.
    fn open(&mut self, frame: Frame, mark: Mark) -> Result<(), YamlError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(too_big(mark, "it nests too deep"));
        }
        self.stack.push(frame);
        Ok(())
    }

    /// Counts a finished node, remembers it under its anchor, and puts it into the
    /// collection around it (or makes it the root).
    fn attach(&mut self, finished: Finished, mark: Mark) -> Result<(), YamlError> {
        let Finished {
            node,
            anchor,
            weight,
            adds,
        } = finished;
        self.total.add(adds);
        if self.total.nodes > MAX_NODES {
            return Err(too_big(mark, "it has too many values"));
        }
        if self.total.bytes > MAX_TEXT_BYTES {
            return Err(too_big(mark, "it holds too much text"));
        }
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), weight));
        }
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq {
                items,
                weight: outer,
                ..
            }) => {
                outer.add(weight);
                items.push(node);
            }
            Some(Frame::Map {
                entries,
                keys,
                pending,
                weight: outer,
                ..
            }) => {
                outer.add(weight);
                match pending.take() {
                    None => *pending = Some(new_key(keys, node)?),
                    Some(key) => entries.push((key, node)),
                }
            }
        }
        Ok(())
    }
}

/// A mapping's next key, checked: a plain value, not set before in the mapping.
fn new_key(keys: &mut HashMap<String, Mark>, node: Node) -> Result<Node, YamlError> {
    let NodeValue::Scalar { text, .. } = &node.value else {
        return Err(YamlError {
            mark: node.mark,
            message: "mapping keys must be plain values, not lists or maps".into(),
        });
    };
    if let Some(first) = keys.get(text) {
        return Err(YamlError {
            mark: node.mark,
            message: format!(
                "duplicate key `{}` (first defined at line {})",
                crate::util::escape(text),
                first.line
            ),
        });
    }
    keys.insert(text.clone(), node.mark);
    Ok(node)
}

/// Applies YAML merge keys (`<<: *defaults`, or a list of mappings): their entries join
/// the mapping where it does not set the key itself (its own keys win, then earlier
/// mappings of the list). The compose convention for sharing settings through anchors.
fn merge_keys(entries: Vec<(Node, Node)>) -> Result<Vec<(Node, Node)>, YamlError> {
    let is_merge =
        |k: &Node| matches!(&k.value, NodeValue::Scalar { text, plain: true } if text == "<<");
    if !entries.iter().any(|(k, _)| is_merge(k)) {
        return Ok(entries);
    }
    let mut own = Vec::new();
    let mut sources = Vec::new();
    for (k, v) in entries {
        if !is_merge(&k) {
            own.push((k, v));
            continue;
        }
        let maps = match v.value {
            NodeValue::Map(m) => vec![m],
            NodeValue::Seq(items) => items
                .into_iter()
                .map(|item| match item.value {
                    NodeValue::Map(m) => Ok(m),
                    _ => Err(YamlError {
                        mark: item.mark,
                        message: "a merge key (`<<`) takes a mapping or a list of mappings".into(),
                    }),
                })
                .collect::<Result<_, _>>()?,
            NodeValue::Scalar { .. } => {
                return Err(YamlError {
                    mark: v.mark,
                    message: "a merge key (`<<`) takes a mapping or a list of mappings, not a single value".into(),
                });
            }
        };
        sources.extend(maps);
    }
    // The keys set so far, in a set: a merge of large mappings stays linear.
    let mut have: std::collections::HashSet<String> = own
        .iter()
        .map(|(k, _)| k.scalar_text().unwrap_or_default().to_string())
        .collect();
    let mut out = own;
    for map in sources {
        for (k, v) in map {
            if have.insert(k.scalar_text().unwrap_or_default().to_string()) {
                out.push((k, v));
            }
        }
    }
    Ok(out)
}

impl Node {
    /// Whether this is YAML's null: a plain `null` (`Null`, `NULL`), `~`, or nothing.
    pub fn is_null(&self) -> bool {
        matches!(&self.value, NodeValue::Scalar { text, plain: true } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// What the tree under this node holds, as the document's bounds count it: values
    /// (every node, keys included) and bytes of text.
    pub fn weight(&self) -> (usize, usize) {
        match &self.value {
            NodeValue::Scalar { text, .. } => (1, text.len()),
            NodeValue::Seq(items) => items.iter().fold((1, 0), |(n, b), i| {
                let (n2, b2) = i.weight();
                (n + n2, b + b2)
            }),
            NodeValue::Map(entries) => entries.iter().fold((1, 0), |(n, b), (k, v)| {
                let (kn, kb) = k.weight();
                let (vn, vb) = v.weight();
                (n + kn + vn, b + kb + vb)
            }),
        }
    }

    pub fn scalar_text(&self) -> Option<&str> {
        match &self.value {
            NodeValue::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The value under `key` when this node is a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            NodeValue::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.scalar_text() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The key node itself (for errors about a key rather than its value).
    pub fn key(&self, key: &str) -> Option<&Node> {
        match &self.value {
            NodeValue::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.scalar_text() == Some(key))
                .map(|(k, _)| k),
            _ => None,
        }
    }

    /// Follows a path of map keys and sequence indices as far as it goes and returns the
    /// deepest node reached, so an error always gets the closest position we know.
    pub fn locate<S: AsRef<str>>(&self, path: &[S]) -> &Node {
        let mut node = self;
        for seg in path {
            let seg = seg.as_ref();
            let next = match &node.value {
                NodeValue::Map(_) => node.get(seg),
                NodeValue::Seq(items) => seg.parse::<usize>().ok().and_then(|i| items.get(i)),
                NodeValue::Scalar { .. } => None,
            };
            match next {
                Some(n) => node = n,
                None => break,
            }
        }
        node
    }

    /// The JSON view of the tree under the YAML 1.2 core schema: plain `null`, `~` and
    /// empty are null, `true`/`false` booleans, numbers numbers; everything quoted is a
    /// string. Map keys are always strings (a layer named `1` is the string "1").
    pub fn to_json(&self) -> Value {
        match &self.value {
            NodeValue::Scalar { text, plain: false } => Value::String(text.clone()),
            NodeValue::Scalar { text, plain: true } => plain_scalar(text),
            NodeValue::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeValue::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.scalar_text().unwrap_or_default().to_string(), v.to_json()))
                    .collect(),
            ),
        }
    }
}

fn plain_scalar(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && let Ok(i) = text.parse::<i64>()
    {
        return Value::from(i);
    }
    if let Some(hex) = text.strip_prefix("0x")
        && let Ok(i) = i64::from_str_radix(hex, 16)
    {
        return Value::from(i);
    }
    if let Some(oct) = text.strip_prefix("0o")
        && let Ok(i) = i64::from_str_radix(oct, 8)
    {
        return Value::from(i);
    }
    let looks_float = text
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
        && text.bytes().any(|b| b.is_ascii_digit());
    if looks_float
        && let Some(n) = text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
    {
        return Value::Number(n);
    }
    Value::String(text.to_string())
}

/// serde's error about a YAML document, in the document's words: an unknown key with
/// a suggestion or the known keys (and the key, for the caller to point at), a value
/// not allowed, a missing key, a wrong type; never the name of one of cibox's types
/// (`struct RawLayer`) or a Rust integer type.
pub fn serde_words(inner: &str) -> (Option<String>, String) {
    if let Some((bad, expected)) = parse_unknown(inner, "unknown field `") {
        let hint = crate::util::did_you_mean(&bad, &expected)
            .map(|s| format!("; did you mean `{s}`?"))
            .unwrap_or_else(|| format!("; known keys: {}", expected.join(", ")));
        let message = format!("unknown key `{bad}`{hint}");
        return (Some(bad), message);
    }
    if let Some((bad, expected)) = parse_unknown(inner, "unknown variant `") {
        let hint = crate::util::did_you_mean(&bad, &expected)
            .map(|s| format!("did you mean `{s}`?"))
            .unwrap_or_else(|| format!("expected one of {}", expected.join(", ")));
        return (None, format!("`{bad}` is not allowed here; {hint}"));
    }
    if let Some(field) = inner
        .strip_prefix("missing field `")
        .and_then(|r| r.split('`').next())
    {
        return (None, format!("missing required key `{field}`"));
    }
    (
        None,
        plain_expectation(&inner.replace("invalid type: ", "wrong type: got ")),
    )
}

/// serde's words for what it expected, in a YAML file's.
fn plain_expectation(message: &str) -> String {
    static WORDS: std::sync::LazyLock<[(regex::Regex, &str); 4]> = std::sync::LazyLock::new(|| {
        let re = |s: &str| regex::Regex::new(s).expect("a valid pattern");
        [
            (
                re(r"(?:struct|map) [A-Za-z_]\w*(?: with \d+ elements?)?"),
                "a mapping (`key: value` lines)",
            ),
            (re(r"enum [A-Za-z_]\w*"), "one of its named values"),
            (re(r"\b[ui](?:8|16|32|64|128|size)\b"), "a whole number"),
            (re(r"\bf(?:32|64)\b"), "a number"),
        ]
    });
    let mut out = message.to_string();
    for (re, plain) in WORDS.iter() {
        out = re.replace_all(&out, *plain).into_owned();
    }
    out
}

/// Pulls the offending name and the expected names out of serde's message
/// ("unknown field `x`, expected one of `a`, `b`" / "expected `a`").
fn parse_unknown(msg: &str, prefix: &str) -> Option<(String, Vec<String>)> {
    let rest = msg.strip_prefix(prefix)?;
    let (bad, tail) = rest.split_once('`')?;
    let expected = tail
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    Some((bad.to_string(), expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_keys_fill_what_the_mapping_does_not_set() {
        let doc = parse("d: &d {a: 1, b: 2}\ne: &e {c: 3, a: 9}\nx:\n  <<: [*d, *e]\n  b: 5\n")
            .unwrap()
            .unwrap();
        let x = doc.get("x").unwrap().to_json();
        assert_eq!(x, serde_json::json!({"b": 5, "a": 1, "c": 3}));
        let err = parse("x:\n  <<: 3\n").unwrap_err();
        assert_eq!(err.mark.line, 2);
        assert!(err.message.contains("merge key"), "{}", err.message);
        let err = parse("x:\n  <<: [{a: 1}, 2]\n").unwrap_err();
        assert!(err.message.contains("list of mappings"), "{}", err.message);
    }

    #[test]
    fn positions_and_types() {
        let doc = parse("a: 1\nb:\n  - x\n  - '2'\nc: ~\n").unwrap().unwrap();
        assert_eq!(doc.locate(&["b", "1"]).mark, Mark { line: 4, col: 5 });
        assert_eq!(
            doc.to_json(),
            serde_json::json!({"a": 1, "b": ["x", "2"], "c": null})
        );
    }

    #[test]
    fn duplicate_keys_are_errors() {
        let err = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(err.mark.line, 3);
        assert!(err.message.contains("duplicate key `a`"), "{err}");
    }

    #[test]
    fn syntax_error_has_position() {
        let err = parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(err.mark.line >= 1);
    }

    #[test]
    fn anchors_resolve() {
        let doc = parse("x: &e {k: v}\ny: *e\n").unwrap().unwrap();
        assert_eq!(
            doc.get("y").unwrap().to_json(),
            serde_json::json!({"k": "v"})
        );
    }

    #[test]
    fn nested_aliases_cannot_expand_without_bound() {
        // Each level doubles the one below: 2^30 values from a few hundred bytes.
        let mut doc = String::from("a0: &a0 [x, x]\n");
        for i in 1..30 {
            doc.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}]\n", p = i - 1));
        }
        let err = parse(&doc).unwrap_err();
        assert!(err.message.contains("too large"), "{err}");
        // A few aliases of a small anchor are fine.
        let ok = parse("d: &d {timeout: 1m}\na: *d\nb: *d\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            ok.get("b").unwrap().to_json(),
            serde_json::json!({"timeout": "1m"})
        );
    }

    #[test]
    fn aliases_of_long_text_are_bounded_too() {
        let mut doc = format!("x: &a \"{}\"\nl:\n", "y".repeat(1 << 20));
        for _ in 0..1500 {
            doc.push_str("  - *a\n");
        }
        assert!(parse(&doc).unwrap_err().message.contains("too large"));
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        // The parser's own recursion limit or ours: an error with a position, either way.
        let doc = "[".repeat(50_000) + &"]".repeat(50_000);
        assert!(parse(&doc).is_err());
        let doc = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(parse(&doc).unwrap_err().message.contains("nests too deep"));
        assert!(parse(&("[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH))).is_ok());
    }

    #[test]
    fn many_keys_parse_in_linear_time() {
        // 200,000 keys took 20 s with a quadratic duplicate check; the bound refuses
        // them, 40,000 parse.
        let doc: String = (0..40_000).map(|i| format!("k{i}: {i}\n")).collect();
        assert!(parse(&doc).is_ok());
        let doc: String = (0..200_000).map(|i| format!("k{i}: {i}\n")).collect();
        assert!(parse(&doc).unwrap_err().message.contains("too many values"));
    }

    #[test]
    fn empty_document() {
        assert!(parse("").unwrap().is_none());
        assert!(parse("# only a comment\n").unwrap().is_none());
    }
}
