//! write-permissions: write permissions on a job an outsider can drive under a
//! privileged trigger: one that runs on a self-hosted runner or checks out the pull
//! request's code ([`JobFacts::head_checkouts`]).

use github_actions_models::common::{BasePermission, Permissions};

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::facts::powers::writes;
use crate::workflow::lint::facts::triggers::names;
use crate::workflow::lint::guard::Trigger;
use crate::workflow::lint::rule::Severity;

pub(crate) struct WritePermissions;

audit_meta!(
    WritePermissions,
    "write-permissions",
    Severity::Error,
    "Write permissions on a job that outsiders drive",
    "A job that outsiders drive under a privileged trigger (a self-hosted one, or one that runs the pull request's code) has a token with write permissions. Give it contents: read and move writes to a job that runs no outside code."
);

impl Audit for WritePermissions {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        // The triggers that let outsiders drive it: unguarded privileged ones on a
        // self-hosted runner, and any under which it runs the pull request's code.
        let mut drive: Vec<Trigger> = if job.runner.is_some() {
            job.open_privileged.clone()
        } else {
            Vec::new()
        };
        for t in job.head_checkouts.iter().flat_map(|c| &c.triggers) {
            if !drive.contains(t) {
                drive.push(*t);
            }
        }
        if drive.is_empty() {
            return;
        }
        // A job without its own `permissions:` has the workflow's.
        let inherits = matches!(
            job.job.permissions,
            Permissions::Base(BasePermission::Default)
        );
        let perms = if inherits {
            &job.wf.workflow.permissions
        } else {
            &job.job.permissions
        };
        let Some(w) = writes(perms) else {
            return;
        };
        let at = if inherits {
            job.wf.src.key_at(&[], "permissions")
        } else {
            job.wf.src.key_at(&["jobs", job.id], "permissions")
        };
        emit.job(
            at,
            format!(
                "has `{w}` while {} lets outsiders drive it: give it `permissions: {{contents: read}}` and move writes to a job that runs no outside code",
                names(&drive)
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::WritePermissions;
    use crate::workflow::lint::audit::testing::{all_are, findings, lines};

    #[test]
    fn a_self_hosted_job_inheriting_write_all_under_pull_request_target() {
        let f = findings(
            &WritePermissions,
            "on: pull_request_target\npermissions: write-all\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    steps: [{run: make}]\n",
        );
        all_are(&f, WritePermissions::RULE);
        assert_eq!(
            lines(&f),
            [
                "write-permissions 2:1 job gpu: has `write-all` while pull_request_target lets outsiders drive it: give it `permissions: {contents: read}` and move writes to a job that runs no outside code"
            ]
        );
    }

    #[test]
    fn a_hosted_job_that_checks_out_the_head_with_its_own_writes() {
        let f = findings(
            &WritePermissions,
            "on: issue_comment\njobs:\n  bot:\n    runs-on: ubuntu-latest\n    permissions:\n      contents: write\n      pull-requests: write\n    steps:\n      - run: gh pr checkout 1\n",
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert_eq!((f[0].line, f[0].col), (5, 5));
        assert!(
            f[0].message
                .starts_with("has `contents, pull-requests: write` while issue_comment"),
            "{:#?}",
            lines(&f)
        );
    }

    #[test]
    fn read_only_jobs_hosted_jobs_running_no_outside_code_and_pull_request_are_not_flagged() {
        for text in [
            "on: pull_request_target\npermissions: {contents: read}\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    steps: [{run: make}]\n",
            "on: pull_request_target\npermissions: write-all\njobs:\n  label:\n    runs-on: ubuntu-latest\n    steps: [{run: make}]\n",
            // pull_request's token is read-only whatever the file says.
            "on: pull_request\npermissions: write-all\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    steps: [{run: make}]\n",
        ] {
            let f = findings(&WritePermissions, text);
            assert!(f.is_empty(), "{text}\n{:#?}", lines(&f));
        }
    }
}
