//! What is clear to judge in a Buildkite pipeline: a command step that reaches a GPU
//! (its agent queue names one, or it runs cibox batches that ask for GPUs) which a build
//! of a fork's pull request would run with nobody's approval: no `block` step holds it
//! and its own `if:` does not keep forks out. Buildkite builds forks' pull requests only
//! where the pipeline's settings say so, which the YAML does not show: so a warning
//! (`fork-gpu-unblocked`), not an error. docs/interface.md §3, *Buildkite*.

use serde_json::Value;

use super::cond::{self, Truth};

use crate::manifest::Manifest;

/// The rule's name, as findings print it.
pub const RULE: &str = "fork-gpu-unblocked";

/// A step as the rule reads it, flattened out of groups.
struct Step {
    /// Where it is: its path of keys and indices, for the line.
    path: Vec<String>,
    label: String,
    key: Option<String>,
    depends_on: Vec<String>,
    kind: Kind,
    /// A block above it at its level (or above its group) holds it, when it names no
    /// `depends_on` of its own.
    held_above: bool,
    /// Its own (or its group's) `if:` keeps forks' builds out.
    fork_guard: bool,
    /// What GPU it reaches, when it does: said in the warning.
    gpu: Option<String>,
}

#[derive(PartialEq, Eq)]
enum Kind {
    /// A block step that holds what follows it (unconditional, or shown to forks).
    Block,
    Command,
    Other,
}

/// The warnings for the pipeline `file` (its rendered `text`), one line each.
pub fn warnings(m: &Manifest, file: &str, text: &str) -> Vec<String> {
    let Ok(Some(tree)) = crate::yaml::parse(text) else {
        return Vec::new();
    };
    let json = tree.to_json();
    let Some(steps) = json.get("steps").and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut flat = Vec::new();
    walk(m, steps, &["steps".to_string()], false, None, &mut flat);
    // Which keyed steps are held: a block, or anything that depends on a held step (or
    // on nothing, under a block). Settled by repeating until nothing changes.
    let mut held: Vec<bool> = flat
        .iter()
        .map(|s| s.kind == Kind::Block || (s.depends_on.is_empty() && s.held_above))
        .collect();
    loop {
        let mut changed = false;
        for i in 0..flat.len() {
            if held[i] {
                continue;
            }
            let by_dependency = flat[i].depends_on.iter().any(|d| {
                flat.iter()
                    .zip(&held)
                    .any(|(s, &h)| h && s.key.as_deref() == Some(d.as_str()))
            });
            if by_dependency {
                held[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut out = Vec::new();
    for (s, h) in flat.iter().zip(&held) {
        let Some(gpu) = &s.gpu else { continue };
        if *h || s.fork_guard || s.kind != Kind::Command {
            continue;
        }
        let line = tree.locate(&s.path).mark.line;
        out.push(format!(
            "{file}:{line}: step {}: {gpu}, and a build of a fork's pull request reaches it with no block step to approve it: make it depend on a `block` step, or give it `if: build.pull_request.repository.fork == false` (unless the pipeline's settings never build forks) [{RULE}]",
            crate::util::escape(&s.label),
        ));
    }
    out
}

/// A step's `depends_on`: a key, a list of keys, or of `{step: KEY}`.
fn depends_on(step: &Value) -> Vec<String> {
    let one = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o.get("step").and_then(Value::as_str).map(str::to_string),
            _ => None,
        }
    };
    match step.get("depends_on") {
        Some(Value::Array(items)) => items.iter().filter_map(one).collect(),
        Some(v) => one(v).into_iter().collect(),
        None => Vec::new(),
    }
}

/// Whether an `if:` keeps forks' pull requests out: it is false in every build of a
/// fork's pull request, whatever else the build is ([`cond`]: what it cannot evaluate
/// may run).
fn keeps_forks_out(cond: &str) -> bool {
    cond::in_fork_build(cond) == Truth::False
}

/// Whether a block step's `if:` (or none) makes it stand in every build of a fork's
/// pull request: none, or one true in all of them (`if:
/// build.pull_request.repository.fork`). One that may be false there (`… == null`,
/// `… && build.branch == "never"`, one it cannot evaluate) holds nothing back.
fn block_holds(step: &Value) -> bool {
    if step.get("branches").is_some() {
        return false;
    }
    match step.get("if") {
        None => true,
        Some(Value::String(c)) => cond::in_fork_build(c) == Truth::True,
        Some(_) => false,
    }
}

fn kind_of(step: &Value) -> Kind {
    match step {
        Value::String(s) => match s.as_str() {
            "block" => Kind::Block,
            _ => Kind::Other,
        },
        Value::Object(o) => {
            let ty = o.get("type").and_then(Value::as_str);
            if o.contains_key("block") || ty == Some("block") {
                if block_holds(step) {
                    Kind::Block
                } else {
                    Kind::Other
                }
            } else if ["command", "commands", "script", "plugins"]
                .iter()
                .any(|k| o.contains_key(*k))
                || matches!(ty, Some("command" | "commands" | "script"))
            {
                Kind::Command
            } else {
                Kind::Other
            }
        }
        _ => Kind::Other,
    }
}

/// The step's agent queue: `agents: {queue: Q}` or `agents: ["queue=Q"]`.
fn queue(step: &Value) -> Option<String> {
    match step.get("agents")? {
        Value::Object(o) => o.get("queue").and_then(Value::as_str).map(str::to_string),
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .find_map(|a| a.strip_prefix("queue=").map(str::to_string)),
        _ => None,
    }
}

/// The step's command lines.
fn commands(step: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for k in ["command", "commands"] {
        match step.get(k) {
            Some(Value::String(s)) => out.push(s.clone()),
            Some(Value::Array(items)) => {
                out.extend(items.iter().filter_map(Value::as_str).map(str::to_string))
            }
            _ => {}
        }
    }
    out
}

/// What GPU a step reaches, said for the warning: a queue whose name says GPU (or a GPU
/// model a batch asks for), or cibox batches with GPUs run by name, or `changed run`.
fn reaches_gpu(m: &Manifest, step: &Value) -> Option<String> {
    if let Some(q) = queue(step) {
        let lower = q.to_ascii_lowercase();
        let model_keys = m
            .batches
            .values()
            .filter(|b| b.gpus > 0)
            .filter_map(|b| b.gpu_model.as_deref())
            .map(crate::workflow::models::model_key);
        if lower.contains("gpu") || model_keys.into_iter().any(|k| lower.contains(&k)) {
            return Some(format!(
                "runs on the GPU queue `{}`",
                crate::util::escape(&q)
            ));
        }
    }
    for script in commands(step) {
        for name in crate::workflow::models::batches_run(m, &script) {
            if m.batches[name].gpus > 0 {
                return Some(format!(
                    "runs batch {name} ({})",
                    crate::util::count(m.batches[name].gpus, "GPU")
                ));
            }
        }
        let words: Vec<&str> = script.split_whitespace().collect();
        if words
            .windows(3)
            .any(|w| w[0].ends_with("cibox") && w[1] == "changed" && w[2] == "run")
        {
            return Some(
                "runs changed test files (`cibox changed run`), with the GPUs each asks".into(),
            );
        }
    }
    None
}

fn walk(
    m: &Manifest,
    steps: &[Value],
    at: &[String],
    held_above: bool,
    group: Option<(&str, bool, &[String])>,
    out: &mut Vec<Step>,
) {
    let mut held = held_above;
    for (i, step) in steps.iter().enumerate() {
        let mut path = at.to_vec();
        path.push(i.to_string());
        if let Some(inner) = step.get("steps").and_then(Value::as_array)
            && step.get("group").is_some()
        {
            let own_deps = depends_on(step);
            let guard = step
                .get("if")
                .and_then(Value::as_str)
                .is_some_and(keeps_forks_out);
            // A group with no `depends_on` of its own waits for a block above it.
            let group_held = held && own_deps.is_empty();
            let mut inner_at = path.clone();
            inner_at.push("steps".into());
            walk(
                m,
                inner,
                &inner_at,
                group_held,
                Some((
                    step.get("group").and_then(Value::as_str).unwrap_or("group"),
                    guard,
                    &own_deps,
                )),
                out,
            );
            continue;
        }
        let kind = kind_of(step);
        let mut deps = depends_on(step);
        let mut fork_guard = step
            .get("if")
            .and_then(Value::as_str)
            .is_some_and(keeps_forks_out);
        if let Some((_, guard, group_deps)) = group {
            fork_guard |= guard;
            deps.extend(group_deps.iter().cloned());
        }
        let label = step
            .get("label")
            .or_else(|| step.get("name"))
            .or_else(|| step.get("key"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("{}", i + 1));
        let label = match group {
            Some((g, _, _)) => format!("{g} › {label}"),
            None => label,
        };
        let key = ["key", "id", "identifier"]
            .iter()
            .find_map(|k| step.get(*k).and_then(Value::as_str))
            .map(str::to_string);
        out.push(Step {
            path,
            label,
            key,
            depends_on: deps,
            held_above: held,
            fork_guard,
            gpu: if kind == Kind::Command {
                reaches_gpu(m, step)
            } else {
                None
            },
            kind,
        });
        if matches!(out.last().map(|s| &s.kind), Some(Kind::Block)) {
            held = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const MANIFEST: &str = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1m, run: [x]}\nbatches:\n  h: {gpus: 2, gpu_model: \"*H100*\"}\n  cpu: {gpus: 0}\n";

    fn lint(pipeline: &str) -> Vec<String> {
        let m = Manifest::parse(MANIFEST, Path::new("cibox.yaml")).unwrap();
        warnings(&m, "pipeline.yml", pipeline)
    }

    #[test]
    fn a_gpu_step_a_fork_reaches_unblocked_is_a_warning() {
        let w = lint("steps:\n  - label: gpu\n    command: cibox batch run h\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("pipeline.yml:2: step gpu: runs batch h (2 GPUs)"),
            "{w:?}"
        );
        assert!(w[0].ends_with("[fork-gpu-unblocked]"), "{w:?}");
        // A queue that says GPU, or names a model a batch asks for.
        assert_eq!(
            lint("steps:\n  - command: x\n    agents: {queue: gpu-1}\n").len(),
            1
        );
        assert_eq!(
            lint("steps:\n  - command: x\n    agents: [\"queue=h100-8\"]\n").len(),
            1
        );
        // CPU work is not judged.
        assert!(
            lint("steps:\n  - command: cibox batch run cpu\n    agents: {queue: cpu}\n").is_empty()
        );
    }

    #[test]
    fn a_block_or_a_fork_guard_holds_it() {
        // A block above, for a step with no depends_on of its own.
        assert!(
            lint("steps:\n  - block: run GPU tests?\n  - command: cibox batch run h\n").is_empty()
        );
        // vLLM's shape: the step depends on the block's key, in a group.
        assert!(lint("steps:\n  - group: GPU\n    steps:\n      - block: Run h\n        key: block-h\n      - label: h\n        command: cibox batch run h\n        depends_on: [image, block-h]\n        agents: {queue: gpu_1_queue}\n").is_empty());
        // Through another step that depends on the block.
        assert!(lint("steps:\n  - block: go\n    key: go\n  - command: build\n    key: build\n    depends_on: go\n  - command: cibox batch run h\n    depends_on: build\n").is_empty());
        // A step with depends_on elsewhere is not held by the block above it.
        assert_eq!(lint("steps:\n  - command: build\n    key: build\n  - block: go\n  - command: cibox batch run h\n    depends_on: build\n").len(), 1);
        // Its own if: keeps forks out; one with || does not.
        assert!(lint("steps:\n  - command: cibox batch run h\n    if: build.pull_request.repository.fork == false && build.branch != \"x\"\n").is_empty());
        assert_eq!(lint("steps:\n  - command: cibox batch run h\n    if: build.pull_request.repository.fork == false || build.branch == \"x\"\n").len(), 1);
        // A block only for forks holds; a block on some branches does not.
        assert!(lint("steps:\n  - block: fork?\n    if: build.pull_request.repository.fork\n  - command: cibox batch run h\n").is_empty());
        // The attack's: blocks whose `if:` is false, or may be, in a fork's build hold
        // nothing back; nor does one whose `if:` cannot be read.
        for cond in [
            "build.pull_request.repository.fork == null",
            "build.pull_request.repository.fork && build.branch == \\\"never\\\"",
            "build.pull_request.repository.fork == \\\"true\\\"",
            "build.pull_request.repository.fork ==",
        ] {
            let w = lint(&format!(
                "steps:\n  - block: fork?\n    if: \"{cond}\"\n  - command: cibox batch run h\n"
            ));
            assert_eq!(w.len(), 1, "{cond}: {w:?}");
        }
        // And a step's own `if:` that is false in every fork's build keeps it out.
        assert!(lint("steps:\n  - command: cibox batch run h\n    if: build.pull_request.repository.fork == null\n").is_empty());
        assert!(lint("steps:\n  - command: cibox batch run h\n    if: (build.branch == \"main\" || build.tag != null) && !build.pull_request.repository.fork\n").is_empty());
        assert_eq!(
            lint("steps:\n  - block: go\n    branches: main\n  - command: cibox batch run h\n")
                .len(),
            1
        );
    }
}
