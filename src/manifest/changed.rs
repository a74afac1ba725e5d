//! `changed:`, what `cibox changed` reads: [`ChangedConfig`] (which files are tests,
//! how many GPUs each wants) and `changed.run` ([`ChangedRun`], the batch template one
//! changed test file runs in), their raw forms and checks, and the `defaults` keys the
//! template takes.

use std::collections::{BTreeMap, HashMap};

use indexmap::IndexMap;
use serde::Deserialize;

use crate::units::Span;

use super::caches::{CacheSpec, batch_caches};
use super::check::Checker;
use super::container::{ContainerConfig, RawContainer, validate_container};
use super::error::ManifestError;
use super::images::{DEFAULT_IMAGE, ImageConfig, known_image};
use super::patterns::{Selector, check_prefix, compile_glob, github_glob};
use super::schedule::RawRetries;
use super::types::{Batch, BatchVerdict};
use super::values::{EnvValue, env_map, ser_display};
use crate::util::is_env_name;

#[derive(Debug, Clone, serde::Serialize)]
pub struct ChangedConfig {
    /// The test files (the unnamed group; may be empty when `groups` say it all).
    pub patterns: Vec<String>,
    /// The unnamed group's path prefixes (vLLM's `source_file_dependencies`).
    pub paths: Vec<String>,
    /// What the unnamed group leaves out, though its patterns match it.
    pub exclude: Vec<String>,
    /// The unnamed group as a list in GitHub's order (`!` excludes, the last match
    /// decides), instead of `patterns`, `paths` and `exclude`.
    pub filter: Vec<String>,
    /// Which names of a renamed file changed.
    pub renames: Renames,
    /// The unnamed group's patterns, paths and exclusions, compiled.
    #[serde(skip)]
    pub selector: Selector,
    pub gpus_marker: String,
    pub default_gpus: u32,
    /// Named pattern sets, each test files or plain files, each with outputs of its own.
    pub groups: IndexMap<String, ChangeGroup>,
    /// How one changed test file runs in a container (`cibox changed run`).
    pub run: Option<ChangedRun>,
}

impl ChangedConfig {
    /// Every pattern that names test files: the unnamed group's and the test groups'.
    pub fn test_patterns(&self) -> impl Iterator<Item = &String> {
        self.patterns
            .iter()
            .chain(self.paths.iter())
            .chain(self.filter.iter())
            .chain(
                self.groups
                    .values()
                    .filter(|g| g.kind == GroupKind::Tests)
                    .flat_map(|g| g.patterns.iter().chain(g.paths.iter()).chain(&g.filter)),
            )
    }

    /// Whether the unnamed group says anything.
    pub fn unnamed(&self) -> bool {
        !(self.patterns.is_empty() && self.paths.is_empty() && self.filter.is_empty())
    }

    /// Whether a test file is one some test group takes (the unnamed one with patterns
    /// or paths, or a group of kind `tests`), its exclusions heeded.
    pub fn takes_test_file(&self, path: &str) -> bool {
        (self.unnamed() && self.selector.matches(path))
            || self
                .groups
                .values()
                .any(|g| g.kind == GroupKind::Tests && g.selector.matches(path))
    }

    /// Every pattern, path and exclusion with where it is written
    /// (`changed.groups.docs.exclude`), for the warning about those that match nothing.
    pub fn written(&self) -> Vec<(String, PatternKind, String)> {
        let mut out = Vec::new();
        let mut push = |at: String, patterns: &[String], kind: PatternKind| {
            out.extend(patterns.iter().map(|p| (at.clone(), kind, p.clone())));
        };
        push("changed.patterns".into(), &self.patterns, PatternKind::Glob);
        push("changed.paths".into(), &self.paths, PatternKind::Prefix);
        push("changed.exclude".into(), &self.exclude, PatternKind::Glob);
        push("changed.filter".into(), &self.filter, PatternKind::GitHub);
        for (name, g) in &self.groups {
            let at = |key: &str| format!("changed.groups.{name}.{key}");
            push(at("patterns"), &g.patterns, PatternKind::Glob);
            push(at("paths"), &g.paths, PatternKind::Prefix);
            push(at("exclude"), &g.exclude, PatternKind::Glob);
            push(at("filter"), &g.filter, PatternKind::GitHub);
        }
        out
    }
}

/// How a written pattern matches: a glob, a path prefix, or a pattern of a `filter`
/// list (GitHub's syntax, a leading `!` included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternKind {
    Glob,
    Prefix,
    GitHub,
}

/// Which names of a renamed file count as changed (`changed.renames`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Renames {
    /// Its old name and its new one, as dorny/paths-filter counts them (a rename is a
    /// delete and an add, `src/main.ts`): the default of a manifest rendering for GitHub.
    Both,
    /// Its new name alone, as `git diff --name-only` lists it (vLLM's ci-infra,
    /// `buildkite/pipeline_generator/utils_lib/git_utils.py:31-43`): the default of a
    /// manifest rendering Buildkite pipelines (`workflows.buildkite`).
    New,
}

/// One named set of `changed` patterns.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeGroup {
    /// Globs (`*`, `**`, `?`, `[…]`, `{a,b}`).
    #[serde(default)]
    pub patterns: Vec<String>,
    /// Path prefixes: a file, or a folder and everything below it.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Globs of what the group leaves out, though `patterns` or `paths` take it.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// A list in GitHub's order and syntax, instead of the three above.
    #[serde(default)]
    pub filter: Vec<String>,
    #[serde(default)]
    pub kind: GroupKind,
    /// The above, compiled when the manifest is read.
    #[serde(skip)]
    pub selector: Selector,
}

impl GroupKind {
    /// The step outputs (`--github-output`) of the group named `group` (`None`: the
    /// unnamed one, `changed.patterns`): `[GROUP_]matrix` and `[GROUP_]has_tests` for
    /// test files, `GROUP` and `GROUP_files` for plain files.
    pub fn outputs(self, group: Option<&str>) -> [String; 2] {
        let key = |k: &str| match group {
            Some(g) => format!("{g}_{k}"),
            None => k.to_string(),
        };
        match self {
            GroupKind::Tests => [key("matrix"), key("has_tests")],
            GroupKind::Files => [group.unwrap_or("files").to_string(), key("files")],
        }
    }
}

/// What a change group's files are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupKind {
    /// Test files, each with its GPU count: a matrix.
    #[default]
    Tests,
    /// Plain files (library code, build files): whether any changed, and which.
    Files,
}

/// `changed.run`: a batch template for one test file, named in the container by
/// `$CIBOX_TEST_FILE` (never pasted into the command). Keys not given come from
/// `defaults`, the container from the top-level `container`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChangedRun {
    pub command: String,
    #[serde(serialize_with = "ser_display")]
    pub timeout: Span,
    pub preflight: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub fast_env: BTreeMap<String, String>,
    pub allow_empty: bool,
    pub container: ContainerConfig,
    pub verdict: BatchVerdict,
    /// The model the GPUs of a test file's batch must be (a glob), as a batch's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// The image test files run in.
    pub image: String,
    /// The caches test files use.
    pub caches: Vec<String>,
    /// How the source is installed for them, instead of their image's `install` (or
    /// `source.install`), as a batch's `install`.
    pub install: Option<Vec<String>>,
    /// How long a test file's batch is expected to run, as a batch's `est_time`.
    #[serde(skip)]
    pub est_time: Option<Span>,
    /// How often a test file's batch runs again when it did not pass.
    pub retries: crate::manifest::Retries,
    /// Whether a test file's failure fails the run.
    pub soft_fail: bool,
}

impl ChangedRun {
    /// The batch that runs one test file with `gpus` GPUs: `CIBOX_TEST_FILE` names
    /// the file in the container, never the command line.
    pub fn batch_for(&self, file: &str, gpus: u32) -> Batch {
        let mut env = self.env.clone();
        env.insert("CIBOX_TEST_FILE".into(), file.to_string());
        Batch {
            nodes: 1,
            shards: 1,
            description: Some(format!("changed test file {file}")),
            gpus,
            gpu_model: self.gpu_model.clone(),
            timeout: self.timeout,
            preflight: self.preflight.clone(),
            run: vec![self.command.clone()],
            env,
            fast_env: self.fast_env.clone(),
            allow_empty: self.allow_empty,
            tests: vec![file.to_string()],
            container: self.container.clone(),
            meta: serde_json::json!({ "test_file": file }),
            verdict: self.verdict,
            image: self.image.clone(),
            image_named: true,
            install: self.install.clone(),
            caches: self.caches.clone(),
            est_time: self.est_time,
            retries: self.retries.clone(),
            soft_fail: self.soft_fail,
            family: None,
            changed_file: Some(file.to_string()),
            working_dir: None,
            queue: None,
            manual: false,
            changes: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChanged {
    #[serde(default)]
    patterns: Vec<String>,
    #[serde(default)]
    filter: Vec<String>,
    renames: Option<Renames>,
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    exclude: Vec<String>,
    #[serde(default)]
    groups: IndexMap<String, ChangeGroup>,
    #[serde(default = "default_marker")]
    gpus_marker: String,
    #[serde(default = "default_gpus")]
    default_gpus: u32,
    run: Option<RawChangedRun>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChangedRun {
    command: String,
    timeout: Option<Span>,
    #[serde(default)]
    preflight: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, EnvValue>,
    #[serde(default)]
    fast_env: BTreeMap<String, EnvValue>,
    #[serde(default)]
    allow_empty: bool,
    container: Option<RawContainer>,
    verdict: Option<BatchVerdict>,
    gpu_model: Option<String>,
    image: Option<String>,
    install: Option<Vec<String>>,
    caches: Option<Vec<String>>,
    est_time: Option<Span>,
    retries: Option<RawRetries>,
    #[serde(default)]
    soft_fail: bool,
}

/// The `defaults` keys that `changed.run` takes (the rest describe named batches).
pub(super) const CHANGED_RUN_DEFAULTS: [&str; 14] = [
    "est_time",
    "retries",
    "soft_fail",
    "caches",
    "gpu_model",
    "image",
    "install",
    "verdict",
    "timeout",
    "preflight",
    "env",
    "fast_env",
    "allow_empty",
    "container",
];

fn default_marker() -> String {
    "NUM_GPUS".into()
}

fn default_gpus() -> u32 {
    8
}

/// Reads `changed:`; `top_container` is the top-level `container:`, the template's when
/// it has none.
pub(super) fn validate_changed(
    check: &Checker<'_>,
    images: &IndexMap<String, ImageConfig>,
    caches: &IndexMap<String, CacheSpec>,
    top_container: &RawContainer,
    ch: RawChanged,
    buildkite: bool,
) -> Result<ChangedConfig, ManifestError> {
    if ch.patterns.is_empty() && ch.paths.is_empty() && ch.filter.is_empty() && ch.groups.is_empty()
    {
        return Err(check.at(
            &["changed", "patterns"],
            "lists no pattern (and `groups` names none)",
        ));
    }
    let mut ch = ch;
    let selector = check_patterns(
        check,
        &["changed"],
        [&ch.patterns, &ch.paths, &ch.exclude, &ch.filter],
    )?;
    for (name, g) in &mut ch.groups {
        g.selector = check_patterns(
            check,
            &["changed", "groups", name.as_str()],
            [&g.patterns, &g.paths, &g.exclude, &g.filter],
        )?;
    }
    for (name, g) in &ch.groups {
        let at = ["changed", "groups", name.as_str()];
        // A group's outputs are named after it: `NAME_matrix`, or `NAME` and `NAME_files`.
        let output_ok = name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            && name.bytes().next().is_some_and(|b| b.is_ascii_alphabetic());
        if !output_ok || matches!(name.as_str(), "matrix" | "has_tests" | "selected_batches") {
            return Err(check.at_key(
                &at,
                format!("`{name}` cannot name a change group: its outputs are named after it, so use letters, digits, `_` and `-`, starting with a letter, and not `matrix`, `has_tests` or `selected_batches`"),
            ));
        }
        if g.patterns.is_empty() && g.paths.is_empty() && g.filter.is_empty() {
            return Err(check.at(
                &["changed", "groups", name.as_str(), "patterns"],
                "lists no pattern (and neither `paths` nor `filter` names any)",
            ));
        }
    }
    // Each step output is one group's: GitHub keeps one value of a name written twice.
    let mut outputs: HashMap<String, Option<&str>> = HashMap::new();
    if !(ch.patterns.is_empty() && ch.paths.is_empty() && ch.filter.is_empty()) {
        for o in GroupKind::Tests.outputs(None) {
            outputs.insert(o, None);
        }
    }
    for (name, g) in &ch.groups {
        for o in g.kind.outputs(Some(name)) {
            if let Some(other) = outputs.insert(o.clone(), Some(name)) {
                let other = match other {
                    Some(other) => format!("group `{other}`"),
                    None => "`changed.patterns`".to_string(),
                };
                return Err(check.at_key(
                    &["changed", "groups", name.as_str()],
                    format!("writes the step output `{o}`, which {other} writes too (one would hide the other); rename one of them"),
                ));
            }
        }
    }
    if !is_env_name(&ch.gpus_marker) {
        return Err(check.at(
            &["changed", "gpus_marker"],
            "must be a Python identifier such as NUM_GPUS",
        ));
    }
    let run = match ch.run {
        None => None,
        Some(r) => Some(validate_changed_run(
            check,
            images,
            caches,
            top_container,
            r,
        )?),
    };
    Ok(ChangedConfig {
        patterns: ch.patterns,
        paths: ch.paths,
        exclude: ch.exclude,
        filter: ch.filter,
        renames: ch.renames.unwrap_or(if buildkite {
            Renames::New
        } else {
            Renames::Both
        }),
        selector,
        gpus_marker: ch.gpus_marker,
        default_gpus: ch.default_gpus,
        groups: ch.groups,
        run,
    })
}

/// Each batch's `changes`: groups `changed.groups` defines, each once.
pub(super) fn check_batch_changes(
    check: &Checker<'_>,
    batches: &IndexMap<String, Batch>,
    changed: Option<&ChangedConfig>,
) -> Result<(), ManifestError> {
    for (name, b) in batches {
        for (i, g) in b.changes.iter().enumerate() {
            let at = ["batches", name.as_str(), "changes", &i.to_string()];
            let Some(cfg) = changed else {
                return Err(check.at(
                    &at,
                    format!("names change group `{g}`, but the manifest has no `changed:` section to define it"),
                ));
            };
            if !cfg.groups.contains_key(g) {
                let known: Vec<String> = cfg.groups.keys().cloned().collect();
                return Err(check.at(
                    &at,
                    format!(
                        "change group `{g}` is not defined (changed.groups: {})",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            }
            if b.changes[..i].contains(g) {
                return Err(check.at(&at, format!("change group `{g}` is named twice")));
            }
        }
    }
    Ok(())
}

/// Checks a group's `patterns` and `exclude` (globs), `paths` (path prefixes) and
/// `filter` (GitHub's), naming the first that cannot be one by its position
/// (`changed.groups.g.exclude.1`); gives the group's selector. `filter` stands alone:
/// beside the others, which decides would be unclear.
fn check_patterns(
    check: &Checker<'_>,
    at: &[&str],
    [patterns, paths, exclude, filter]: [&Vec<String>; 4],
) -> Result<Selector, ManifestError> {
    let place = |key: &str, i: usize| -> Vec<String> {
        let mut p: Vec<String> = at.iter().map(|s| s.to_string()).collect();
        p.push(key.to_string());
        p.push(i.to_string());
        p
    };
    for (key, globs) in [("patterns", patterns), ("exclude", exclude)] {
        for (i, g) in globs.iter().enumerate() {
            compile_glob(g).map_err(|why| check.at(&place(key, i), why))?;
        }
    }
    for (i, p) in paths.iter().enumerate() {
        check_prefix(p).map_err(|why| check.at(&place("paths", i), why))?;
    }
    if filter.is_empty() {
        return Ok(Selector::new(patterns, paths, exclude));
    }
    if !(patterns.is_empty() && paths.is_empty() && exclude.is_empty()) {
        let mut p: Vec<String> = at.iter().map(|s| s.to_string()).collect();
        p.push("filter".into());
        return Err(check.at(
            &p,
            "stands alone: a list in GitHub's order decides by its last match, so `patterns`, `paths` and `exclude` beside it would leave unclear which wins; write them into `filter` (`!` to exclude)",
        ));
    }
    for (i, g) in filter.iter().enumerate() {
        github_glob(g).map_err(|why| check.at(&place("filter", i), why))?;
    }
    if filter.iter().all(|g| g.starts_with('!')) {
        return Err(check.at(
            &place("filter", 0),
            "only excludes (`!`): in GitHub's order a list of exclusions takes no file; start with what it takes (`**` for everything)",
        ));
    }
    Ok(Selector::filter(filter))
}

/// Reads `changed.run`.
fn validate_changed_run(
    check: &Checker<'_>,
    images: &IndexMap<String, ImageConfig>,
    caches: &IndexMap<String, CacheSpec>,
    top_container: &RawContainer,
    r: RawChangedRun,
) -> Result<ChangedRun, ManifestError> {
    let Some(timeout) = r.timeout.filter(|t| !t.0.is_zero()) else {
        return Err(check.at(
            &["changed", "run"],
            "needs a `timeout` of more than 0s (here or under `defaults:`)",
        ));
    };
    if r.command.trim().is_empty() {
        return Err(check.at(&["changed", "run", "command"], "is empty"));
    }
    let container = match r.container {
        Some(c) => validate_container(check, &["changed", "run", "container"], c)?,
        None => validate_container(check, &["container"], top_container.clone())?,
    };
    let caches = batch_caches(check, &["changed", "run"], caches, r.caches, &container)?;
    if let Some(glob) = &r.gpu_model {
        crate::manifest::check_model_glob(glob)
            .map_err(|why| check.at(&["changed", "run", "gpu_model"], why))?;
    }
    Ok(ChangedRun {
        est_time: super::schedule::est_time(check, &["changed", "run", "est_time"], r.est_time)?,
        retries: super::schedule::retries(check, &["changed", "run", "retries"], r.retries)?,
        soft_fail: r.soft_fail,
        gpu_model: r.gpu_model,
        caches,
        install: r.install,
        command: r.command,
        timeout,
        preflight: r.preflight,
        env: env_map(check, &["changed", "run", "env"], r.env)?,
        fast_env: env_map(check, &["changed", "run", "fast_env"], r.fast_env)?,
        allow_empty: r.allow_empty,
        container,
        verdict: r.verdict.unwrap_or_default(),
        image: match r.image {
            Some(img) => {
                known_image(check, images, &["changed", "run", "image"], &img)?;
                img
            }
            None => DEFAULT_IMAGE.to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::{REAL, parse};
    use crate::manifest::{ContainerUser, Ipc};

    #[test]
    fn changed_run_takes_the_defaults_that_fit_and_the_container() {
        let text = REAL.replace(
            "layers:",
            "changed:\n  patterns: [\"tests/**/test_*.py\"]\n  run:\n    command: pytest \"$CIBOX_TEST_FILE\"\n    container: {ipc: host}\nlayers:",
        );
        let mut m = parse(&text).unwrap();
        // CIBOX_* overrides reach every container, the template's too.
        m.apply_env(|k| (k == "CIBOX_MEMORY").then(|| "2g".to_string()))
            .unwrap();
        assert_eq!(m.batches["e2e"].container.memory.unwrap().to_string(), "2g");
        let run = m.changed.unwrap().run.unwrap();
        assert_eq!(run.container.memory.unwrap().to_string(), "2g");
        assert_eq!(run.timeout.to_string(), "2h");
        assert!(run.allow_empty);
        assert_eq!(run.env["SHARED"], "1");
        assert_eq!(run.container.ipc, Ipc::Host);
        assert_eq!(run.container.user, ContainerUser::Root);
        assert_eq!(run.container.mounts.len(), 2);
        let no_default = text
            .replace("defaults:\n  timeout: 2h\n", "defaults:\n")
            .replace("    gpus: 8\n", "    gpus: 8\n    timeout: 1h\n");
        let err = parse(&no_default).unwrap_err();
        assert!(err.contains("changed.run: needs a `timeout`"), "{err}");
    }

    #[test]
    fn changed_run_takes_an_install_of_its_own_or_the_defaults() {
        let text = REAL.replace(
            "layers:",
            "changed:\n  patterns: [\"tests/**/test_*.py\"]\n  run:\n    command: pytest \"$CIBOX_TEST_FILE\"\n    install: [\"pip install -e .\"]\nlayers:",
        );
        let run = parse(&text).unwrap().changed.unwrap().run.unwrap();
        let want = vec!["pip install -e .".to_string()];
        assert_eq!(run.install.as_ref(), Some(&want));
        assert_eq!(run.batch_for("tests/test_a.py", 1).install, Some(want));
        // From the defaults; none: the image's (or `source.install`), as for a batch.
        let from_defaults = text
            .replace("    install: [\"pip install -e .\"]\n", "")
            .replace("defaults:\n", "defaults:\n  install: []\n");
        let run = parse(&from_defaults).unwrap().changed.unwrap().run.unwrap();
        assert_eq!(run.batch_for("t.py", 0).install, Some(vec![]));
        let none = text.replace("    install: [\"pip install -e .\"]\n", "");
        let run = parse(&none).unwrap().changed.unwrap().run.unwrap();
        assert_eq!(run.batch_for("t.py", 0).install, None);
    }

    #[test]
    fn change_groups_whose_outputs_share_a_name_are_refused() {
        let with = |groups: &str| {
            REAL.replace(
                "layers:",
                &format!(
                    "changed:\n  patterns: [\"tests/**/test_*.py\"]\n  groups:\n{groups}layers:"
                ),
            )
        };
        let err = parse(&with(
            "    lib: {patterns: [src/**], kind: files}\n    lib_files: {patterns: [docs/**], kind: files}\n",
        ))
        .unwrap_err();
        assert!(
            err.contains("cibox.yaml:37:5: changed.groups.lib_files: writes the step output `lib_files`, which group `lib` writes too (one would hide the other); rename one of them"),
            "{err}"
        );
        let err = parse(&with(
            "    t: {patterns: [tests/**]}\n    t_matrix: {patterns: [src/**], kind: files}\n",
        ))
        .unwrap_err();
        assert!(
            err.contains("changed.groups.t_matrix: writes the step output `t_matrix`, which group `t` writes too"),
            "{err}"
        );
        // Apart, they are fine.
        parse(&with(
            "    lib: {patterns: [src/**], kind: files}\n    t: {patterns: [tests/**]}\n",
        ))
        .unwrap();
    }
}
