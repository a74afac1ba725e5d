//! script-injection: text an outsider controls inlined into a script: a `run:` script,
//! or the JavaScript of actions/github-script. Reported on self-hosted runners, and
//! anywhere under a privileged trigger, whatever the guard (a guard limits who, not what
//! a value holds).

use std::collections::BTreeSet;

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::expr;
use crate::workflow::lint::facts::env::env_value;
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::facts::steps::{StepBody, StepView, is_action};
use crate::workflow::lint::rule::Severity;

pub(crate) struct ScriptInjection;

audit_meta!(
    ScriptInjection,
    "script-injection",
    Severity::Error,
    "Text an outsider controls pasted into a script, or run as code",
    "An expression whose value an outsider writes (a title, a body, a branch name, a commit message, a step or job output, a computed matrix value, an input filled from those, an env variable set from them or through $GITHUB_ENV) is pasted into a run: script or github-script, where it becomes code; or such text is run from a file or a variable. Pass values through env: and quote them as data."
);

impl Audit for ScriptInjection {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        let wf = job.wf;
        if wf.triggers.is_empty() || (job.runner.is_none() && !wf.privileged_trigger) {
            return;
        }
        for (i, step) in job.steps.iter().enumerate() {
            check_step(job, i, step, emit);
        }
        // Attacker text that an earlier step or line put in a file or variable, run.
        for sink in &job.flows.runs {
            let step = &job.steps[sink.step];
            emit.step(
                step,
                step.text_at(wf.src, &["run"], &sink.line),
                format!(
                    "{}, which holds text an outsider controls ({}): treat such text as data, never run it",
                    sink.what, sink.why
                ),
            );
        }
    }
}

/// Why a context path an expression of step `index` reads is untrusted, if it is:
/// attacker text, or an `env.X` an earlier step wrote to `$GITHUB_ENV` from some.
fn why(job: &JobFacts<'_>, index: usize, step: &StepView<'_>, path: &str) -> Option<String> {
    if let Some(name) = path.strip_prefix("env.")
        && let Some(why) = job.flows.env_why(step, index, name)
    {
        return Some(format!("`{path}` is the variable {why}"));
    }
    job.taint.why(path, step.envs(), &step.inputs.tainted, 4)
}

/// Each expression in one step's script that reads an untrusted value, once.
fn check_step(job: &JobFacts<'_>, index: usize, step: &StepView<'_>, emit: &mut Emit<'_>) {
    // A shell script, or the JavaScript of actions/github-script.
    let (script, key) = match step.body {
        StepBody::Run(run) => (run.run.to_string(), "run"),
        StepBody::Uses(u) if is_action(u.uses, "actions/github-script") => {
            match env_value(u.with, "script") {
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
                .find_map(|p| why(job, index, step, p)),
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
            let shown: String = expr::one_line(e.raw);
            emit.step(
                step,
                step.text_at(job.wf.src, &[key], e.raw.lines().next().unwrap_or(e.raw)),
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
    use crate::workflow::lint::audit::testing::{all_are, findings, findings_with, lines};

    #[test]
    fn an_issue_title_pasted_into_a_script_once() {
        let f = findings(
            &ScriptInjection,
            "on: issues\njobs:\n  triage:\n    runs-on: ubuntu-latest\n    steps:\n      - run: |\n          echo \"${{ github.event.issue.title }}\"\n          echo \"${{ github.event.issue.title }}\"\n",
        );
        all_are(&f, ScriptInjection::RULE);
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

    /// Through `$GITHUB_ENV` into a later `${{ env.X }}`, through a file into `bash`,
    /// through a variable into `eval`.
    /// SGLang's check-changes pattern: dorny/paths-filter's flags and a literal word
    /// written to `$GITHUB_OUTPUT`, carried through job outputs, a called workflow's
    /// outputs and a typed input, are no outsider's text; file names and a script's
    /// computed value are.
    #[test]
    fn flags_counts_and_typed_inputs_are_no_attacker_text() {
        let check = "on:\n  workflow_call:\n    outputs:\n      kernel: {value: \"${{ jobs.run.outputs.kernel }}\"}\n      files: {value: \"${{ jobs.run.outputs.files }}\"}\njobs:\n  run:\n    runs-on: ubuntu-latest\n    outputs:\n      kernel: ${{ steps.filter.outputs.kernel || steps.mode.outputs.all }}\n      files: ${{ steps.filter.outputs.kernel_files }}\n    steps:\n      - id: mode\n        run: |\n          if [ -n \"$X\" ]; then echo \"all=true\" >> $GITHUB_OUTPUT; else echo all=false >> \"$GITHUB_OUTPUT\"; fi\n      - id: filter\n        uses: dorny/paths-filter@v3\n        with: {filters: \"kernel: ['k/**']\"}\n";
        let stage = "on:\n  workflow_call:\n    inputs:\n      kernel: {type: string, required: true}\n      count: {type: number, required: true}\n      name: {type: string, required: true}\njobs:\n  t:\n    runs-on: [self-hosted, gpu]\n    steps:\n      - run: |\n          ./install.sh ${{ inputs.kernel }} ${{ inputs.count }}\n          echo ${{ inputs.name }}\n";
        let caller = "on: pull_request\njobs:\n  check:\n    uses: ./.github/workflows/check.yml\n  local:\n    runs-on: ubuntu-latest\n    outputs:\n      n: ${{ steps.count.outputs.n }}\n    steps:\n      - id: count\n        run: echo \"n=$(ls | wc -l)\" >> $GITHUB_OUTPUT\n  stage:\n    needs: [check, local]\n    uses: ./.github/workflows/stage.yml\n    with:\n      kernel: ${{ needs.check.outputs.kernel }}\n      count: ${{ needs.local.outputs.n }}\n      name: ${{ needs.check.outputs.files }}\n";
        let f = findings_with(
            &ScriptInjection,
            caller,
            &[("check.yml", check), ("stage.yml", stage)],
        );
        // Only the file names: the flag is a flag, and the count a typed number.
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert!(
            f[0].message.contains("`${{ inputs.name }}`")
                && f[0].message.contains("needs.check.outputs.files"),
            "{:#?}",
            lines(&f)
        );
    }

    #[test]
    fn carried_between_steps_then_pasted_or_run() {
        let f = findings(
            &ScriptInjection,
            "on: issue_comment\njobs:\n  t:\n    runs-on: [self-hosted]\n    env:\n      BODY: ${{ github.event.comment.body }}\n    steps:\n      - run: |\n          echo \"CMD=$BODY\" >> $GITHUB_ENV\n          echo \"$BODY\" > run.sh\n      - run: echo ${{ env.CMD }}\n      - run: bash ./run.sh\n      - run: eval \"$BODY\"\n",
        );
        let got = lines(&f);
        assert_eq!(got.len(), 3, "{got:#?}");
        assert!(
            got[0].starts_with("script-injection 11:19 job t: `${{ env.CMD }}` is pasted into the script: `env.cmd` is the variable which step 1 wrote to `$GITHUB_ENV` from `$BODY` holds"),
            "{got:#?}"
        );
        assert!(
            got[1].starts_with("script-injection 12:14 job t: runs `run.sh`, which holds text an outsider controls (step 1 wrote it from `$BODY` holds"),
            "{got:#?}"
        );
        assert!(
            got[2].starts_with("script-injection 13:14 job t: runs `$BODY` as code, which holds text an outsider controls"),
            "{got:#?}"
        );
        // The step's own `env:` sets CMD again: that value is read, not the file's.
        let f = findings(
            &ScriptInjection,
            "on: issue_comment\njobs:\n  t:\n    runs-on: [self-hosted]\n    steps:\n      - env: {B: \"${{ github.event.comment.body }}\"}\n        run: echo \"CMD=$B\" >> $GITHUB_ENV\n      - env: {CMD: make}\n        run: echo ${{ env.CMD }}\n",
        );
        assert!(f.is_empty(), "{:#?}", lines(&f));
    }

    /// A composite action's steps run in the calling job: an input filled with attacker
    /// text, pasted into one of them, is reported in the action's file.
    #[test]
    fn in_a_local_composite_action() {
        let action = "inputs:\n  title: {default: x}\nruns:\n  using: composite\n  steps:\n    - shell: bash\n      run: echo \"${{ inputs.title }}\"\n";
        let f = findings_with(
            &ScriptInjection,
            "on: pull_request_target\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v4\n      - name: Greet\n        uses: ./.github/actions/greet\n        with: {title: \"${{ github.event.pull_request.title }}\"}\n",
            &[(".github/actions/greet/action.yml", action)],
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert_eq!(f[0].file, ".github/actions/greet/action.yml");
        assert_eq!((f[0].line, f[0].col), (7, 18));
        let step = f[0].step.as_ref().unwrap();
        assert_eq!(step.number, 2);
        assert_eq!(
            step.name,
            "Greet › .github/actions/greet/action.yml step 1 (echo \"${{ inputs.title }}\")"
        );
        // The default of an input not given, read as the action's caller's event.
        let action = action.replace("default: x", "default: \"${{ github.head_ref }}\"");
        let f = findings_with(
            &ScriptInjection,
            "on: pull_request_target\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps: [{uses: ./.github/actions/greet}]\n",
            &[(".github/actions/greet/action.yml", &action)],
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
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
