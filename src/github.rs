//! GitHub Actions: the step summary, step outputs and annotations. Active only when
//! `GITHUB_ACTIONS=true`.

use std::io::Write;

use crate::batch::junit::{Case, Outcome};
use crate::batch::record::{RunRecord, Status};

pub fn active() -> bool {
    std::env::var("GITHUB_ACTIONS").is_ok_and(|v| v == "true")
}

/// Escapes workflow-command data (`%`, CR, LF); properties also `:` and `,`.
fn escape_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

fn append(var: &str, text: &str) {
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

/// Summary, outputs (`status`, `failed_batches`) and one error annotation per failing
/// test case.
pub fn report_run(results: &[(RunRecord, Vec<Case>)], summary: &str) {
    if !active() {
        return;
    }
    append("GITHUB_STEP_SUMMARY", summary);
    let failed: Vec<&str> = results
        .iter()
        .filter(|(r, _)| r.status != Status::Passed)
        .map(|(r, _)| r.batch.as_str())
        .collect();
    output(
        "status",
        if failed.is_empty() {
            "passed"
        } else {
            "failed"
        },
    );
    output("failed_batches", &failed.join(","));
    let mut out = std::io::stdout().lock();
    for (r, cases) in results {
        for c in cases
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed | Outcome::Error))
        {
            let mut props = format!(
                "title={}",
                escape_property(&format!("{}: {}", r.batch, c.id()))
            );
            if let Some(f) = &c.file {
                props.push_str(&format!(",file={}", escape_property(f)));
                if let Some(l) = c.line {
                    props.push_str(&format!(",line={l}"));
                }
            }
            let msg = c.message.as_deref().unwrap_or("failed");
            let _ = writeln!(out, "::error {props}::{}", escape_data(msg));
        }
        if r.status != Status::Passed && r.status != Status::Failed {
            let _ = writeln!(
                out,
                "::error title={}::{}",
                escape_property(&format!("batch {} {}", r.batch, r.status.as_str())),
                escape_data(r.message.as_deref().unwrap_or(""))
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes() {
        assert_eq!(super::escape_data("a%b\nc"), "a%25b%0Ac");
        assert_eq!(super::escape_property("x: y, z"), "x%3A y%2C z");
    }
}
