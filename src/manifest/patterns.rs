//! Which paths a change group takes: `patterns` (globs, braces included), `paths`
//! (path prefixes, vLLM's `source_file_dependencies`: the file of that name and every
//! file below the folder of that name) less `exclude` (globs); or `filter`, a list in
//! GitHub's order and syntax (`on.<event>.paths`: `!` excludes, the last pattern that
//! matches decides). Compiled once, with `globset` (ripgrep's) and, for `filter`, into
//! regular expressions, when the manifest is read; a pattern that cannot mean what it
//! seems to is refused there, by name (an extended glob, a leading `!`, `**` beside
//! other characters).

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use regex::Regex;

/// The longest pattern of a `filter` list: its regular expression stays small.
const MAX_FILTER_PATTERN: usize = 1024;

/// Where `**` stands beside other characters in `pattern` (`tests/**test_*.py`), if it
/// does: globset reads it as `*`, within one folder, where GitHub's `**` crosses them.
fn lone_double_star(pattern: &str) -> bool {
    let b = pattern.as_bytes();
    let mut i = 0;
    while let Some(at) = pattern[i..].find("**").map(|k| k + i) {
        let mut end = at;
        while end < b.len() && b[end] == b'*' {
            end += 1;
        }
        let before_ok = at == 0 || matches!(b[at - 1], b'/' | b'{' | b',');
        let after_ok = end == b.len() || matches!(b[end], b'/' | b'}' | b',');
        if !(before_ok && after_ok) {
            return true;
        }
        i = end;
    }
    false
}

/// One glob as `changed` reads it: `*` and `?` stay within a folder, `**` crosses
/// folders (`a/**/b` matches `a/b`), `[…]` a class (`[!…]` its complement), `{a,b}`
/// either, `\` escapes. Refused, by name: extended globs (`!(x)`, `@(x)`, `+(x)`,
/// `*(x)`, `?(x)`, which `globset` would read as plain characters and so match nothing)
/// and a leading `!` (a negation elsewhere, a plain `!` here).
pub fn compile_glob(pattern: &str) -> Result<Glob, String> {
    if let Some(ext) = ["!(", "@(", "+(", "*(", "?("]
        .into_iter()
        .find(|x| pattern.contains(x))
    {
        return Err(format!(
            "`{}` is an extended glob (`{ext}…)`), which changed patterns do not read: list the folders and files in `patterns` (braces `{{a,b}}` allowed) and what to leave out in `exclude`",
            crate::util::escape(pattern)
        ));
    }
    if pattern.starts_with('!') {
        return Err(format!(
            "`{}` starts with `!`, which is no negation here: put the pattern without it under `exclude`",
            crate::util::escape(pattern)
        ));
    }
    if pattern.is_empty() {
        return Err("is an empty pattern".into());
    }
    if lone_double_star(pattern) {
        return Err(format!(
            "`{}` puts `**` beside other characters, which here matches within one folder only (as `*`); write `**` as a whole part (`tests/**/*test_*.py` for any depth), or use `filter` for GitHub's syntax, where `**` matches any characters",
            crate::util::escape(pattern)
        ));
    }
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| {
            format!(
                "`{}` is not a glob: {}",
                crate::util::escape(pattern),
                e.kind()
            )
        })
}

/// One pattern of a `filter` list as GitHub reads `on.<event>.paths` (its *filter
/// pattern cheat sheet*): a leading `!` excludes; `*` any characters but `/`; `**` any
/// characters (`**/` also none, so `**/a.md` takes `a.md`); `?` the character before it
/// zero or one time, `+` one or more times; `[…]` one character of a set or range; `\`
/// escapes. Gives whether it excludes, and the pattern as a regular expression over a
/// whole path.
pub fn github_glob(pattern: &str) -> Result<(bool, Regex), String> {
    let shown = || crate::util::escape(pattern);
    let (negated, body) = match pattern.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, pattern),
    };
    if body.is_empty() {
        return Err("is an empty pattern".into());
    }
    if pattern.len() > MAX_FILTER_PATTERN || pattern.chars().any(char::is_control) {
        return Err(format!(
            "`{}` is longer than {MAX_FILTER_PATTERN} bytes or holds a control character: no path GitHub lists",
            shown()
        ));
    }
    let mut re = String::from("^");
    let chars: Vec<char> = body.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '*' if chars.get(i + 1) == Some(&'*') => {
                let slash = chars.get(i + 2) == Some(&'/');
                re.push_str(if slash { "(?:.*/)?" } else { ".*" });
                i += if slash { 3 } else { 2 };
                continue;
            }
            '*' => re.push_str("[^/]*"),
            '?' | '+' if i == 0 => {
                return Err(format!(
                    "`{}` starts with `{c}`, which repeats the character before it in GitHub's patterns: escape it (`\\{c}`)",
                    shown()
                ));
            }
            '?' => re.push('?'),
            '+' => re.push('+'),
            '[' => {
                let Some(close) = chars[i + 1..].iter().position(|&x| x == ']') else {
                    return Err(format!("`{}` opens `[` without closing it", shown()));
                };
                let set: String = chars[i + 1..i + 1 + close].iter().collect();
                if set.is_empty() {
                    return Err(format!("`{}` holds an empty `[]`", shown()));
                }
                re.push('[');
                for ch in set.chars() {
                    if matches!(ch, '\\' | '[' | ']' | '^' | '&' | '~') {
                        re.push('\\');
                    }
                    re.push(ch);
                }
                re.push(']');
                i += close + 2;
                continue;
            }
            '\\' => {
                let Some(&next) = chars.get(i + 1) else {
                    return Err(format!("`{}` ends with a lone `\\`", shown()));
                };
                re.push_str(&regex::escape(&next.to_string()));
                i += 2;
                continue;
            }
            _ => re.push_str(&regex::escape(&c.to_string())),
        }
        i += 1;
    }
    re.push('$');
    let compiled = regex::RegexBuilder::new(&re)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("`{}` is not a pattern GitHub reads: {e}", shown()))?;
    Ok((negated, compiled))
}

/// A path prefix as written (`vllm/distributed`, `vllm/distributed/`, `setup.py`): its
/// form without a trailing `/`, or why it is none.
pub fn check_prefix(path: &str) -> Result<String, String> {
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    if trimmed.is_empty() || !crate::util::is_plain_relative(trimmed) {
        return Err(format!(
            "`{}` is not a path relative to the manifest's folder (no `..`, `.`, empty part or leading `/`)",
            crate::util::escape(path)
        ));
    }
    if trimmed.contains(['*', '?', '[', '{']) {
        return Err(format!(
            "`{}` holds a glob character: `paths` are plain paths (a file, or a folder and everything below it); put globs in `patterns`",
            crate::util::escape(path)
        ));
    }
    Ok(trimmed.to_string())
}

/// Whether `path` is `prefix` or lies below it.
pub fn under_prefix(prefix: &str, path: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Globs compiled into one set.
fn glob_set(globs: &[String]) -> GlobSet {
    let mut b = GlobSetBuilder::new();
    for g in globs {
        // Checked when the manifest was read; a glob that fails here matches nothing.
        if let Ok(glob) = compile_glob(g) {
            b.add(glob);
        }
    }
    b.build().unwrap_or_else(|_| GlobSet::empty())
}

/// What one change group takes, compiled.
#[derive(Debug, Clone)]
pub struct Selector {
    include: GlobSet,
    prefixes: Vec<String>,
    exclude: GlobSet,
    /// A `filter` list in GitHub's order: each pattern excludes (`!`) or not; the last
    /// that matches decides.
    ordered: Vec<(bool, Regex)>,
}

impl Default for Selector {
    /// Takes nothing.
    fn default() -> Selector {
        Selector::new(&[], &[], &[])
    }
}

impl Selector {
    /// `patterns` and `paths` (already checked) less `exclude`.
    pub fn new(patterns: &[String], paths: &[String], exclude: &[String]) -> Selector {
        Selector {
            include: glob_set(patterns),
            prefixes: paths
                .iter()
                .map(|p| p.strip_suffix('/').unwrap_or(p).to_string())
                .collect(),
            exclude: glob_set(exclude),
            ordered: Vec::new(),
        }
    }

    /// A `filter` list (already checked), in GitHub's order.
    pub fn filter(patterns: &[String]) -> Selector {
        Selector {
            ordered: patterns
                .iter()
                .filter_map(|p| github_glob(p).ok())
                .collect(),
            ..Selector::default()
        }
    }

    /// Globs alone (a batch's `tests`).
    pub fn globs(patterns: &[String]) -> Selector {
        Selector::new(patterns, &[], &[])
    }

    pub fn matches(&self, path: &str) -> bool {
        if !self.ordered.is_empty() {
            return self
                .ordered
                .iter()
                .rev()
                .find(|(_, re)| re.is_match(path))
                .is_some_and(|(negated, _)| !negated);
        }
        (self.include.is_match(path) || self.prefixes.iter().any(|p| under_prefix(p, path)))
            && !self.exclude.is_match(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(patterns: &[&str], paths: &[&str], exclude: &[&str]) -> Selector {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Selector::new(&v(patterns), &v(paths), &v(exclude))
    }

    #[test]
    fn globs_braces_prefixes_and_exclusions() {
        let s = sel(&["tests/test_*.py"], &[], &[]);
        assert!(s.matches("tests/test_a.py"));
        assert!(!s.matches("tests/sub/test_a.py"));
        let s = sel(&["tests/**/test_*.py"], &[], &[]);
        assert!(s.matches("tests/test_a.py"));
        assert!(s.matches("tests/sub/deep/test_a.py"));
        let s = sel(&["vllm/{distributed,engine}/**"], &[], &[]);
        assert!(s.matches("vllm/engine/llm.py"));
        assert!(s.matches("vllm/distributed/a/b.py"));
        assert!(!s.matches("vllm/executor/x.py"));
        // vLLM's dependencies: the file itself, or a folder and all below, never a
        // sibling that merely starts the same.
        let s = sel(&[], &["vllm/distributed/", "vllm/config.py"], &[]);
        assert!(s.matches("vllm/distributed"));
        assert!(s.matches("vllm/distributed/parallel_state.py"));
        assert!(!s.matches("vllm/distributed_old/x.py"));
        assert!(s.matches("vllm/config.py"));
        assert!(!s.matches("vllm/config.pyc"));
        // SGLang's `python/sglang/!(multimodal_gen)/**/!(*.md)`, written plainly.
        let s = sel(
            &["python/sglang/**"],
            &[],
            &["python/sglang/multimodal_gen/**", "**/*.md"],
        );
        assert!(s.matches("python/sglang/srt/server.py"));
        assert!(!s.matches("python/sglang/multimodal_gen/x.py"));
        assert!(!s.matches("python/sglang/README.md"));
        assert!(!s.matches("python/sglang/srt/docs/notes.md"));
    }

    #[test]
    fn patterns_that_cannot_mean_what_they_seem_are_refused_by_name() {
        let e = compile_glob("python/sglang/!(multimodal_gen)/**").unwrap_err();
        assert!(e.contains("extended glob (`!(…)`)"), "{e}");
        assert!(e.contains("`exclude`"), "{e}");
        let e = compile_glob("!docs/**").unwrap_err();
        assert!(e.contains("no negation here"), "{e}");
        let e = compile_glob("tests/[a.py").unwrap_err();
        assert!(e.contains("is not a glob"), "{e}");
        assert!(compile_glob("{**/*.go,go.mod}").is_ok());
        // Issue 48: beside other characters `**` is globset's `*`, one folder deep.
        for bad in ["tests/**test_*.py", "{**.go,go.mod}", "a**/b", "a/**b"] {
            let e = compile_glob(bad).unwrap_err();
            assert!(
                e.contains("puts `**` beside other characters"),
                "{bad}: {e}"
            );
        }
        assert_eq!(check_prefix("vllm/x/").unwrap(), "vllm/x");
        assert!(check_prefix("../x").is_err());
        assert!(
            check_prefix("vllm/*")
                .unwrap_err()
                .contains("glob character")
        );
    }

    /// verl's `.github/workflows/e2e_ppo_trainer_megatron_vllm.yml:56-78` (b178a3cd5):
    /// every `.py`, less docs, examples and tests, then entry points taken back.
    #[test]
    fn a_filter_list_reads_in_githubs_order_and_syntax() {
        let list: Vec<String> = [
            "**/*.py",
            "!docker/**",
            "!**/*.md",
            "!docs/**",
            "!examples/**",
            "!tests/**",
            "!verl/trainer/main_*.py",
            "!verl/workers/**/*dp_*.py",
            ".github/workflows/e2e_ppo_trainer_megatron_vllm.yml",
            "examples/data_preprocess/gsm8k.py",
            "tests/special_e2e/run_ppo_trainer_megatron.sh",
            "verl/trainer/main_ppo.py",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let s = Selector::filter(&list);
        for (path, want) in [
            ("setup.py", true),
            ("verl/trainer/ppo/core.py", true),
            ("tests/test_x.py", false),
            ("examples/data_preprocess/gsm8k.py", true),
            ("examples/data_preprocess/other.py", false),
            ("verl/trainer/main_eval.py", false),
            ("verl/trainer/main_ppo.py", true),
            ("verl/workers/actor/dp_actor.py", false),
            ("verl/workers/megatron_workers.py", true),
            ("tests/special_e2e/run_ppo_trainer_megatron.sh", true),
            ("docs/index.md", false),
            ("README.md", false),
            ("verl/README", false),
        ] {
            assert_eq!(s.matches(path), want, "{path}");
        }
        // GitHub's `**` beside other characters crosses folders; `?` and `+` repeat.
        let one = |p: &str| Selector::filter(&[p.to_string()]);
        assert!(one("tests/**test_*.py").matches("tests/a/b/test_x.py"));
        assert!(one("tests/**test_*.py").matches("tests/footest_x.py"));
        assert!(one("*.jsx?").matches("page.js") && one("*.jsx?").matches("page.jsx"));
        assert!(one("*.js+").matches("a.jss") && !one("*.js+").matches("a.j"));
        assert!(one("docs/*").matches("docs/a.md") && !one("docs/*").matches("docs/a/b.md"));
        assert!(one("[a-c]*.py").matches("b1.py") && !one("[a-c]*.py").matches("d.py"));
        assert!(one("a\\*b").matches("a*b") && !one("a\\*b").matches("axb"));
        // Only a `!`: nothing matches; the first that matches nothing keeps nothing.
        assert!(!one("!docs/**").matches("docs/a.md"));
        assert!(!one("!docs/**").matches("src/a.py"));
        for (bad, why) in [
            ("!", "empty pattern"),
            ("[abc", "opens `[` without closing it"),
            ("?x", "starts with `?`"),
            ("a\\", "lone `\\`"),
            ("a\nb", "control character"),
        ] {
            let e = github_glob(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
