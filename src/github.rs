//! GitHub Actions primitives: whether cibox runs in a workflow, workflow-command
//! escaping, step outputs and files. A leaf: the run's GitHub reporter
//! ([`crate::runner::reporter::github`]) and the commands build on it.

use std::io::Write;

/// Whether cibox runs as a GitHub Actions step (`GITHUB_ACTIONS=true`).
pub fn active() -> bool {
    std::env::var("GITHUB_ACTIONS").is_ok_and(|v| v == "true")
}

/// Escapes workflow-command data (`%`, CR, LF); properties also `:` and `,`.
pub fn escape_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

pub fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

/// Appends `text` to the file a GitHub variable names (a step summary, outputs).
pub fn append(var: &str, text: &str) {
    let Ok(path) = std::env::var(var) else { return };
    let written = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = written {
        crate::report::warn(format!("{var} ({path}): {e}"));
    }
}

/// Writes `name=value` to `$GITHUB_OUTPUT` (values here are single-line).
pub fn output(name: &str, value: &str) {
    append("GITHUB_OUTPUT", &format!("{name}={value}\n"));
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes() {
        assert_eq!(super::escape_data("a%b\nc"), "a%25b%0Ac");
        assert_eq!(super::escape_property("x: y, z"), "x%3A y%2C z");
    }
}
