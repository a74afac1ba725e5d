//! Reading a workflow's text: YAML with positions ([`crate::yaml`]), then the typed model
//! of `github-actions-models`; a file that is not one is an `unparsable` finding that
//! names the key and the reason (a model error, refined through the job's or the step's
//! shape).

use github_actions_models::workflow::Workflow;

use super::finding::Finding;
use crate::yaml::{self, Mark, Node};

/// Where findings about a whole file point.
pub(crate) const FILE_START: Mark = Mark { line: 1, col: 1 };

/// Parses a workflow, or says why it is not one.
pub(crate) fn parse(file: &str, text: &str) -> Result<(Node, Workflow), Box<Finding>> {
    let root = match yaml::parse(text) {
        Ok(Some(root)) => root,
        Ok(None) => {
            return Err(Box::new(Finding::unparsable(
                file,
                FILE_START,
                "empty file",
            )));
        }
        Err(e) => {
            return Err(Box::new(Finding::unparsable(
                file,
                e.mark,
                format!("not YAML: {}", e.message),
            )));
        }
    };
    let json = root.to_json();
    match serde_path_to_error::deserialize(&json) {
        Ok(w) => Ok((root, w)),
        Err(e) => {
            let (path, message) = explain(&json, e);
            let mark = root.locate(&path).mark;
            let at = if path.is_empty() {
                String::new()
            } else {
                format!(" at `{}`", path.join("."))
            };
            Err(Box::new(Finding::unparsable(
                file,
                mark,
                format!("not a GitHub Actions workflow{at}: {message}"),
            )))
        }
    }
}

fn segments(path: &serde_path_to_error::Path) -> Vec<String> {
    path.iter()
        .filter_map(|seg| match seg {
            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
            serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
            _ => None,
        })
        .collect()
}

/// The path and message of a model error. A job or a step is one of several shapes
/// (serde's "untagged" enums), whose error only says that no shape matched: parse it
/// again as the shape its keys ask for, to name the field that is wrong.
fn explain(
    json: &serde_json::Value,
    e: serde_path_to_error::Error<serde_json::Error>,
) -> (Vec<String>, String) {
    use github_actions_models::workflow::job::{
        NormalJob, ReusableWorkflowCallJob, RunStep, UsesStep,
    };
    let mut path = segments(e.path());
    let mut message = e.into_inner().to_string();
    // A step inside a job: refine the job, then the step.
    for _ in 0..2 {
        let Some(node) = path.iter().try_fold(json, |v, seg| {
            v.get(seg)
                .or_else(|| seg.parse::<usize>().ok().and_then(|i| v.get(i)))
        }) else {
            break;
        };
        let has = |k: &str| node.get(k).is_some();
        let inner = match path.as_slice() {
            [jobs, _] if jobs == "jobs" && has("uses") => {
                serde_path_to_error::deserialize::<_, ReusableWorkflowCallJob>(node).err()
            }
            [jobs, _] if jobs == "jobs" => {
                serde_path_to_error::deserialize::<_, NormalJob>(node).err()
            }
            [.., steps, _] if steps == "steps" && has("run") => {
                serde_path_to_error::deserialize::<_, RunStep>(node).err()
            }
            [.., steps, _] if steps == "steps" && has("uses") => {
                serde_path_to_error::deserialize::<_, UsesStep>(node).err()
            }
            _ => None,
        };
        let Some(inner) = inner else { break };
        path.extend(segments(inner.path()));
        message = inner.into_inner().to_string();
    }
    if message.starts_with("data did not match any variant") {
        message = "not a value this key takes".to_string();
    }
    // serde quotes the offending value; it may be anything (a linked file's secrets).
    (path, elide_quoted(&message))
}

/// A message with its double-quoted values replaced by `"…"`.
fn elide_quoted(message: &str) -> String {
    let mut out = String::new();
    let mut rest = message;
    while let Some(start) = rest.find('"') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        match end {
            Some(i) => {
                out.push_str("\"…\"");
                rest = &after[i + 1..];
            }
            None => {
                out.push_str("\"…");
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}
