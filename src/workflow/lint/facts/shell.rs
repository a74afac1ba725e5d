//! Reading shell scripts as the shell does, as far as the rules need: lines joined at
//! `\` continuations, and the variables a line expands. Shared by [`super::checkout`]
//! (which lines fetch the pull request's head) and [`super::flow`] (attacker text carried
//! between steps).

use std::sync::LazyLock;

use regex::Regex;

/// A variable a script expands (`$NAME`, `${NAME}`): its name is the first group.
pub(crate) static SHELL_VAR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)").expect("valid regex"));

/// The script's lines with `\`-continued lines joined, as the shell reads them.
pub(crate) fn logical_lines(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in script.lines() {
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}
