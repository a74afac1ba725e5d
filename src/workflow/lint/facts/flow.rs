//! Attacker text carried between the steps of a job, past `env:`: written by one step's
//! script to `$GITHUB_ENV` (or `$GITHUB_PATH`) or to a file, then read by a later step
//! as `${{ env.X }}`, run as a script, or run as code (`eval "$X"`).
//!
//! A script is read line by line (continuations joined): a shell variable holds attacker
//! text when an `env:` around the step sets it from such a value, an earlier step wrote
//! it to `$GITHUB_ENV`, or the script assigned it from one (or from the event payload's
//! text fields). This follows what scripts usually write; a script can always hide a
//! flow (a variable built piece by piece, a file renamed), which is why lint looks
//! beside it for the direct forms.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use github_actions_models::common::Env;
use github_actions_models::common::expr::LoE;
use github_actions_models::workflow::Workflow;
use github_actions_models::workflow::job::NormalJob;
use regex::Regex;

use super::env::env_text;
use super::shell::{SHELL_VAR, logical_lines};
use super::steps::{StepBody, StepView};
use super::taint::Taint;
use crate::workflow::lint::expr;

/// A place where attacker text goes that a later step (or line) reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sink {
    /// Its step, an index into the job's steps.
    pub step: usize,
    /// The script line's first line, to find its position.
    pub line: String,
    /// What happens (`$GITHUB_ENV`, `runs \`build.sh\``).
    pub what: String,
    pub why: String,
}

/// What the job's scripts carry from step to step.
#[derive(Debug, Default)]
pub(crate) struct Flows {
    /// Per step: the variables earlier steps set in `$GITHUB_ENV` from attacker text
    /// (name as written → why).
    pub env_before: Vec<BTreeMap<String, String>>,
    /// Writes of attacker text to `$GITHUB_ENV` or `$GITHUB_PATH`.
    pub env_writes: Vec<Sink>,
    /// Attacker text run as code: a file written from it, a variable holding it.
    pub runs: Vec<Sink>,
}

impl Flows {
    /// Why `env.NAME` holds attacker text before step `step` because an earlier step
    /// wrote it to `$GITHUB_ENV`; `None` when the step's own `env:` sets it.
    pub fn env_why(&self, step: &StepView<'_>, index: usize, name: &str) -> Option<&str> {
        let set_here = step.envs().iter().any(|env| match env {
            LoE::Literal(map) => map.keys().any(|k| k.eq_ignore_ascii_case(name)),
            LoE::Expr(_) => false,
        });
        if set_here {
            return None;
        }
        self.env_before
            .get(index)?
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, why)| why.as_str())
    }
}

/// `NAME=value` at the start of a line (after `export`, `local`, `declare -x`).
static ASSIGNMENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*(?:export\s+|local\s+|readonly\s+|declare\s+(?:-\S+\s+)*)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
        .expect("valid regex")
});
/// A redirect into `$GITHUB_ENV` or `$GITHUB_PATH`.
static ENV_FILE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(>>?|\btee\b[^|;&]*?)\s*["']?\$\{?GITHUB_(ENV|PATH)\b"#).expect("valid regex")
});
/// The names an `echo`/`printf` line writes: `NAME=` or a heredoc's `NAME<<`.
static ENV_NAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"\b(?:echo|printf)\s+(?:-[a-zA-Z]+\s+)*["']?([A-Za-z_][A-Za-z0-9_]*)(=|<<)"#)
        .expect("valid regex")
});
/// A redirect into a file, or `tee FILE`.
static FILE_WRITE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?:(?:^|[^0-9&>])>{1,2}|\btee\s+(?:-a\s+)?)\s*["']?([^\s"';|&<>()]+)"#)
        .expect("valid regex")
});
/// A file run as a script: `bash FILE`, `source FILE`, `. FILE`, `./FILE`,
/// `eval "$(cat FILE)"`.
static FILE_RUN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r#"(?:^|[;&|(]\s*|\b(?:then|do|else|sudo)\s+)"#,
        r#"(?:(?:bash|sh|zsh|source|\.|python3?|node|perl|ruby|pwsh)\s+(?:-[a-zA-Z]+\s+)*["']?([^\s"';|&)]+)"#,
        r#"|["']?(\./[^\s"';|&)]+)"#,
        r#"|(?:eval\s+["']?)?\$\(\s*cat\s+["']?([^\s"')]+))"#,
    ))
    .expect("valid regex")
});
/// A variable run as code: `eval "$X"`, `bash -c "$X"`, `python -c "$X"`.
static VAR_RUN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"\b(?:eval|(?:ba|z)?sh\s+-c|python3?\s+-c|node\s+-e|perl\s+-e)\s+["']?\$\{?([A-Za-z_][A-Za-z0-9_]*)"#)
        .expect("valid regex")
});
/// Text fields read from the event payload (`jq -r .pull_request.title "$GITHUB_EVENT_PATH"`)
/// or through `gh` (`gh pr view --json headRefName`).
static PAYLOAD_TEXT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b(title|body|head_ref|headRefName|ref|message|description|label|name|head_branch|display_title)\b")
        .expect("valid regex")
});

/// A file name as scripts compare it: quotes and a leading `./` dropped.
fn norm(path: &str) -> String {
    let p = path.trim_matches(|c| c == '"' || c == '\'');
    p.strip_prefix("./").unwrap_or(p).to_string()
}

/// The job's flows (see the module's text).
pub(crate) fn flows(
    job: &NormalJob,
    workflow: &Workflow,
    steps: &[StepView<'_>],
    taint: &Taint<'_>,
) -> Flows {
    let mut out = Flows::default();
    let mut file_env: BTreeMap<String, String> = BTreeMap::new();
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for (i, step) in steps.iter().enumerate() {
        out.env_before.push(file_env.clone());
        let StepBody::Run(run) = step.body else {
            continue;
        };
        let mut reader = Reader {
            step,
            index: i,
            taint,
            vars: initial_vars(job, workflow, step, taint, &file_env),
            file_env: &mut file_env,
            files: &mut files,
            heredoc: None,
            out: &mut out,
        };
        reader.script(run.run);
    }
    out
}

/// The shell variables holding attacker text when a step's script starts: from the
/// `env:` maps around it, outermost first, and what earlier steps wrote to `$GITHUB_ENV`
/// (which the step's own `env:` overrides).
fn initial_vars(
    job: &NormalJob,
    workflow: &Workflow,
    step: &StepView<'_>,
    taint: &Taint<'_>,
    file_env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    let apply = |env: &LoE<Env>, vars: &mut BTreeMap<String, String>| {
        for (k, v) in env_text(env) {
            match taint.why_in_text(&v, step.envs(), &step.inputs.tainted) {
                Some(why) => vars.insert(k.to_string(), why),
                None => vars.remove(k),
            };
        }
    };
    apply(&workflow.env, &mut vars);
    apply(&job.env, &mut vars);
    vars.extend(file_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    for env in step.envs().iter().rev() {
        apply(env, &mut vars);
    }
    vars
}

/// Reads one step's script, line by line.
struct Reader<'r, 's> {
    step: &'r StepView<'s>,
    index: usize,
    taint: &'r Taint<'s>,
    /// Shell variables holding attacker text, and why.
    vars: BTreeMap<String, String>,
    file_env: &'r mut BTreeMap<String, String>,
    files: &'r mut BTreeMap<String, String>,
    /// The variable a `NAME<<EOF` line opened in `$GITHUB_ENV`.
    heredoc: Option<String>,
    out: &'r mut Flows,
}

impl Reader<'_, '_> {
    fn script(&mut self, run: &str) {
        let lines = logical_lines(run);
        // A `{ …; } >> "$GITHUB_ENV"` group: its lines are one write.
        let mut group: Option<usize> = None;
        for (n, line) in lines.iter().enumerate() {
            let trimmed = line.trim();
            if trimmed == "{" {
                group = Some(n);
                continue;
            }
            let text = match group.take() {
                Some(start) if trimmed.starts_with('}') => lines[start..=n].join("\n"),
                Some(start) => {
                    group = Some(start);
                    line.clone()
                }
                None => line.clone(),
            };
            self.line(&text);
        }
    }

    /// Why a piece of script text holds attacker text: a variable that does, or an
    /// expression whose value can be.
    fn why(&self, text: &str) -> Option<String> {
        for cap in SHELL_VAR.captures_iter(text) {
            if let Some(why) = self.vars.get(&cap[1]) {
                return Some(format!("`${}` holds {why}", &cap[1]));
            }
        }
        let step = self.step;
        for e in expr::embedded(text) {
            let Ok(parsed) = expr::parse(e.body) else {
                continue;
            };
            for p in expr::value_paths(&parsed) {
                if let Some(name) = p.strip_prefix("env.")
                    && let Some(why) = self.out.env_why(step, self.index, name)
                {
                    return Some(format!("`{p}`, {why}"));
                }
                if let Some(why) = self.taint.why(&p, step.envs(), &step.inputs.tainted, 4) {
                    return Some(format!("`{p}`: {why}"));
                }
            }
        }
        None
    }

    fn sink(&mut self, text: &str, what: String, why: String, runs: bool) {
        let sink = Sink {
            step: self.index,
            line: text.lines().next().unwrap_or("").trim().to_string(),
            what,
            why,
        };
        if runs {
            self.out.runs.push(sink);
        } else {
            self.out.env_writes.push(sink);
        }
    }

    fn line(&mut self, text: &str) {
        let why = self.why(text);
        let label = format!("step {}", self.step.label.number);
        if let Some(cap) = ASSIGNMENT.captures(text) {
            let (name, rhs) = (cap[1].to_string(), &cap[2]);
            let from_payload = (rhs.contains("GITHUB_EVENT_PATH") || rhs.contains("gh pr view"))
                && PAYLOAD_TEXT.is_match(rhs);
            match self.why(rhs) {
                Some(w) => self.vars.insert(name, w),
                None if from_payload => self.vars.insert(
                    name,
                    "text read from the event's payload (titles, bodies, branch names)".into(),
                ),
                None => self.vars.remove(&name),
            };
        }
        if let Some(cap) = ENV_FILE.captures(text) {
            let file = format!("$GITHUB_{}", &cap[2]);
            let mut names = Vec::new();
            for c in ENV_NAME.captures_iter(text) {
                if &c[2] == "<<" {
                    self.heredoc = Some(c[1].to_string());
                }
                names.push((c[1].to_string(), &c[2] == "="));
            }
            match &why {
                Some(w) => {
                    if names.is_empty()
                        && let Some(h) = &self.heredoc
                    {
                        names.push((h.clone(), false));
                    }
                    for (n, _) in &names {
                        self.file_env.insert(
                            n.clone(),
                            format!("which {label} wrote to `$GITHUB_ENV` from {w}"),
                        );
                    }
                    self.sink(text, file, w.clone(), false);
                }
                None => {
                    for (n, plain) in names {
                        if plain {
                            self.file_env.remove(&n);
                        }
                    }
                }
            }
        } else if let Some(cap) = FILE_WRITE.captures(text) {
            let target = norm(&cap[1]);
            if !target.starts_with('&') && !target.starts_with("/dev/") && !target.contains('$') {
                match &why {
                    Some(w) => {
                        self.files
                            .insert(target, format!("{label} wrote it from {w}"));
                    }
                    None if !text.contains(">>") => {
                        self.files.remove(&target);
                    }
                    None => {}
                }
            }
        }
        for cap in FILE_RUN.captures_iter(text) {
            let Some(m) = cap.get(1).or(cap.get(2)).or(cap.get(3)) else {
                continue;
            };
            let target = norm(m.as_str());
            if let Some(w) = self.files.get(&target).cloned() {
                self.sink(text, format!("runs `{target}`"), w, true);
            }
        }
        for cap in VAR_RUN.captures_iter(text) {
            if let Some(w) = self.vars.get(&cap[1]).cloned() {
                self.sink(text, format!("runs `${}` as code", &cap[1]), w, true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patterns_read_what_scripts_write() {
        assert!(ENV_FILE.is_match(r#"echo "A=$B" >> "$GITHUB_ENV""#));
        assert!(ENV_FILE.is_match(r#"echo "A=$B" | tee -a ${GITHUB_ENV}"#));
        assert!(ENV_FILE.is_match("echo dir >>$GITHUB_PATH"));
        assert!(!ENV_FILE.is_match(r#"echo "A=$B" >> "$GITHUB_OUTPUT""#));
        let names: Vec<String> = ENV_NAME
            .captures_iter(r#"{ echo "A=1"; echo 'BODY<<EOF'; printf -v x "C=2"; }"#)
            .map(|c| format!("{}{}", &c[1], &c[2]))
            .collect();
        assert_eq!(names, ["A=", "BODY<<"]);
        let target = |l: &str| FILE_WRITE.captures(l).map(|c| norm(&c[1]));
        assert_eq!(target(r#"echo "$T" > ./t.sh"#).as_deref(), Some("t.sh"));
        assert_eq!(
            target(r#"echo "$T" | tee out.txt"#).as_deref(),
            Some("out.txt")
        );
        assert_eq!(target("make 2>&1"), None);
        assert_eq!(target("echo x >&2"), None);
        let run = |l: &str| {
            FILE_RUN
                .captures_iter(l)
                .filter_map(|c| c.get(1).or(c.get(2)).or(c.get(3)).map(|m| norm(m.as_str())))
                .collect::<Vec<_>>()
        };
        assert_eq!(run("bash t.sh && source ./env.sh"), ["t.sh", "env.sh"]);
        assert_eq!(run("./t.sh"), ["t.sh"]);
        assert_eq!(run(r#"eval "$(cat cmd.txt)""#), ["cmd.txt"]);
        assert!(run("echo bash is nice").is_empty());
        assert!(VAR_RUN.is_match(r#"bash -c "$CMD""#));
        assert!(!VAR_RUN.is_match(r#"echo "$CMD""#));
    }
}
