//! Which paths a change group takes: `patterns` (globs, braces included), `paths`
//! (path prefixes, vLLM's `source_file_dependencies`: the file of that name and every
//! file below the folder of that name) less `exclude` (globs). Compiled once, with
//! `globset` (ripgrep's), when the manifest is read; a pattern that cannot mean what it
//! seems to is refused there, by name (an extended glob, a leading `!`).

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

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
        }
    }

    /// Globs alone (a batch's `tests`).
    pub fn globs(patterns: &[String]) -> Selector {
        Selector::new(patterns, &[], &[])
    }

    pub fn matches(&self, path: &str) -> bool {
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
        assert!(compile_glob("{**.go,go.mod}").is_ok());
        assert_eq!(check_prefix("vllm/x/").unwrap(), "vllm/x");
        assert!(check_prefix("../x").is_err());
        assert!(
            check_prefix("vllm/*")
                .unwrap_err()
                .contains("glob character")
        );
    }
}
