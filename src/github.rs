//! GitHub Actions primitives: whether cibox runs in a workflow, workflow-command
//! escaping, step outputs and files. A leaf: the run's GitHub reporter
//! ([`crate::report::reporter::github`]) and the commands build on it.

use std::io::Write;

/// Whether cibox runs as a GitHub Actions step (`GITHUB_ACTIONS=true`).
pub fn active() -> bool {
    std::env::var("GITHUB_ACTIONS").is_ok_and(|v| v == "true")
}

/// The event of this workflow run, unless it is one that runs merged code only
/// (`push`, `schedule`, `release`): a pull request's (`pull_request_target` and
/// `issue_comment` start from the base branch but test what a pull request brought), a
/// merge queue's, a dispatch on any branch, a chat-ops `repository_dispatch`, a
/// `workflow_run` after one of those. `None` outside GitHub Actions.
pub fn untrusted_event() -> Option<String> {
    const MERGED_CODE: [&str; 3] = ["push", "schedule", "release"];
    let event = std::env::var("GITHUB_EVENT_NAME").ok()?;
    (!MERGED_CODE.contains(&event.as_str())).then_some(event)
}

/// Escapes workflow-command data (`%`, CR, LF); properties also `:` and `,`. Any
/// other control character but a tab, and a bidirectional override, is written as
/// [`crate::util::escape`] writes it (`\u{1b}`): what a test named itself must not
/// reach the log (or a terminal showing it) as a terminal's escape sequence.
pub fn escape_data(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '\r' => out.push_str("%0D"),
            '\n' => out.push_str("%0A"),
            '\t' => out.push(c),
            c if crate::util::is_unsafe_char(c) => out.extend(c.escape_debug()),
            c => out.push(c),
        }
    }
    out
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
        crate::console::warn(format!("{var} ({path}): {e}"));
    }
}

/// Writes `name=value` to `$GITHUB_OUTPUT` when it is set (values here are single-line):
/// the run reporter's outputs, which nothing asked for explicitly.
pub fn output(name: &str, value: &str) {
    append("GITHUB_OUTPUT", &format!("{name}={value}\n"));
}

/// The step-outputs file (`$GITHUB_OUTPUT`), opened before a command does its work: a
/// missing or unwritable file is an error, never outputs silently left empty (a job
/// gated on them would be skipped without a word).
pub struct Outputs {
    file: std::fs::File,
    path: String,
}

/// Why step outputs asked for cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputsError {
    #[error(
        "--github-output: GITHUB_OUTPUT is not set; run inside a GitHub Actions step, or drop --github-output"
    )]
    NotSet,
    #[error("--github-output: cannot write GITHUB_OUTPUT ({path}): {source}")]
    Unopenable {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file was opened, and the outputs could not be written to it.
    #[error("writing GITHUB_OUTPUT ({path}): {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// No random delimiter for a value with a newline (the random source failed).
    #[error("--github-output: no random delimiter for {name}: {source}")]
    NoDelimiter {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

impl crate::error::ErrorKind for OutputsError {
    fn failure(&self) -> crate::exit::Failure {
        match self {
            // Asked for where they cannot be: the caller's to fix.
            OutputsError::NotSet | OutputsError::Unopenable { .. } => crate::exit::Failure::Usage,
            OutputsError::Write { .. } | OutputsError::NoDelimiter { .. } => {
                crate::exit::Failure::Infra
            }
        }
    }
}

impl Outputs {
    pub fn open() -> Result<Outputs, OutputsError> {
        let path = std::env::var("GITHUB_OUTPUT").unwrap_or_default();
        if path.is_empty() {
            return Err(OutputsError::NotSet);
        }
        let file = match std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
        {
            Ok(file) => file,
            Err(source) => return Err(OutputsError::Unopenable { path, source }),
        };
        Ok(Outputs { file, path })
    }

    /// Appends `name=value` lines in one write; a value with a newline uses the
    /// `name<<DELIMITER` form.
    pub fn write(&mut self, pairs: &[(&str, &str)]) -> Result<(), OutputsError> {
        let mut text = String::new();
        for (name, value) in pairs {
            if value.contains('\n') {
                let random =
                    crate::util::random_hex(8).map_err(|source| OutputsError::NoDelimiter {
                        name: name.to_string(),
                        source,
                    })?;
                let delimiter = format!("CIBOX_EOF_{random}");
                text.push_str(&format!("{name}<<{delimiter}\n{value}\n{delimiter}\n"));
            } else {
                text.push_str(&format!("{name}={value}\n"));
            }
        }
        self.file
            .write_all(text.as_bytes())
            .map_err(|source| OutputsError::Write {
                path: self.path.clone(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes() {
        assert_eq!(super::escape_data("a%b\nc"), "a%25b%0Ac");
        assert_eq!(super::escape_property("x: y, z"), "x%3A y%2C z");
        // A title change and a clipboard write (OSC 0, OSC 52), an 8-bit CSI, an
        // override: shown, not sent.
        let name = "t\u{1b}]0;pwned\u{7}\u{1b}]52;c;ZWNobyBo\u{7}\u{9b}2J\u{202e}\tx";
        assert_eq!(
            super::escape_property(name),
            "t\\u{1b}]0;pwned\\u{7}\\u{1b}]52;c;ZWNobyBo\\u{7}\\u{9b}2J\\u{202e}\tx"
        );
        assert_eq!(
            super::escape_data("50%\r\n\u{1b}[2J"),
            "50%25%0D%0A\\u{1b}[2J"
        );
    }
}
