//! script-injection: text an outsider controls inlined into a script: a `run:` script,
//! or the JavaScript of actions/github-script. Reported on self-hosted runners, and
//! anywhere under a privileged trigger, whatever the guard (a guard limits who, not what
//! a value holds).

use std::collections::BTreeSet;

use super::{Audit, Emit};
use crate::workflow::lint::Rule;
use crate::workflow::lint::expr;
use crate::workflow::lint::facts::env::env_value;
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::facts::steps::{StepBody, StepView, is_action};
use crate::workflow::lint::facts::taint::Taint;

pub(crate) struct ScriptInjection;

impl Audit for ScriptInjection {
    fn rule(&self) -> Rule {
        Rule::ScriptInjection
    }

    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        let wf = job.wf;
        if wf.triggers.is_empty() || (job.runner.is_none() && !wf.privileged_trigger) {
            return;
        }
        let taint = Taint::new(wf.workflow, job.job, &wf.scope.tainted_inputs);
        for step in &job.steps {
            check_step(job, &taint, step, emit);
        }
    }
}

/// Each expression in one step's script that reads an untrusted value, once.
fn check_step(job: &JobFacts<'_>, taint: &Taint<'_>, step: &StepView<'_>, emit: &mut Emit<'_>) {
    // A shell script, or the JavaScript of actions/github-script.
    let (script, key) = match step.body {
        StepBody::Run(run) => (run.run.clone(), "run"),
        StepBody::Uses(u) if is_action(&u.uses, "actions/github-script") => {
            match env_value(&u.with, "script") {
                Some(v) => (v.to_string(), "with"),
                None => return,
            }
        }
        StepBody::Uses(_) => return,
    };
    let use_instead = if key == "run" {
        "\"$VAR\""
    } else {
        "process.env.VAR"
    };
    let mut seen = BTreeSet::new();
    for e in expr::embedded(&script) {
        let why = match expr::parse(e.body) {
            Ok(parsed) => expr::value_paths(&parsed)
                .iter()
                .find_map(|p| taint.why(p, step.env(), 4)),
            // Fail closed: what we cannot read, we cannot call safe.
            Err(expr::Unparsed::TooLong) => Some(format!(
                "it is longer than {} bytes, too long to check",
                expr::MAX_EXPRESSION_BYTES
            )),
            Err(expr::Unparsed::Invalid(_)) => None,
        };
        if let Some(why) = why
            && seen.insert(e.raw)
        {
            let mut run_path = step.path.clone();
            run_path.push(key.into());
            let shown: String = expr::one_line(e.raw);
            emit.step(
                &step.label,
                job.wf
                    .src
                    .text_at(&run_path, e.raw.lines().next().unwrap_or(e.raw)),
                format!(
                    "`{shown}` is pasted into the script: {why}; pass it through `env:` and use {use_instead}"
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ScriptInjection;
    use crate::workflow::lint::Rule;
    use crate::workflow::lint::audit::testing::{all_are, findings, findings_with, lines};

    #[test]
    fn an_issue_title_pasted_into_a_script_once() {
        let f = findings(
            &ScriptInjection,
            "on: issues\njobs:\n  triage:\n    runs-on: ubuntu-latest\n    steps:\n      - run: |\n          echo \"${{ github.event.issue.title }}\"\n          echo \"${{ github.event.issue.title }}\"\n",
        );
        all_are(&f, Rule::ScriptInjection);
        assert_eq!(
            lines(&f),
            [
                "script-injection 7:17 job triage: `${{ github.event.issue.title }}` is pasted into the script: `github.event.issue.title` is written by whoever opened the event; pass it through `env:` and use \"$VAR\""
            ]
        );
    }

    #[test]
    fn through_env_a_computed_matrix_and_github_script() {
        let f = findings(
            &ScriptInjection,
            "on: pull_request\nenv:\n  T: ${{ github.head_ref }}\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    strategy:\n      matrix:\n        k: ${{ fromJSON(needs.a.outputs.k) }}\n    steps:\n      - run: echo ${{ env.T }} ${{ matrix.k }}\n      - uses: actions/github-script@v7\n        with:\n          script: console.log(\"${{ github.event.pull_request.body }}\")\n",
        );
        let got = lines(&f);
        assert_eq!(got.len(), 3, "{got:#?}");
        assert!(
            got[0].contains("`env.t` is set from `github.head_ref`"),
            "{got:#?}"
        );
        assert!(got[1].contains("this matrix value is computed"), "{got:#?}");
        assert!(got[2].contains("use process.env.VAR"), "{got:#?}");
    }

    #[test]
    fn an_input_the_caller_fills_with_attacker_text() {
        let callee = "on: workflow_call\njobs:\n  inner:\n    runs-on: [self-hosted]\n    steps: [{run: \"echo ${{ inputs.title }}\"}]\n";
        let f = findings_with(
            &ScriptInjection,
            "on: pull_request\njobs:\n  call:\n    uses: ./.github/workflows/inner.yml\n    with:\n      title: ${{ github.event.pull_request.title }}\n",
            &[("inner.yml", callee)],
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert_eq!(f[0].file, "inner.yml");
        assert_eq!(f[0].called_by, ["test.yml job call"]);
        assert!(
            f[0].message
                .contains("the caller fills `inputs.title` from `github.event.pull_request.title`"),
            "{:#?}",
            lines(&f)
        );
    }

    #[test]
    fn trusted_values_env_use_and_hosted_unprivileged_jobs_are_not_flagged() {
        for text in [
            "on: pull_request_target\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps: [{run: \"echo ${{ github.event.pull_request.number }} ${{ github.repository }}\"}]\n",
            "on: issues\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo \"$TITLE\"\n        env:\n          TITLE: ${{ github.event.issue.title }}\n",
            // A fork's pull_request on GitHub's runner: nothing of ours to reach.
            "on: pull_request\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps: [{run: \"echo ${{ github.event.pull_request.title }}\"}]\n",
            "on: push\njobs:\n  t:\n    runs-on: [self-hosted]\n    steps: [{run: \"echo ${{ github.event.head_commit.message }}\"}]\n",
        ] {
            let f = findings(&ScriptInjection, text);
            assert!(f.is_empty(), "{text}\n{:#?}", lines(&f));
        }
    }
}
