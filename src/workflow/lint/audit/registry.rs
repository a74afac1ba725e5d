//! The rules `workflow lint` runs, each listed once. A rule's line here is all it takes
//! beyond its own file (and that file's `mod` line).
//!
//! The order is the one SARIF lists the rules in (after the loader's `unparsable`), and
//! the one findings at the same line and column are sorted by: the order of the enum the
//! rules were before they had files of their own, kept so the output stays byte for
//! byte. It is also the order the rules run in on each job, which shows nowhere: each
//! rule's findings are made job by job, then sorted stably by place and rule.

use super::Audit;
use crate::workflow::lint::rule::Rule;

/// Every audit, once. A job that calls a reusable workflow meets only secrets-exposed
/// and unchecked-call (their `check_call`); the others look at jobs that run steps.
pub(crate) const AUDITS: &[&dyn Audit] = &[
    &super::untrusted_self_hosted::UntrustedSelfHosted,
    &super::pr_head_checkout::PrHeadCheckout,
    &super::script_injection::ScriptInjection,
    &super::env_file_injection::EnvFileInjection,
    &super::write_permissions::WritePermissions,
    &super::secrets_exposed::SecretsExposed,
    &super::untrusted_artifact::UntrustedArtifact,
    &super::no_timeout::NoTimeout,
    &super::unchecked_call::UncheckedCall,
    &super::unpinned_image::UnpinnedImage,
    &super::runner_secret_file::RunnerSecretFile,
    &super::wait_past_timeout::WaitPastTimeout,
];

/// Every rule a finding can carry, in SARIF's order: the loader's `unparsable`, then the
/// audits'.
pub(crate) fn rules() -> impl Iterator<Item = Rule> {
    std::iter::once(Rule::Unparsable).chain(AUDITS.iter().map(|a| a.rule()))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{AUDITS, rules};
    use crate::workflow::lint::audit::testing::lines;
    use crate::workflow::lint::lint_source;
    use crate::workflow::lint::rule::Rule;

    #[test]
    fn every_rule_has_an_id_of_its_own_and_says_what_it_is() {
        let ids: Vec<&str> = rules().map(Rule::id).collect();
        let unique: BTreeSet<&str> = ids.iter().copied().collect();
        assert_eq!(unique.len(), ids.len(), "{ids:?}");
        assert_eq!(ids.len(), AUDITS.len() + 1, "{ids:?}");
        assert!(AUDITS.iter().all(|a| a.rule() != Rule::Unparsable));
        for rule in rules() {
            let id = rule.id();
            assert!(
                !id.is_empty()
                    && !id.starts_with('-')
                    && !id.ends_with('-')
                    && !id.contains("--")
                    && id.chars().all(|c| c.is_ascii_lowercase() || c == '-'),
                "not kebab-case: {id:?}"
            );
            assert!(
                !rule.summary().is_empty() && !rule.summary().contains('\n'),
                "{id}: a summary is one line"
            );
            assert!(
                rule.help().len() > rule.summary().len(),
                "{id}: help says more"
            );
        }
    }

    /// All the rules on one workflow, through `lint_source`: findings in source order,
    /// ties by rule, a merged duplicate kept once, called workflows' findings last.
    #[test]
    fn findings_come_in_source_order_then_called_workflows() {
        let text = "\
on: [pull_request_target, workflow_run]
permissions: write-all
env:
  KEY: ${{ secrets.KEY }}
jobs:
  a:
    runs-on: [self-hosted]
    steps:
      - run: gh pr checkout 1; echo ${{ github.event.pull_request.title }}
      - run: gh run download
  b:
    runs-on: [self-hosted]
    steps: [{run: make}]
  c:
    uses: ./.github/workflows/called.yml
    secrets: inherit
  d:
    uses: org/ci/.github/workflows/x.yml@v1
";
        let called = "on: workflow_call\njobs:\n  inner:\n    runs-on: gpu\n    timeout-minutes: 5\n    steps: [{run: make}]\n";
        let resolve = |uses: &str| -> Option<(String, String)> {
            (uses == "./.github/workflows/called.yml")
                .then(|| ("called.yml".to_string(), called.to_string()))
        };
        let got: Vec<String> = lines(&lint_source("test.yml", text, &resolve))
            .iter()
            .map(|l| l.split(": ").next().unwrap_or("").to_string())
            .collect();
        assert_eq!(
            got,
            [
                "write-permissions 2:1 job a",
                "secrets-exposed 6:3 job a",
                "no-timeout 6:3 job a",
                "untrusted-self-hosted 7:14 job a",
                "pr-head-checkout 9:9 job a",
                "script-injection 9:37 job a",
                "untrusted-artifact 10:9 job a",
                "secrets-exposed 11:3 job b",
                "no-timeout 11:3 job b",
                "untrusted-self-hosted 12:14 job b",
                "secrets-exposed 16:14 job c",
                "unchecked-call 18:11 job d",
                "untrusted-self-hosted 4:14 job inner",
            ]
        );
    }
}
