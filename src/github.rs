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

/// The most an event file may hold: GitHub's payloads are far smaller.
const MAX_EVENT_BYTES: u64 = 32 << 20;

/// The pull request this workflow run is for, as its event file says it
/// (`GITHUB_EVENT_PATH`), checked against what else the runner says of the run
/// (`GITHUB_EVENT_NAME`, `GITHUB_REF`, `GITHUB_REPOSITORY`) and against the commit
/// tested (`sha`, when the source is a git checkout). Only a workflow of the base
/// branch's can be believed: on a host whose policy says only such workflows reach it,
/// the runner wrote the file. `Err` says why this run is not one pull request's (and
/// so writes privately).
pub fn pull_request(sha: Option<&str>) -> Result<u64, String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let event = var("GITHUB_EVENT_NAME").ok_or("GITHUB_EVENT_NAME is not set")?;
    let path = var("GITHUB_EVENT_PATH").ok_or("GITHUB_EVENT_PATH is not set")?;
    let text = read_event(std::path::Path::new(&path))
        .map_err(|why| format!("its event file {}: {why}", crate::util::escape(&path)))?;
    pull_request_of(
        &event,
        &text,
        var("GITHUB_REF").as_deref(),
        var("GITHUB_REPOSITORY").as_deref(),
        sha,
    )
}

/// The event file: a plain file (never through a link), nobody else may write, of
/// bounded size.
fn read_event(path: &std::path::Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    if !path.is_absolute() {
        return Err("is not an absolute path".into());
    }
    let (file, md) = crate::util::open_plain(path, false).map_err(|e| e.to_string())?;
    if md.mode() & 0o022 != 0 {
        return Err(format!(
            "has mode {:o}: others may write it",
            md.mode() & 0o7777
        ));
    }
    if md.len() > MAX_EVENT_BYTES {
        return Err(format!("holds {} bytes, more than an event's", md.len()));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_EVENT_BYTES), &mut text)
        .map_err(|e| e.to_string())?;
    Ok(text)
}

/// See [`pull_request`]: the event `name`'s payload `text`.
pub fn pull_request_of(
    name: &str,
    text: &str,
    git_ref: Option<&str>,
    repository: Option<&str>,
    sha: Option<&str>,
) -> Result<u64, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the event file is not JSON: {e}"))?;
    let number_at = |at: &serde_json::Value, what: &str| -> Result<u64, String> {
        match at.as_u64() {
            Some(n) if (1..=MAX_PULL_REQUEST).contains(&n) => Ok(n),
            _ => Err(format!(
                "the event file's {what} is not a pull request's number"
            )),
        }
    };
    let number = match name {
        "pull_request_target" => {
            let pr = &v["pull_request"];
            let n = number_at(&pr["number"], "pull_request.number")?;
            if v["number"] != pr["number"] {
                return Err(format!(
                    "the event file's number ({}) is not its pull request's ({n})",
                    crate::util::escape(&v["number"].to_string())
                ));
            }
            same_repository(
                &pr["base"]["repo"]["full_name"],
                repository,
                "pull_request.base.repo",
            )?;
            // An event that names no head (nor a merge commit) vouches for no commit.
            let names = |at: &serde_json::Value, sha: &str| {
                at.as_str().is_some_and(|s| sha.eq_ignore_ascii_case(s))
            };
            if let Some(sha) = sha
                && !names(&pr["head"]["sha"], sha)
                && !names(&pr["merge_commit_sha"], sha)
            {
                return Err(format!(
                    "the commit tested ({sha}) is neither the pull request's head ({}) nor its merge commit",
                    pr["head"]["sha"]
                        .as_str()
                        .map_or_else(|| "none".into(), crate::util::escape)
                ));
            }
            n
        }
        "issue_comment" => {
            if !v["issue"]["pull_request"].is_object() {
                return Err("the comment is on an issue, not a pull request".into());
            }
            number_at(&v["issue"]["number"], "issue.number")?
        }
        // These run the workflow of the pull request's merge commit (`refs/pull/N/merge`),
        // as `pull_request` does: its steps can write the event file cibox reads.
        "pull_request" | "pull_request_review" | "pull_request_review_comment" => {
            return Err(format!(
                "a {name} run's workflow is the pull request's own: so is its event file"
            ));
        }
        other => {
            return Err(format!(
                "a {} event is no pull request's",
                crate::util::escape(other)
            ));
        }
    };
    same_repository(&v["repository"]["full_name"], repository, "repository")?;
    // `refs/pull/N/merge` (or `/head`): the same N.
    if let Some(r) = git_ref
        && let Some(rest) = r.strip_prefix("refs/pull/")
        && rest.split('/').next() != Some(number.to_string().as_str())
    {
        return Err(format!(
            "GITHUB_REF ({}) names another pull request than the event's ({number})",
            crate::util::escape(r)
        ));
    }
    Ok(number)
}

/// The largest pull request number believed (GitHub's are far below it).
pub const MAX_PULL_REQUEST: u64 = 1 << 31;

/// The event's repository (`at`, `full_name`) is the run's (`GITHUB_REPOSITORY`).
fn same_repository(
    at: &serde_json::Value,
    repository: Option<&str>,
    what: &str,
) -> Result<(), String> {
    let Some(repository) = repository else {
        return Err("GITHUB_REPOSITORY is not set".into());
    };
    match at.as_str() {
        Some(r) if r.eq_ignore_ascii_case(repository) => Ok(()),
        _ => Err(format!(
            "the event file's {what} ({}) is not this run's repository ({})",
            crate::util::escape(&at.to_string()),
            crate::util::escape(repository)
        )),
    }
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
    use super::pull_request_of;

    const HEAD: &str = "0123456789abcdef0123456789abcdef01234567";

    fn target(number: &str, pr_number: &str, repo: &str) -> String {
        format!(
            r#"{{"action":"labeled","number":{number},"pull_request":{{"number":{pr_number},"head":{{"sha":"{HEAD}"}},"base":{{"repo":{{"full_name":"{repo}"}}}}}},"repository":{{"full_name":"{repo}"}}}}"#
        )
    }

    #[test]
    fn a_pull_requests_number_is_believed_only_where_the_event_agrees_with_itself() {
        let ok = target("7", "7", "THUDM/slime");
        let of = |name, text: &str, r, repo, sha| pull_request_of(name, text, r, repo, sha);
        let repo = Some("thudm/slime");
        assert_eq!(
            of(
                "pull_request_target",
                &ok,
                Some("refs/heads/main"),
                repo,
                Some(HEAD)
            ),
            Ok(7)
        );
        assert_eq!(of("pull_request_target", &ok, None, repo, None), Ok(7));
        for (name, text, git_ref, repository, sha, want) in [
            (
                "pull_request_target",
                target("8", "7", "THUDM/slime"),
                None,
                repo,
                None,
                "number (8) is not its pull request's (7)",
            ),
            (
                "pull_request_target",
                ok.clone(),
                Some("refs/pull/8/merge"),
                repo,
                None,
                "names another pull request",
            ),
            (
                "pull_request_target",
                ok.clone(),
                None,
                Some("mallory/slime"),
                None,
                "is not this run's repository",
            ),
            (
                "pull_request_target",
                target("7", "7", "mallory/slime"),
                None,
                repo,
                None,
                "is not this run's repository",
            ),
            (
                "pull_request_target",
                ok.clone(),
                None,
                None,
                None,
                "GITHUB_REPOSITORY is not set",
            ),
            (
                "pull_request_target",
                ok.clone(),
                None,
                repo,
                Some("ffffffffffffffffffffffffffffffffffffffff"),
                "neither the pull request's head",
            ),
            (
                "pull_request",
                ok.clone(),
                None,
                repo,
                None,
                "the pull request's own",
            ),
            (
                "workflow_dispatch",
                ok.clone(),
                None,
                repo,
                None,
                "no pull request's",
            ),
            (
                "issue_comment",
                r#"{"issue":{"number":7},"repository":{"full_name":"THUDM/slime"}}"#.to_string(),
                None,
                repo,
                None,
                "not a pull request",
            ),
        ] {
            let e = of(name, &text, git_ref, repository, sha).unwrap_err();
            assert!(e.contains(want), "{name} {text}: {e}");
        }
        let comment =
            r#"{"issue":{"number":9,"pull_request":{}},"repository":{"full_name":"THUDM/slime"}}"#;
        assert_eq!(of("issue_comment", comment, None, repo, None), Ok(9));
    }

    #[test]
    fn an_event_without_a_pull_requests_number_is_refused() {
        let repo = Some("thudm/slime");
        for (text, want) in [
            (
                target("\"7\"", "\"7\"", "THUDM/slime"),
                "not a pull request's number",
            ),
            (
                target("0", "0", "THUDM/slime"),
                "not a pull request's number",
            ),
            (
                target("-7", "-7", "THUDM/slime"),
                "not a pull request's number",
            ),
            (
                target("99999999999", "99999999999", "THUDM/slime"),
                "not a pull request's number",
            ),
            (
                target("7.5", "7.5", "THUDM/slime"),
                "not a pull request's number",
            ),
            ("{}".to_string(), "not a pull request's number"),
            ("not json".to_string(), "not JSON"),
        ] {
            let e = pull_request_of("pull_request_target", &text, None, repo, None).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    /// Issue 38, attack: a `pull_request_review(_comment)` run, like a `pull_request`
    /// one, runs the workflow of the pull request's merge commit (`refs/pull/N/merge`):
    /// its steps are the pull request's, and can write the event file and every
    /// variable before cibox reads them. Pull request 9's review run claimed 7's number
    /// and wrote into 7's scope.
    #[test]
    fn a_review_runs_workflow_is_the_pull_requests_own_so_is_its_event_file() {
        let ok = target("7", "7", "THUDM/slime");
        for name in ["pull_request_review", "pull_request_review_comment"] {
            let e = pull_request_of(
                name,
                &ok,
                Some("refs/pull/7/merge"),
                Some("THUDM/slime"),
                Some(HEAD),
            )
            .unwrap_err();
            assert!(e.contains("the pull request's own"), "{name}: {e}");
        }
    }

    /// Issue 38, attack: with a git checkout, the commit tested must be the event's
    /// head or merge commit; an event that names neither (no `head.sha`, or not a
    /// string) was believed without the check.
    #[test]
    fn with_a_checkout_an_event_naming_no_head_is_believed_for_nothing() {
        let of = |text: &str| {
            pull_request_of(
                "pull_request_target",
                text,
                None,
                Some("THUDM/slime"),
                Some(HEAD),
            )
        };
        for head in [
            r#""#,
            r#""head":{},"#,
            r#""head":{"sha":null},"#,
            r#""head":{"sha":7},"#,
        ] {
            let text = format!(
                r#"{{"number":7,"pull_request":{{"number":7,{head}"base":{{"repo":{{"full_name":"THUDM/slime"}}}}}},"repository":{{"full_name":"THUDM/slime"}}}}"#
            );
            let e = of(&text).unwrap_err();
            assert!(e.contains("neither the pull request's head"), "{text}: {e}");
        }
        // Its merge commit alone is enough.
        let text = format!(
            r#"{{"number":7,"pull_request":{{"number":7,"merge_commit_sha":"{HEAD}","base":{{"repo":{{"full_name":"THUDM/slime"}}}}}},"repository":{{"full_name":"THUDM/slime"}}}}"#
        );
        assert_eq!(of(&text), Ok(7));
        // Without a checkout there is no commit to compare.
        let text = r#"{"number":7,"pull_request":{"number":7,"base":{"repo":{"full_name":"THUDM/slime"}}},"repository":{"full_name":"THUDM/slime"}}"#;
        assert_eq!(
            pull_request_of("pull_request_target", text, None, Some("THUDM/slime"), None),
            Ok(7)
        );
    }

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
