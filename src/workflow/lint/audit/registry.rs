//! The rules `workflow lint` runs, in the order they run on each job.
//!
//! The order is the one findings about a job were made in before the rules had files of
//! their own. Findings are sorted by position and rule afterwards (a stable sort), so
//! this order only decides between findings of one rule at one place; keeping it anyway
//! keeps the output byte for byte.

use super::Audit;
use super::env_file_injection::EnvFileInjection;
use super::no_timeout::NoTimeout;
use super::pr_head_checkout::PrHeadCheckout;
use super::script_injection::ScriptInjection;
use super::secrets_exposed::SecretsExposed;
use super::unchecked_call::UncheckedCall;
use super::unpinned_image::UnpinnedImage;
use super::untrusted_artifact::UntrustedArtifact;
use super::untrusted_self_hosted::UntrustedSelfHosted;
use super::write_permissions::WritePermissions;

/// Every rule, once. A job that calls a reusable workflow meets only the first and
/// secrets-exposed (their `check_call`); the others look at jobs that run steps.
pub(crate) const AUDITS: &[&dyn Audit] = &[
    &UncheckedCall,
    &UntrustedSelfHosted,
    &PrHeadCheckout,
    &WritePermissions,
    &SecretsExposed,
    &UntrustedArtifact,
    &ScriptInjection,
    &EnvFileInjection,
    &NoTimeout,
    &UnpinnedImage,
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::AUDITS;
    use crate::workflow::lint::audit::testing::lines;
    use crate::workflow::lint::lint_source;
    use crate::workflow::lint::rule::Rule;

    #[test]
    fn every_rule_but_unparsable_is_registered_once() {
        let rules: Vec<Rule> = AUDITS.iter().map(|a| a.rule()).collect();
        let unique: BTreeSet<Rule> = rules.iter().copied().collect();
        assert_eq!(unique.len(), rules.len(), "{rules:?}");
        assert!(!unique.contains(&Rule::Unparsable));
        assert_eq!(unique.len(), 10);
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
