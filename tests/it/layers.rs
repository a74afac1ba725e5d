//! The crate's rooms import downward only: the layer order written in `src/main.rs`
//! holds for every import between top-level modules, the order a folder's `mod.rs`
//! writes ("The rooms, from the bottom up") holds between its files, no sibling
//! modules import each other in a circle at any depth, and no top-level room is over a
//! fifth of `src/`.
//!
//! Imports are read from the source text: `use` trees (braces expanded), and paths in
//! code that start with `crate::`, `super::`, `self::` or a child module's name. A
//! re-export (`pub use`) is followed to where the item lives; `#[cfg(test)]` modules
//! are left out (tests may reach anywhere). A module's own file (`mod.rs`) counts as a
//! sibling of its children only where its code uses what they define, and its children
//! use what it defines: that is a circle too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

type ModPath = Vec<String>;

/// The modules of a source tree and the imports between them.
struct Crate {
    /// Module path → its file.
    files: BTreeMap<ModPath, PathBuf>,
    /// Module path → the modules its code uses.
    uses: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

const SELF: &str = "<self>";

impl Crate {
    fn read(src: &Path) -> Crate {
        let mut files = BTreeMap::new();
        collect(src, src, &mut files);
        let texts: BTreeMap<ModPath, String> = files
            .iter()
            .map(|(m, p)| (m.clone(), strip(&std::fs::read_to_string(p).unwrap())))
            .collect();
        // Test-only modules (`#[cfg(test)] mod tests;`) and everything below them.
        let test_decl =
            Regex::new(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;").unwrap();
        let mut test_only: Vec<ModPath> = Vec::new();
        for (m, t) in &texts {
            for c in test_decl.captures_iter(t) {
                test_only.push(child(m, &c[1]));
            }
        }
        let files: BTreeMap<ModPath, PathBuf> = files
            .into_iter()
            .filter(|(m, _)| !test_only.iter().any(|t| m.starts_with(t)))
            .collect();
        let known: BTreeSet<ModPath> = files.keys().cloned().collect();
        let reexports = reexports(&texts, &known);
        let mut uses: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
        for m in files.keys() {
            let text = remove_test_modules(&texts[m]);
            let mut found = BTreeSet::new();
            for path in paths_in(&text, m, &known) {
                if let Some(target) = resolve(m, &path, &known, &reexports)
                    && &target != m
                {
                    found.insert(target);
                }
            }
            uses.insert(m.clone(), found);
        }
        Crate { files, uses }
    }

    /// The import graph among the children of `parent` (and `<self>`, its own file).
    fn siblings(&self, parent: &[String]) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
        let mut g: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
        for (a, targets) in &self.uses {
            for b in targets {
                let k = a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count();
                if k != parent.len() || !a.starts_with(parent) {
                    continue;
                }
                let ca = a.get(k).cloned().unwrap_or_else(|| SELF.into());
                let cb = b.get(k).cloned().unwrap_or_else(|| SELF.into());
                if ca != cb {
                    g.entry(ca)
                        .or_default()
                        .entry(cb)
                        .or_default()
                        .push(format!("{} uses {}", shown(a), shown(b)));
                }
            }
        }
        g
    }

    /// Every folder (module with children), the crate root first.
    fn parents(&self) -> BTreeSet<ModPath> {
        self.files
            .keys()
            .filter(|m| !m.is_empty())
            .map(|m| m[..m.len() - 1].to_vec())
            .collect()
    }
}

fn shown(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

fn child(m: &[String], name: &str) -> ModPath {
    let mut c = m.to_vec();
    c.push(name.to_string());
    c
}

fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<ModPath, PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut m: ModPath = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if m.last().is_some_and(|l| l == "mod") {
                m.pop();
            }
            if m == ["main"] || m == ["lib"] {
                m.clear();
            }
            out.insert(m, path);
        }
    }
}

/// The text without comments, string and character literals (lifetimes stay).
fn strip(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if (c == 'r' || c == 'b')
            && !b
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
            && raw_string_at(&b, i).is_some()
        {
            i = raw_string_at(&b, i).unwrap();
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && char_literal_end(&b, i).is_some() {
            i = char_literal_end(&b, i).unwrap();
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Where a raw string (`r"…"`, `r#"…"#`, `br"…"`) starting at `i` ends, if one does.
fn raw_string_at(b: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if b[j] == 'b' {
        j += 1;
    }
    if b.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while b.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if b.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < b.len() {
        if b[j] == '"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(b.len())
}

/// Where a character literal starting at `i` ends; `None` for a lifetime.
fn char_literal_end(b: &[char], i: usize) -> Option<usize> {
    match b.get(i + 1)? {
        '\\' => {
            let mut j = i + 2;
            while j < b.len() && b[j] != '\'' {
                j += 1;
            }
            Some(j + 1)
        }
        _ if b.get(i + 2) == Some(&'\'') => Some(i + 3),
        _ => None,
    }
}

/// The text without its `#[cfg(test)] mod … { … }` blocks.
fn remove_test_modules(text: &str) -> String {
    let re = Regex::new(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{").unwrap();
    let mut out = String::new();
    let mut rest = text;
    while let Some(m) = re.find(rest) {
        out.push_str(&rest[..m.start()]);
        let mut depth = 1;
        let mut end = m.end();
        for (k, ch) in rest[m.end()..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = m.end() + k + 1;
                break;
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// A `use` tree's paths, braces expanded (`a::{b, c::{d, e}}` → `a::b`, `a::c::d`, …).
fn expand(prefix: &[String], tree: &str) -> Vec<ModPath> {
    let tree = tree.trim();
    if let Some(open) = tree.find('{')
        && tree.ends_with('}')
    {
        let mut base = prefix.to_vec();
        base.extend(segments(tree[..open].trim_end_matches(':')));
        let inner = &tree[open + 1..tree.len() - 1];
        let mut parts = Vec::new();
        let (mut depth, mut start) = (0, 0);
        for (k, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&inner[start..k]);
                    start = k + 1;
                }
                _ => {}
            }
        }
        parts.push(&inner[start..]);
        return parts
            .into_iter()
            .filter(|p| !p.trim().is_empty())
            .flat_map(|p| expand(&base, p))
            .collect();
    }
    let tree = tree.split(" as ").next().unwrap_or(tree);
    let mut path = prefix.to_vec();
    path.extend(segments(tree));
    vec![path]
}

fn segments(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// The paths `text` (the code of module `m`) names.
fn paths_in(text: &str, m: &[String], known: &BTreeSet<ModPath>) -> Vec<ModPath> {
    let reexport = Regex::new(r"\bpub(?:\([^)]*\))?\s+use\s+[^;]+;").unwrap();
    let text = reexport.replace_all(text, "");
    let uses = Regex::new(r"\buse\s+([^;]+);").unwrap();
    let mut paths: Vec<ModPath> = uses
        .captures_iter(&text)
        .flat_map(|c| expand(&[], &c[1]))
        .collect();
    let inline = Regex::new(r"(?:^|[^:\w])([a-z_]\w*(?:::\w+)+)").unwrap();
    for c in inline.captures_iter(&text) {
        let path: ModPath = segments(&c[1]).collect();
        let first = path[0].as_str();
        if matches!(first, "crate" | "super" | "self") || known.contains(&child(m, first)) {
            paths.push(path);
        }
    }
    paths
}

/// The absolute form of `path` as written in module `m`, or `None` for another crate's.
fn absolute(m: &[String], path: &[String], known: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut segs = path.iter().peekable();
    let mut base: ModPath = match segs.peek()?.as_str() {
        "crate" => {
            segs.next();
            Vec::new()
        }
        "self" => {
            segs.next();
            m.to_vec()
        }
        "super" => {
            let mut b = m.to_vec();
            while segs.peek().is_some_and(|s| *s == "super") {
                segs.next();
                b.pop();
            }
            b
        }
        first if known.contains(&child(m, first)) => m.to_vec(),
        _ => return None,
    };
    base.extend(segs.cloned());
    Some(base)
}

/// `pub use` re-exports: (module, name) → the module the item lives in.
fn reexports(
    texts: &BTreeMap<ModPath, String>,
    known: &BTreeSet<ModPath>,
) -> BTreeMap<(ModPath, String), ModPath> {
    let re = Regex::new(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);").unwrap();
    let mut out = BTreeMap::new();
    for (m, text) in texts {
        for c in re.captures_iter(text) {
            let tree = c[1].to_string();
            for path in expand(&[], &tree) {
                let name = match tree.rsplit_once(" as ") {
                    Some((_, alias)) if !tree.contains('{') => alias.trim().to_string(),
                    _ => path.last().cloned().unwrap_or_default(),
                };
                if let Some(abs) = absolute(m, &path, known) {
                    out.insert((m.clone(), name), deepest(&abs, known));
                }
            }
        }
    }
    out
}

/// The deepest module of `abs` that exists.
fn deepest(abs: &[String], known: &BTreeSet<ModPath>) -> ModPath {
    (0..=abs.len())
        .rev()
        .map(|k| abs[..k].to_vec())
        .find(|p| known.contains(p))
        .unwrap_or_default()
}

/// The module `path` (written in `m`) leads to, following re-exports.
fn resolve(
    m: &[String],
    path: &[String],
    known: &BTreeSet<ModPath>,
    reexports: &BTreeMap<(ModPath, String), ModPath>,
) -> Option<ModPath> {
    let abs = absolute(m, path, known)?;
    let mut at = deepest(&abs, known);
    for _ in 0..16 {
        let Some(item) = abs.get(at.len()) else {
            break;
        };
        match reexports.get(&(at.clone(), item.clone())) {
            Some(next) if *next != at => at = next.clone(),
            _ => break,
        }
    }
    Some(at)
}

/// The circles of a graph (its strongly connected components of more than one node).
fn circles(g: &BTreeMap<String, BTreeMap<String, Vec<String>>>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = g.keys().chain(g.values().flat_map(|v| v.keys())).collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for next in g.get(&n).into_iter().flat_map(|v| v.keys()) {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) || !reaches[n].contains(*n) {
            continue;
        }
        let comp: Vec<String> = nodes
            .iter()
            .filter(|o| reaches[n].contains(**o) && reaches[*o].contains(*n))
            .map(|o| (*o).clone())
            .collect();
        done.extend(comp.iter().cloned());
        out.push(comp);
    }
    out
}

/// The numbered layers of the crate's doc (`//! 1. [`cmd`]: …`): each layer's modules,
/// the bracketed names before its first `:`.
fn layers_of(main_rs: &str) -> Vec<Vec<String>> {
    let item = Regex::new(r"^//! (\d+)\. (.*)$").unwrap();
    let name = Regex::new(r"\[`(\w+)`\]").unwrap();
    let mut layers = Vec::new();
    let mut current: Option<String> = None;
    let named = Regex::new(r"^\[`(\w+)`\]:").unwrap();
    let flush = |text: Option<String>, layers: &mut Vec<Vec<String>>| {
        if let Some(t) = text {
            // Names in parentheses describe, they are not the layer's modules.
            let mut depth = 0;
            let mut outer = String::new();
            for ch in t.chars() {
                match ch {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ if depth == 0 => outer.push(ch),
                    _ => {}
                }
            }
            let head = outer.split(": ").next().unwrap_or("");
            let mut names: Vec<String> =
                name.captures_iter(head).map(|c| c[1].to_string()).collect();
            // `[`plan`]: …; [`claims`]: …` names a second module after the `;`.
            for part in outer.split("; ").skip(1) {
                if let Some(c) = named.captures(part.trim()) {
                    names.push(c[1].to_string());
                }
            }
            layers.push(names);
        }
    };
    for line in main_rs.lines() {
        if let Some(c) = item.captures(line) {
            flush(current.take(), &mut layers);
            current = Some(c[2].to_string());
        } else if let Some(cur) = current.as_mut() {
            match line.strip_prefix("//!") {
                Some(rest) if rest.starts_with("  ") => {
                    cur.push(' ');
                    cur.push_str(rest.trim());
                }
                _ => flush(current.take(), &mut layers),
            }
        }
    }
    flush(current, &mut layers);
    layers
}

/// A folder's rooms as its `mod.rs` lists them under "The rooms, from the bottom up":
/// one bullet a level, its modules in order.
fn rooms_of(mod_rs: &str) -> Option<Vec<Vec<String>>> {
    let start = mod_rs.find("The rooms, from the bottom up")?;
    let name = Regex::new(r"\[`(\w+)`\]").unwrap();
    let mut levels: Vec<String> = Vec::new();
    for line in mod_rs[start..].lines().skip(1) {
        let Some(rest) = line.strip_prefix("//!") else {
            break;
        };
        if let Some(bullet) = rest.strip_prefix(" - ") {
            levels.push(bullet.to_string());
        } else if rest.starts_with("   ") && !levels.is_empty() {
            levels.last_mut().unwrap().push_str(rest);
        } else if !levels.is_empty() {
            break;
        }
    }
    Some(
        levels
            .iter()
            .map(|l| {
                // The rooms a bullet is about come before its first `:`; others it names
                // on the way are on its list too (`… and [`steps`]: …`).
                let head = l.split(": ").next().unwrap_or("");
                name.captures_iter(head).map(|c| c[1].to_string()).collect()
            })
            .collect(),
    )
}

/// What breaks the rules in the tree at `src`, one line each.
fn violations(src: &Path) -> Vec<String> {
    let krate = Crate::read(src);
    let mut found = Vec::new();
    for parent in krate.parents() {
        let g = krate.siblings(&parent);
        for circle in circles(&g) {
            let why: Vec<String> = circle
                .iter()
                .flat_map(|a| {
                    g.get(a)
                        .into_iter()
                        .flat_map(|v| v.iter())
                        .filter(|(b, _)| circle.contains(b))
                        .map(|(_, why)| why[0].clone())
                })
                .collect();
            found.push(format!(
                "circle in {}: {} ({})",
                shown(&parent),
                circle.join(" ↔ "),
                why.join("; ")
            ));
        }
    }
    // The crate's layers.
    let main_rs = std::fs::read_to_string(src.join("main.rs")).unwrap_or_default();
    let layers = layers_of(&main_rs);
    let top: BTreeSet<String> = krate
        .files
        .keys()
        .filter(|m| !m.is_empty())
        .map(|m| m[0].clone())
        .collect();
    let level = |name: &str| layers.iter().position(|l| l.iter().any(|n| n == name));
    for m in &top {
        let n = layers.iter().flatten().filter(|n| *n == m).count();
        if n != 1 {
            found.push(format!(
                "module `{m}` is in {n} of main.rs's layers (must be in one)"
            ));
        }
    }
    for (a, edges) in krate.siblings(&[]) {
        for (b, why) in edges {
            if let (Some(la), Some(lb)) = (level(&a), level(&b))
                && la >= lb
            {
                found.push(format!(
                    "`{a}` (layer {}) imports `{b}` (layer {}): {}",
                    la + 1,
                    lb + 1,
                    why[0]
                ));
            }
        }
    }
    // The orders folders write down.
    for parent in krate.parents().into_iter().filter(|p| !p.is_empty()) {
        let Some(file) = krate.files.get(&parent) else {
            continue;
        };
        let Some(rooms) = rooms_of(&std::fs::read_to_string(file).unwrap()) else {
            continue;
        };
        let rank = |name: &str| {
            rooms
                .iter()
                .enumerate()
                .find_map(|(i, l)| l.iter().position(|n| n == name).map(|j| (i, j)))
        };
        for (a, edges) in krate.siblings(&parent) {
            for (b, why) in edges {
                if a == SELF || b == SELF {
                    continue;
                }
                match (rank(&a), rank(&b)) {
                    (Some(ra), Some(rb)) if ra <= rb => found.push(format!(
                        "in {}, `{a}` imports `{b}`, which its mod.rs lists above it: {}",
                        shown(&parent),
                        why[0]
                    )),
                    (None, _) | (_, None) => found.push(format!(
                        "{}'s rooms list leaves out `{}`",
                        shown(&parent),
                        if rank(&a).is_none() { &a } else { &b }
                    )),
                    _ => {}
                }
            }
        }
    }
    // Size: no top-level room over a fifth of the source.
    let lines = |m: &ModPath| {
        std::fs::read_to_string(&krate.files[m])
            .unwrap()
            .lines()
            .count()
    };
    let total: usize = krate.files.keys().map(lines).sum();
    for room in &top {
        let n: usize = krate
            .files
            .keys()
            .filter(|m| m.first() == Some(room))
            .map(lines)
            .sum();
        if n * 5 > total {
            found.push(format!(
                "room `{room}` is {n} of {total} lines, over a fifth of src/"
            ));
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn the_crate_imports_downward_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layers = layers_of(&std::fs::read_to_string(src.join("main.rs")).unwrap());
    assert!(
        layers.len() >= 5,
        "main.rs's doc lists no layers (`//! 1. [`cmd`]: …`): {layers:?}"
    );
    let found = violations(&src);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_circle_an_upward_import_and_a_big_room_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write(
        "main.rs",
        "//! 1. [`top`]: the top;\n//! 2. [`low`]: below it.\n\nmod low;\nmod top;\nfn main() {}\n",
    );
    write("top.rs", "use crate::low::Thing;\n");
    // `low` reaches up to `top`; inside `low`, `a` and `b` use each other; its rooms
    // list puts `a` below `b`, yet `a` uses `b`.
    write(
        "low/mod.rs",
        "//! The rooms, from the bottom up:\n//!\n//! - [`a`]: first;\n//! - [`b`]: then.\n\nmod a;\nmod b;\npub use a::Thing;\n",
    );
    write(
        "low/a.rs",
        "use super::b::Other;\n// crate::top::x in a comment is no import\npub struct Thing;\nfn f() { let _ = \"crate::top::y\"; }\n",
    );
    write(
        "low/b.rs",
        "pub struct Other(crate::low::a::Thing);\nfn g() { crate::top::h() }\n",
    );
    let found = violations(src);
    let text = found.join("\n");
    assert!(text.contains("circle in low: a ↔ b"), "{text}");
    assert!(text.contains("circle in crate: low ↔ top"), "{text}");
    assert!(
        text.contains("`low` (layer 2) imports `top` (layer 1)"),
        "{text}"
    );
    assert!(text.contains("in low, `a` imports `b`"), "{text}");
    assert!(text.contains("over a fifth of src/"), "{text}");
    assert!(!text.contains("comment"), "{text}");
    // Without the upward imports, only the size is left (five small files).
    write("low/a.rs", "pub struct Thing;\n");
    write("low/b.rs", "pub struct Other(crate::low::a::Thing);\n");
    let found = violations(src);
    assert!(
        found.iter().all(|f| f.contains("over a fifth")),
        "{}",
        found.join("\n")
    );
}
