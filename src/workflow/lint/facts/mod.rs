//! Facts about a workflow and its jobs that the rules ([`super::audit`]) read: computed
//! here, once, so that no rule reaches into another.
//!
//! - [`scope`]: what the workflow is linted as (its own triggers, or a caller's);
//! - [`job`]: what reaches the workflow and each job, gathered before any rule runs;
//! - [`steps`]: a job's steps, `parallel:` blocks and local composite actions flattened;
//! - [`actions`]: the local actions a workflow uses, read once;
//! - [`runner`]: self-hosted runners;
//! - [`triggers`]: the untrusted triggers each job is still open to;
//! - [`taint`]: which values an outsider writes;
//! - [`flags`]: the outputs that can only be flags or counts (no outsider's text);
//! - [`flow`]: attacker text carried between steps (`$GITHUB_ENV`, files);
//! - [`head`]: where text names the pull request's head;
//! - [`checkout`]: the steps that fetch or check it out, and which do so unsafely;
//! - [`powers`]: the secrets and write permissions a job holds;
//! - [`env`]: reading `env:` and `with:` maps;
//! - [`shell`]: reading scripts as the shell does (continued lines, variables).

pub(crate) mod actions;
pub(crate) mod checkout;
pub(crate) mod env;
pub(crate) mod flags;
pub(crate) mod flow;
pub(crate) mod head;
pub(crate) mod job;
pub(crate) mod powers;
pub(crate) mod runner;
pub(crate) mod scope;
pub(crate) mod shell;
pub(crate) mod steps;
pub(crate) mod taint;
pub(crate) mod triggers;
