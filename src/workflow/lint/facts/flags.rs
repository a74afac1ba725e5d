//! Outputs that can only be flags or counts the workflow's own text names, never text
//! from the event: an action known to give only such outputs (dorny/paths-filter's
//! `true`/`false` per filter), a `run:` step that writes its output as a literal word
//! (`echo "run_all=true" >> "$GITHUB_OUTPUT"`), and the job outputs (and a called
//! workflow's outputs) made only of those. Pasted into a script, such a value is not
//! script injection, whoever opened the event.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use github_actions_models::common::Uses;
use github_actions_models::workflow::event::OptionalBody;
use github_actions_models::workflow::job::{NormalJob, Step};
use github_actions_models::workflow::{Job, Workflow};
use regex::Regex;

use super::shell::logical_lines;
use crate::workflow::lint::expr;
use crate::workflow::lint::source::Resolver;

/// Actions whose outputs are flags and counts: dorny/paths-filter gives each filter
/// `true`/`false`, its `_count`, and `changes` (the filters that matched, named by the
/// workflow); only `FILTER_files` lists file names.
const FLAG_ACTIONS: &[&str] = &["dorny/paths-filter"];

/// How deep called workflows are followed for their outputs (GitHub's own limit).
const MAX_CALL_DEPTH: u8 = 10;

/// `echo NAME=WORD >> $GITHUB_OUTPUT`: an output written as one literal word.
static LITERAL_OUTPUT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"^\s*(?:(?:then|else|do)\s+)?echo\s+["']?([A-Za-z_][A-Za-z0-9_-]*)=([A-Za-z0-9_.:+-]*)["']?\s*>>\s*["']?\$\{?GITHUB_OUTPUT\}?["']?\s*$"#,
    )
    .expect("valid regex")
});

/// The outputs of each job of one workflow that can only be flags (lower-case names).
#[derive(Default)]
pub(crate) struct FlagOutputs {
    jobs: BTreeMap<String, JobFlags>,
}

#[derive(Default, Clone)]
struct JobFlags {
    flags: BTreeSet<String>,
    /// Whether every output of the job is one (so `toJson(needs.J.outputs)` is too).
    all: bool,
}

impl FlagOutputs {
    /// The flag outputs of `workflow`'s jobs; the workflows its jobs call are read
    /// through `resolve`.
    pub fn of(workflow: &Workflow, resolve: Resolver<'_>) -> FlagOutputs {
        Self::of_depth(workflow, resolve, MAX_CALL_DEPTH, &mut BTreeMap::new())
    }

    /// `seen` holds each called workflow's flags once worked out, and `None` while it is
    /// (a workflow that calls itself, or one called from many jobs, is read once: a
    /// hostile tree of calls costs each file once, not once per path to it).
    fn of_depth(
        workflow: &Workflow,
        resolve: Resolver<'_>,
        depth: u8,
        seen: &mut BTreeMap<String, Option<JobFlags>>,
    ) -> FlagOutputs {
        let mut jobs = BTreeMap::new();
        for (id, job) in &workflow.jobs {
            let Job::NormalJob(job) = job else {
                continue;
            };
            let outputs: Vec<(String, String)> = job
                .outputs
                .iter()
                .map(|(k, v)| (k.to_lowercase(), v.to_string()))
                .collect();
            let flags: BTreeSet<String> = outputs
                .iter()
                .filter(|(_, v)| made_of_flags(v, |p| step_output(job, p)))
                .map(|(k, _)| k.clone())
                .collect();
            let all = flags.len() == outputs.len();
            jobs.insert(id.to_lowercase(), JobFlags { flags, all });
        }
        if depth > 0 {
            for (id, job) in &workflow.jobs {
                let Job::ReusableWorkflowCallJob(call) = job else {
                    continue;
                };
                let Uses::Local(local) = &call.uses else {
                    continue;
                };
                if let Some(flags) = called_flags(local.raw(), resolve, depth - 1, seen) {
                    jobs.insert(id.to_lowercase(), flags);
                }
            }
        }
        FlagOutputs { jobs }
    }

    /// Whether `needs.JOB.outputs.NAME` (or the whole `needs.JOB.outputs`) can only be
    /// a flag.
    pub fn job_output(&self, path: &str) -> bool {
        let mut parts = path.split('.');
        let (Some(id), name) = (parts.nth(1), parts.nth(1)) else {
            return false;
        };
        let Some(job) = self.jobs.get(id) else {
            return false;
        };
        match name {
            None | Some("*") => job.all,
            Some(n) => job.flags.contains(n),
        }
    }
}

/// Whether `steps.ID.outputs.NAME` of `job` can only be a flag: the step is one of
/// [`FLAG_ACTIONS`] and the output no list of files, or a `run:` step whose every write
/// to `$GITHUB_OUTPUT` is a literal word and one of them names the output.
pub(crate) fn step_output(job: &NormalJob, path: &str) -> bool {
    let mut parts = path.split('.');
    let (Some(id), Some(name)) = (parts.nth(1), parts.nth(1)) else {
        return false;
    };
    if name == "*" {
        return false;
    }
    job.steps.iter().any(|step| match step {
        Step::Uses(u) => {
            u.shared
                .id
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case(id))
                && !name.ends_with("_files")
                && matches!(&u.uses, Uses::Repository(r)
                    if FLAG_ACTIONS.iter().any(|a| r.slug().eq_ignore_ascii_case(a)))
        }
        Step::Run(r) => {
            r.shared
                .id
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case(id))
                && literal_outputs(&r.run).is_some_and(|names| names.contains(name))
        }
        _ => false,
    })
}

/// The outputs a script writes, when it writes each as a literal word; `None` when any
/// write to `$GITHUB_OUTPUT` is of another form (it could set any name to anything).
fn literal_outputs(script: &str) -> Option<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for line in logical_lines(script) {
        if !line.contains("GITHUB_OUTPUT") {
            continue;
        }
        // Several commands on one line: each must be a literal write, or not a write.
        for command in line.split(['&', ';', '|']).filter(|c| !c.trim().is_empty()) {
            if !command.contains("GITHUB_OUTPUT") {
                continue;
            }
            let c = LITERAL_OUTPUT.captures(command)?;
            names.insert(c[1].to_lowercase());
        }
    }
    Some(names)
}

/// Whether every context an output's value names is a flag (as `is_flag` says of step
/// outputs) or a context no outsider writes; literal text counts too.
fn made_of_flags(value: &str, is_flag: impl Fn(&str) -> bool) -> bool {
    expr::embedded(value).into_iter().all(|e| {
        let Ok(parsed) = expr::parse(e.body) else {
            return false;
        };
        expr::value_paths(&parsed).iter().all(|p| {
            if expr::under(p, "steps.*.outputs") {
                is_flag(p)
            } else {
                // Everything else a job output could name is left to the taint rules:
                // counted as text here.
                [
                    "github.ref",
                    "github.sha",
                    "github.event_name",
                    "github.run_id",
                ]
                .contains(&p.as_str())
            }
        })
    })
}

/// The flag outputs of the workflow a job calls (`on.workflow_call.outputs`, each
/// `value` made of its jobs' flag outputs).
fn called_flags(
    uses: &str,
    resolve: Resolver<'_>,
    depth: u8,
    seen: &mut BTreeMap<String, Option<JobFlags>>,
) -> Option<JobFlags> {
    if let Some(known) = seen.get(uses) {
        return known.clone();
    }
    seen.insert(uses.to_string(), None);
    let flags = read_called_flags(uses, resolve, depth, seen);
    seen.insert(uses.to_string(), flags.clone());
    flags
}

fn read_called_flags(
    uses: &str,
    resolve: Resolver<'_>,
    depth: u8,
    seen: &mut BTreeMap<String, Option<JobFlags>>,
) -> Option<JobFlags> {
    let (name, text) = resolve(uses)?;
    let (_, callee) = crate::workflow::lint::parse::parse(&name, &text).ok()?;
    let OptionalBody::Body(call) = &callee.on.events.workflow_call else {
        return None;
    };
    let inner = FlagOutputs::of_depth(&callee, resolve, depth, seen);
    let outputs: Vec<(String, bool)> = call
        .outputs
        .iter()
        .map(|(k, out)| {
            let flag = expr::embedded(&out.value).into_iter().all(|e| {
                expr::parse(e.body).is_ok_and(|parsed| {
                    expr::value_paths(&parsed).iter().all(|p| {
                        expr::under(p, "jobs.*.outputs")
                            && inner.job_output(&p.replacen("jobs.", "needs.", 1))
                    })
                })
            });
            (k.to_lowercase(), flag)
        })
        .collect();
    let flags: BTreeSet<String> = outputs
        .iter()
        .filter(|(_, f)| *f)
        .map(|(k, _)| k.clone())
        .collect();
    Some(JobFlags {
        all: flags.len() == outputs.len(),
        flags,
    })
}

#[cfg(test)]
mod tests {
    use super::literal_outputs;

    #[test]
    fn outputs_written_as_literal_words_and_those_that_are_not() {
        let s = "if [[ x ]]; then\n  echo \"run_all_tests=true\" >> $GITHUB_OUTPUT\nelse\n  echo run_all_tests=false >> \"$GITHUB_OUTPUT\"\nfi\n";
        assert_eq!(
            literal_outputs(s).unwrap().into_iter().collect::<Vec<_>>(),
            ["run_all_tests"]
        );
        for opaque in [
            "echo \"dir=$DIR\" >> $GITHUB_OUTPUT\n",
            "echo \"$LINE\" >> $GITHUB_OUTPUT\n",
            "cat out.txt >> $GITHUB_OUTPUT\n",
            "echo a=1 >> $GITHUB_OUTPUT; echo \"b=$(cat f)\" >> $GITHUB_OUTPUT\n",
        ] {
            assert!(literal_outputs(opaque).is_none(), "{opaque}");
        }
    }
}
