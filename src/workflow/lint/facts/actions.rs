//! Local actions (`uses: ./.github/actions/setup`): read from the repository once per
//! workflow, so that the steps of a composite action can be linted as steps of the job
//! that calls it (see [`super::steps`]).

use std::collections::HashMap;

use github_actions_models::action::{Action, Runs, StepBody};
use github_actions_models::common::Uses;
use github_actions_models::workflow::job::{ParallelStep, Step};
use github_actions_models::workflow::{Job, Workflow};

use crate::workflow::lint::source::{Resolver, Source};
use crate::yaml::{self, Node};

/// How deep composite actions may call other local actions before lint stops reading
/// (GitHub itself allows ten levels).
pub(crate) const MAX_ACTION_DEPTH: usize = 10;

/// At most this many local actions are read per workflow: a hostile repository cannot
/// make lint read without end.
const MAX_ACTIONS: usize = 64;

/// A local action as read from its `action.yml`.
pub(crate) struct LocalAction {
    /// The file, as findings name it.
    pub file: String,
    text: String,
    root: Node,
    pub action: Action,
}

impl LocalAction {
    /// Positions in the action's file.
    pub fn source(&self) -> Source<'_> {
        Source::new(&self.root, &self.text)
    }

    /// The steps of a composite action; `None` for a JavaScript or Docker action.
    pub fn composite_steps(&self) -> Option<&[github_actions_models::action::Step]> {
        match &self.action.runs {
            Runs::Composite(c) => Some(&c.steps),
            _ => None,
        }
    }
}

/// The local actions a workflow's steps use (and those their composite steps use), by
/// the path `uses:` gives, or why each could not be read.
#[derive(Default)]
pub(crate) struct Actions {
    by_path: HashMap<String, Result<LocalAction, String>>,
}

/// A local `uses:` as a key: `./.github/actions/x/` and `.github/actions/x` are one.
pub(crate) fn local_key(uses: &Uses) -> Option<String> {
    let Uses::Local(local) = uses else {
        return None;
    };
    let raw = local.raw().trim();
    let rel = raw
        .strip_prefix("./")
        .or_else(|| raw.strip_prefix("$/"))
        .unwrap_or(raw);
    Some(rel.trim_end_matches('/').to_string())
}

impl Actions {
    /// Reads every local action the workflow's steps use, through `resolve`.
    pub fn load(workflow: &Workflow, resolve: Resolver<'_>) -> Actions {
        let mut out = Actions::default();
        let mut todo: Vec<(String, usize)> = Vec::new();
        for job in workflow.jobs.values() {
            let Job::NormalJob(job) = job else { continue };
            for step in &job.steps {
                let uses: Vec<&Uses> = match step {
                    Step::Uses(s) => vec![&s.uses],
                    Step::Parallel { parallel } => parallel
                        .iter()
                        .filter_map(|p| match p {
                            ParallelStep::Uses(s) => Some(&s.uses),
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                todo.extend(uses.into_iter().filter_map(local_key).map(|k| (k, 1)));
            }
        }
        while let Some((key, depth)) = todo.pop() {
            if out.by_path.contains_key(&key) || out.by_path.len() >= MAX_ACTIONS {
                continue;
            }
            let read = read_action(&key, resolve);
            if let Ok(action) = &read
                && depth < MAX_ACTION_DEPTH
                && let Some(steps) = action.composite_steps()
            {
                for s in steps {
                    if let StepBody::Uses { uses, .. } = &s.body
                        && let Some(k) = local_key(uses)
                    {
                        todo.push((k, depth + 1));
                    }
                }
            }
            out.by_path.insert(key, read);
        }
        out
    }

    /// The action a local `uses:` names, or why it could not be read; `None` for a
    /// `uses:` that is not local (or was not read: past the limits).
    pub fn get(&self, uses: &Uses) -> Option<&Result<LocalAction, String>> {
        self.by_path.get(&local_key(uses)?)
    }
}

/// Reads and parses `PATH/action.yml` (or `action.yaml`).
fn read_action(rel: &str, resolve: Resolver<'_>) -> Result<LocalAction, String> {
    if rel.split('/').any(|c| c == "..") {
        return Err("its path leaves the repository".into());
    }
    let (file, text) = ["action.yml", "action.yaml"]
        .iter()
        .find_map(|name| resolve(&format!("./{rel}/{name}")))
        .ok_or_else(|| format!("no readable `{rel}/action.yml` in the repository"))?;
    let root = match yaml::parse(&text) {
        Ok(Some(root)) => root,
        Ok(None) => return Err(format!("{file} is empty")),
        Err(e) => return Err(format!("{file}:{}: not YAML", e.mark)),
    };
    let action: Action = serde_path_to_error::deserialize(&root.to_json())
        .map_err(|e| format!("{file}: not an action at `{}`", e.path()))?;
    Ok(LocalAction {
        file,
        text,
        root,
        action,
    })
}
