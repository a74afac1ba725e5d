//! runner-secret-file: a self-hosted job that an outsider's event starts reads a
//! credential from a file on the runner into its scripts (`-e HF_TOKEN="$(cat
//! ~/huggingface_token.txt)"`, `--env-file ~/.env`). GitHub withholds a repository's
//! secrets from a fork's pull request run; a file on the runner it cannot withhold, and
//! the pull request's code, running in that job, reads it.

use std::sync::LazyLock;

use regex::Regex;

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::facts::shell::logical_lines;
use crate::workflow::lint::facts::steps::StepBody;
use crate::workflow::lint::facts::triggers::names;
use crate::workflow::lint::rule::Severity;

pub(crate) struct RunnerSecretFile;

audit_meta!(
    RunnerSecretFile,
    "runner-secret-file",
    Severity::Error,
    "A credential file on a self-hosted runner read in a job outsiders can start",
    "A self-hosted job that an outsider's event (a fork's pull request, a comment) starts without a guard reads a file on the runner that holds a credential ($(cat ~/token.txt), --env-file): GitHub withholds repository secrets from a fork's run, but not the runner's files, and the pull request's code runs in that job. Guard the job, or keep the credential out of jobs that run outsiders' code."
);

/// A file a script reads into its text: `$(cat F)`, `$(< F)`, `` `cat F` ``, or hands a
/// container whole: `--env-file F`. The file is the first group that matched.
static READS_FILE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"\$\(\s*(?:cat\s+|<\s*)["']?([^)"'\s]+)["']?\s*\)|`\s*cat\s+["']?([^`"'\s]+)["']?\s*`|--env-file[=\s]+["']?([^"'\s]+)"#,
    )
    .expect("valid regex")
});

/// Whether a path names a file on the runner (absolute, or under its user's home), not
/// one of the checkout, which the pull request wrote anyway.
fn on_the_runner(path: &str) -> bool {
    ["/", "~", "$HOME", "${HOME}"]
        .iter()
        .any(|p| path.starts_with(p))
        && !path.contains("GITHUB_WORKSPACE")
        && !path.contains("github.workspace")
}

/// Whether a file's name says it holds a credential.
fn names_a_credential(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    [
        "token",
        "secret",
        "passw",
        "credential",
        "apikey",
        "api_key",
        "api-key",
        ".netrc",
        ".env",
        "auth",
    ]
    .iter()
    .any(|w| name.contains(w))
}

/// The credential files a script reads, each with the text that reads it.
fn credential_reads(script: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in logical_lines(script) {
        for c in READS_FILE.captures_iter(&line) {
            let Some(path) = c.get(1).or(c.get(2)).or(c.get(3)) else {
                continue;
            };
            let path = path.as_str();
            if on_the_runner(path) && names_a_credential(path) {
                out.push((path.to_string(), c[0].to_string()));
            }
        }
    }
    out
}

impl Audit for RunnerSecretFile {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        if job.runner.is_none() || job.open.is_empty() {
            return;
        }
        for step in &job.steps {
            let StepBody::Run(run) = step.body else {
                continue;
            };
            for (path, text) in credential_reads(run.run) {
                let first_line = text.lines().next().unwrap_or(&text).to_string();
                emit.step(
                    step,
                    step.text_at(job.wf.src, &["run"], &first_line),
                    format!(
                        "reads `{path}`, a credential file on the self-hosted runner, in a job that an outsider's {} starts without a guard: GitHub withholds secrets from a fork's run, not the runner's files, and the pull request's code runs here; guard the job or keep the file out of it",
                        names(job.open)
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RunnerSecretFile;
    use crate::workflow::lint::audit::testing::{all_are, findings, lines};

    /// SGLang's pr-test-xeon.yml, cut down: a pull request's build on a self-hosted
    /// runner given the runner's Hugging Face token.
    #[test]
    fn a_token_file_handed_to_a_pull_requests_container() {
        let text = "on: pull_request\njobs:\n  t:\n    runs-on: xeon-gnr\n    timeout-minutes: 60\n    steps:\n      - uses: actions/checkout@v4\n      - run: |\n          docker run -dt \\\n            -e HF_TOKEN=\"$(cat ~/huggingface_token.txt)\" \\\n            sglang_xeon\n      - run: export KEY=`cat $HOME/.secrets/api_key` && ./t\n      - run: docker run --env-file=/etc/ci/.env img\n";
        let f = findings(&RunnerSecretFile, text);
        all_are(&f, RunnerSecretFile::RULE);
        assert_eq!(f.len(), 3, "{:#?}", lines(&f));
        assert!(
            lines(&f)[0].starts_with("runner-secret-file 10:26 job t: reads `~/huggingface_token.txt`, a credential file on the self-hosted runner, in a job that an outsider's pull_request starts without a guard"),
            "{:#?}",
            lines(&f)
        );
        assert!(lines(&f)[1].contains("`$HOME/.secrets/api_key`"));
        assert!(lines(&f)[2].contains("`/etc/ci/.env`"));
    }

    #[test]
    fn a_guarded_job_a_hosted_runner_or_a_file_of_the_checkout_is_not_flagged() {
        for text in [
            // Guarded: only the repository's own branches.
            "on: pull_request\njobs:\n  t:\n    if: github.event.pull_request.head.repo.full_name == github.repository\n    runs-on: [self-hosted]\n    timeout-minutes: 5\n    steps:\n      - run: export HF_TOKEN=\"$(cat ~/huggingface_token.txt)\"\n",
            // Nobody outside starts it.
            "on: push\njobs:\n  t:\n    runs-on: [self-hosted]\n    timeout-minutes: 5\n    steps:\n      - run: export HF_TOKEN=\"$(cat ~/huggingface_token.txt)\"\n",
            // A hosted runner has no such file.
            "on: pull_request\njobs:\n  t:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: export HF_TOKEN=\"$(cat ~/huggingface_token.txt)\"\n",
            // Files that are no credential, or the checkout's own.
            "on: pull_request\njobs:\n  t:\n    runs-on: [self-hosted]\n    timeout-minutes: 5\n    steps:\n      - run: v=$(cat python/sglang/version.py) && n=$(cat /proc/cpuinfo)\n      - run: t=$(cat tests/token_cases.txt)\n",
        ] {
            let f = findings(&RunnerSecretFile, text);
            assert!(f.is_empty(), "{text}\n{:#?}", lines(&f));
        }
    }
}
