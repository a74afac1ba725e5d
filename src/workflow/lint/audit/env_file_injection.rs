//! env-file-injection: attacker text written to `$GITHUB_ENV` or `$GITHUB_PATH` by a
//! step's script ([`JobFacts::flows`]). A newline in the text sets any variable for every
//! later step (`BASH_ENV`, `LD_PRELOAD` and `NODE_OPTIONS` run code), and `${{ env.X }}`
//! pastes it into later scripts; a folder in `$GITHUB_PATH` supplies later commands.
//! Also `ACTIONS_ALLOW_UNSECURE_COMMANDS`: with it, any text a step prints (a title, the
//! output of the pull request's code) sets variables through `::set-env`. Reported where
//! script-injection is: on self-hosted runners, and anywhere under a privileged trigger.

use github_actions_models::common::Env;
use github_actions_models::common::expr::LoE;

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::facts::env::env_text;
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::rule::Severity;
use crate::yaml::Mark;

pub(crate) struct EnvFileInjection;

audit_meta!(
    EnvFileInjection,
    "env-file-injection",
    Severity::Error,
    "Text an outsider controls written to $GITHUB_ENV or $GITHUB_PATH",
    "A step writes text an outsider controls to $GITHUB_ENV (a newline in it sets any variable for every later step, and BASH_ENV, LD_PRELOAD or NODE_OPTIONS run code) or to $GITHUB_PATH (later commands come from a folder it names). Give each step that needs the value its own env: instead."
);

impl Audit for EnvFileInjection {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        let wf = job.wf;
        if wf.triggers.is_empty() || (job.runner.is_none() && !wf.privileged_trigger) {
            return;
        }
        for (mark, level) in unsecure_commands(job) {
            emit.job(
                mark,
                format!(
                    "{level} sets `ACTIONS_ALLOW_UNSECURE_COMMANDS`: any text a step prints (a title, the output of the pull request's code) can then set variables with `::set-env` (`BASH_ENV`, `NODE_OPTIONS` run code) and add to the PATH: remove it"
                ),
            );
        }
        for sink in &job.flows.env_writes {
            let step = &job.steps[sink.step];
            let effect = if sink.what == "$GITHUB_PATH" {
                "later steps run their commands from a folder it names"
            } else {
                "a newline in it sets any variable for every later step (`BASH_ENV`, `LD_PRELOAD`, `NODE_OPTIONS` run code), and `${{ env.X }}` pastes it into later scripts"
            };
            emit.step(
                step,
                step.text_at(wf.src, &["run"], &sink.line),
                format!(
                    "writes text an outsider controls to `{}` ({}): {effect}; give the steps that need it the value through their own `env:` instead",
                    sink.what, sink.why
                ),
            );
        }
    }
}

/// Where the job, its workflow or its steps turn the old `::set-env` and `::add-path`
/// commands back on.
fn unsecure_commands(job: &JobFacts<'_>) -> Vec<(Mark, &'static str)> {
    let on = |env: &LoE<Env>| {
        env_text(env).iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("ACTIONS_ALLOW_UNSECURE_COMMANDS")
                && !v.trim().eq_ignore_ascii_case("false")
        })
    };
    let src = job.wf.src;
    let mut out = Vec::new();
    if on(&job.wf.workflow.env) {
        out.push((
            src.at(&["env", "ACTIONS_ALLOW_UNSECURE_COMMANDS"]),
            "the workflow",
        ));
    }
    if on(&job.job.env) {
        out.push((
            src.at(&["jobs", job.id, "env", "ACTIONS_ALLOW_UNSECURE_COMMANDS"]),
            "the job",
        ));
    }
    for step in &job.steps {
        if on(step.env()) {
            out.push((step.at(src, &["env"]), "a step"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::EnvFileInjection;
    use crate::workflow::lint::audit::testing::{all_are, findings, findings_with, lines};

    #[test]
    fn a_title_through_env_into_github_env() {
        let f = findings(
            &EnvFileInjection,
            "on: pull_request_target\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - env:\n          TITLE: ${{ github.event.pull_request.title }}\n        run: |\n          echo \"TITLE=$TITLE\" >> \"$GITHUB_ENV\"\n",
        );
        all_are(&f, EnvFileInjection::RULE);
        assert_eq!(
            lines(&f),
            [
                "env-file-injection 9:11 job t: writes text an outsider controls to `$GITHUB_ENV` (`$TITLE` holds `github.event.pull_request.title` is written by whoever opened the event): a newline in it sets any variable for every later step (`BASH_ENV`, `LD_PRELOAD`, `NODE_OPTIONS` run code), and `${{ env.X }}` pastes it into later scripts; give the steps that need it the value through their own `env:` instead"
            ]
        );
    }

    #[test]
    fn read_from_the_payload_a_heredoc_group_and_the_path() {
        let f = findings(
            &EnvFileInjection,
            "on: issue_comment\njobs:\n  t:\n    runs-on: [self-hosted]\n    steps:\n      - run: |\n          BODY=$(jq -r .comment.body \"$GITHUB_EVENT_PATH\")\n          {\n            echo 'BODY<<EOF'\n            echo \"$BODY\"\n            echo EOF\n          } >> \"$GITHUB_ENV\"\n      - env: {DIR: \"${{ github.event.comment.body }}\"}\n        run: echo \"$DIR\" >> $GITHUB_PATH\n",
        );
        let got = lines(&f);
        assert_eq!(got.len(), 2, "{got:#?}");
        assert!(got[0].starts_with("env-file-injection 8:11 job t: writes text an outsider controls to `$GITHUB_ENV` (`$BODY` holds text read from the event's payload"), "{got:#?}");
        assert!(got[1].contains("`$GITHUB_PATH`"), "{got:#?}");
        assert!(got[1].contains("from a folder it names"), "{got:#?}");
    }

    #[test]
    fn in_a_composite_action_the_finding_names_its_file() {
        let action = "runs:\n  using: composite\n  steps:\n    - shell: bash\n      env: {T: \"${{ inputs.t }}\"}\n      run: echo \"T=$T\" >> $GITHUB_ENV\n";
        let f = findings_with(
            &EnvFileInjection,
            "on: pull_request_target\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: ./.github/actions/x\n        with: {t: \"${{ github.head_ref }}\"}\n",
            &[(".github/actions/x/action.yml", action)],
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert_eq!(f[0].file, ".github/actions/x/action.yml");
        assert_eq!((f[0].line, f[0].col), (6, 12));
        assert!(f[0].message.contains("`inputs.t`"), "{:#?}", lines(&f));
    }

    #[test]
    fn unsecure_commands_turned_back_on() {
        let f = findings(
            &EnvFileInjection,
            "on: pull_request_target\nenv:\n  ACTIONS_ALLOW_UNSECURE_COMMANDS: true\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps: [{run: make}]\n",
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert_eq!((f[0].line, f[0].col), (3, 36));
        assert!(
            f[0].message
                .starts_with("the workflow sets `ACTIONS_ALLOW_UNSECURE_COMMANDS`"),
            "{:#?}",
            lines(&f)
        );
    }

    #[test]
    fn trusted_values_and_unprivileged_hosted_jobs_are_not_flagged() {
        for text in [
            "on: pull_request_target\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - env: {N: \"${{ github.event.pull_request.number }}\"}\n        run: echo \"N=$N\" >> $GITHUB_ENV\n",
            "on: pull_request\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - env: {T: \"${{ github.event.pull_request.title }}\"}\n        run: echo \"T=$T\" >> $GITHUB_ENV\n",
            // Into a step output: other outputs at worst, and those are untrusted anyway.
            "on: pull_request_target\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - env: {T: \"${{ github.event.pull_request.title }}\"}\n        run: echo \"t=$T\" >> $GITHUB_OUTPUT\n",
        ] {
            let f = findings(&EnvFileInjection, text);
            assert!(f.is_empty(), "{text}\n{:#?}", lines(&f));
        }
    }
}
