//! Test lists: a batch with `each:` is a family, one batch per entry (a test file with
//! its GPUs, timeout, arguments, variables), each named after its file and the family
//! (`megatron-test_qwen3_0.6B`), so that a 100-test GPU suite is a list, not a hundred
//! batches written out. An entry's batch is the family's with the entry's keys over it;
//! its steps find the file in `$CIBOX_TEST_FILE` and the arguments in
//! `$CIBOX_TEST_ARGS` (never pasted into a command).

use std::collections::{BTreeMap, HashMap};

use indexmap::IndexMap;
use serde::Deserialize;

use crate::units::Span;

use super::check::Checker;
use super::error::ManifestError;
use super::schedule;
use super::schedule::RawRetries;
use super::types::Batch;
use super::values::{EnvValue, env_map, is_name, plain_meta};

/// The most batches a manifest may hold, entries of test lists included: each is a
/// container plan, a row in every listing and a job a template may render.
pub const MAX_BATCHES: usize = 10_000;

/// One entry of `each:`. Its keys lie over the family's as everywhere: `None` is a key
/// not written (the family's stays), `Some(None)` a key set to `null` (the family's is
/// removed), for the keys the family may have.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEntry {
    file: String,
    /// `null`: the derived name, as when not written (a family has no name to lay under).
    name: Option<String>,
    #[serde(default, deserialize_with = "written")]
    gpus: Option<Option<i64>>,
    /// `null`: any model, removing the family's.
    #[serde(default, deserialize_with = "written")]
    gpu_model: Option<Option<String>>,
    #[serde(default, deserialize_with = "written")]
    timeout: Option<Option<Span>>,
    /// `null`: no arguments, as when not written.
    args: Option<String>,
    #[serde(default, deserialize_with = "written")]
    env: Option<Option<BTreeMap<String, Option<EnvValue>>>>,
    #[serde(default, deserialize_with = "written")]
    description: Option<Option<String>>,
    #[serde(default, deserialize_with = "written")]
    meta: Option<Option<serde_json::Value>>,
    /// `null`: no expected time, removing the family's.
    #[serde(default, deserialize_with = "written")]
    est_time: Option<Option<Span>>,
    /// `null`: no retries, removing the family's.
    #[serde(default, deserialize_with = "written")]
    retries: Option<Option<RawRetries>>,
    /// `null`: its failure fails the run, as the default.
    #[serde(default, deserialize_with = "written")]
    soft_fail: Option<Option<bool>>,
}

impl RawEntry {
    /// An entry a collector printed (`collect:`), its suite kept in `meta.suite`.
    pub(super) fn collected(
        file: String,
        name: Option<String>,
        gpus: Option<u32>,
        gpu_model: Option<String>,
        args: Option<String>,
        est_time: Option<Span>,
        suite: Option<String>,
    ) -> RawEntry {
        RawEntry {
            file,
            name,
            gpus: gpus.map(|g| Some(i64::from(g))),
            gpu_model: gpu_model.map(Some),
            timeout: None,
            args,
            env: None,
            description: None,
            meta: suite.map(|s| Some(serde_json::json!({ "suite": s }))),
            est_time: est_time.map(Some),
            retries: None,
            soft_fail: None,
        }
    }
}

/// A key that is written, `null` included (`Some(None)`); with `#[serde(default)]` a
/// key not written is `None`.
fn written<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// The name an entry's batch gets: its own `name`, else the family's name and the file's
/// (without folders and extension), every character a batch name cannot hold made `_`.
fn derived_name(family: &str, file: &str) -> String {
    let base = file.rsplit('/').next().unwrap_or(file);
    let stem = match base.rsplit_once('.') {
        Some((stem, _)) if !stem.is_empty() => stem,
        _ => base,
    };
    let stem: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{family}-{stem}")
}

/// The batches of family `family` (whose own keys are `template`), in list order; the
/// names already taken (`taken`: batch name → where) may not be taken again.
pub(super) fn expand(
    check: &Checker<'_>,
    list: &str,
    family: &str,
    template: &Batch,
    entries: Vec<RawEntry>,
    taken: &mut HashMap<String, String>,
) -> Result<IndexMap<String, Batch>, ManifestError> {
    let at = |i: usize, key: &str| -> Vec<String> {
        let mut p = vec![
            "batches".to_string(),
            family.to_string(),
            list.to_string(),
            i.to_string(),
        ];
        if !key.is_empty() {
            p.push(key.to_string());
        }
        p
    };
    if entries.is_empty() {
        return Err(check.at(&["batches", family, list], "lists no test"));
    }
    if entries.len() > MAX_BATCHES {
        return Err(check.at(
            &["batches", family, list],
            format!(
                "lists {} tests; a manifest holds at most {MAX_BATCHES} batches",
                entries.len()
            ),
        ));
    }
    let mut out = IndexMap::new();
    for (i, e) in entries.into_iter().enumerate() {
        if e.file.is_empty() || !crate::util::is_plain_relative(&e.file) {
            return Err(check.at(
                &at(i, "file"),
                format!(
                    "`{}` is not a path relative to the source (no `..`, no leading `/`)",
                    crate::util::escape(&e.file)
                ),
            ));
        }
        let name = e
            .name
            .clone()
            .unwrap_or_else(|| derived_name(family, &e.file));
        if !is_name(&name, true) {
            return Err(check.at(
                &at(i, if e.name.is_some() { "name" } else { "file" }),
                format!("gives the batch name `{name}`, which is not one: use letters, digits, `_`, `.` and `-`, starting with a letter or digit; or give the entry a `name:`"),
            ));
        }
        let here = format!("batches.{family}.{list}.{i}");
        if let Some(other) = taken.insert(name.clone(), here.clone()) {
            return Err(check.at(
                &at(i, if e.name.is_some() { "name" } else { "file" }),
                format!("gives the batch name `{name}`, which {other} has already; give this entry a `name:` of its own"),
            ));
        }
        out.insert(name, entry_batch(check, family, template, e, &at(i, ""))?);
    }
    Ok(out)
}

/// An entry's batch: the family's, with the entry's keys laid over it.
fn entry_batch(
    check: &Checker<'_>,
    family: &str,
    template: &Batch,
    e: RawEntry,
    at: &[String],
) -> Result<Batch, ManifestError> {
    let key = |k: &str| -> Vec<String> {
        let mut p = at.to_vec();
        p.push(k.to_string());
        p
    };
    let mut b = template.clone();
    // Where the batch cannot be without the key, `null` says what it would remove.
    let cannot_remove = |k: &str, what: &str, family_has: String| {
        check.at(
            &key(k),
            format!("an entry's batch cannot be without {what} (`null` removes the family's {family_has}): give {}, or drop the key to keep the family's", if k == "gpus" { "a number" } else { "a duration" }),
        )
    };
    match e.gpus {
        None => {}
        Some(None) => {
            return Err(cannot_remove("gpus", "a GPU count", b.gpus.to_string()));
        }
        Some(Some(gpus)) => {
            if !(0..=i64::from(u32::MAX)).contains(&gpus) {
                return Err(check.at(&key("gpus"), format!("must be 0 or more, got {gpus}")));
            }
            b.gpus = gpus as u32;
        }
    }
    match e.gpu_model {
        None => {}
        Some(None) => b.gpu_model = None,
        Some(Some(glob)) => {
            crate::manifest::check_model_glob(&glob)
                .map_err(|why| check.at(&key("gpu_model"), why))?;
            b.gpu_model = Some(glob);
        }
    }
    match e.timeout {
        None => {}
        Some(None) => {
            return Err(cannot_remove("timeout", "a timeout", b.timeout.to_string()));
        }
        Some(Some(t)) => {
            if t.0.is_zero() {
                return Err(check.at(&key("timeout"), "must be more than 0s"));
            }
            b.timeout = t;
        }
    }
    let env_key = key("env");
    let env_at: Vec<&str> = env_key.iter().map(String::as_str).collect();
    match e.env {
        None => {}
        Some(None) => b.env.clear(),
        Some(Some(env)) => {
            let mut set = BTreeMap::new();
            for (k, v) in env {
                match v {
                    None => {
                        b.env.remove(&k);
                    }
                    Some(v) => {
                        set.insert(k, v);
                    }
                }
            }
            b.env.extend(env_map(check, &env_at, set)?);
        }
    }
    match e.est_time {
        None => {}
        Some(est) => b.est_time = schedule::est_time(check, &key("est_time"), est)?,
    }
    match e.retries {
        None => {}
        Some(raw) => b.retries = schedule::retries(check, &key("retries"), raw)?,
    }
    match e.soft_fail {
        None => {}
        Some(soft) => b.soft_fail = soft.unwrap_or(false),
    }
    b.env.insert("CIBOX_TEST_FILE".into(), e.file.clone());
    b.env
        .insert("CIBOX_TEST_ARGS".into(), e.args.clone().unwrap_or_default());
    match e.description {
        None => {}
        Some(d) => b.description = d,
    }
    let meta_at: Vec<String> = key("meta");
    let meta_at: Vec<&str> = meta_at.iter().map(String::as_str).collect();
    match e.meta {
        None => {}
        Some(None) => b.meta = serde_json::Value::Object(Default::default()),
        Some(Some(meta)) => {
            let meta = plain_meta(check, &meta_at, Some(meta), true)?;
            overlay_meta(&mut b.meta, meta);
        }
    }
    if let Some(own) = b.meta.as_object_mut() {
        own.insert("test_file".into(), e.file.clone().into());
    }
    b.tests = vec![e.file];
    b.family = Some(family.to_string());
    Ok(b)
}

/// An entry's `meta` laid over its family's: mappings merge key by key, a key set to
/// `null` removes the family's, anything else replaces it (as the YAML layers do).
fn overlay_meta(base: &mut serde_json::Value, over: serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(base), serde_json::Value::Object(over)) => {
            for (k, v) in over {
                if v.is_null() {
                    base.remove(&k);
                } else if let Some(have) = base.get_mut(&k) {
                    overlay_meta(have, v);
                } else {
                    base.insert(k, v);
                }
            }
        }
        (base, over) => *base = over,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::tests::parse;

    const SUITE: &str = "version: 1\nproject: slime\nimage: {locks: [x]}\ndefaults: {timeout: 30m}\nbatches:\n  unit: {gpus: 0, run: [pytest tests/unit]}\n  megatron:\n    gpus: 2\n    run: [\"python $CIBOX_TEST_FILE $CIBOX_TEST_ARGS\"]\n    each:\n      - {file: tests/test_qwen3_0.6B_fsdp.py}\n      - {file: tests/test_glm4.py, gpus: 8, timeout: 1h, args: --fast, env: {SEED: \"1\"}}\n      - {file: tests/test_glm4.py, name: glm4-slow, gpus: 8}\nlayers:\n  gpu: {batches: [megatron]}\n  everything: {batches: all}\n";

    #[test]
    fn each_entry_is_a_batch_named_after_its_file() {
        let m = parse(SUITE).unwrap();
        let names: Vec<&String> = m.batches.keys().collect();
        assert_eq!(
            names,
            [
                "unit",
                "megatron-test_qwen3_0.6B_fsdp",
                "megatron-test_glm4",
                "glm4-slow"
            ]
        );
        let qwen = &m.batches["megatron-test_qwen3_0.6B_fsdp"];
        assert_eq!((qwen.gpus, qwen.timeout.to_string().as_str()), (2, "30m"));
        assert_eq!(qwen.env["CIBOX_TEST_FILE"], "tests/test_qwen3_0.6B_fsdp.py");
        assert_eq!(qwen.tests, ["tests/test_qwen3_0.6B_fsdp.py"]);
        assert_eq!(qwen.family.as_deref(), Some("megatron"));
        let glm = &m.batches["megatron-test_glm4"];
        assert_eq!((glm.gpus, glm.timeout.to_string().as_str()), (8, "1h"));
        assert_eq!(glm.env["CIBOX_TEST_ARGS"], "--fast");
        assert_eq!(glm.env["SEED"], "1");
        // A layer naming the family runs its entries; `all` is every batch.
        assert_eq!(m.layers["gpu"].batches.len(), 3);
        assert_eq!(m.layers["everything"].batches.len(), 4);
        assert_eq!(m.families["megatron"].len(), 3);
    }

    #[test]
    fn an_entry_lies_over_its_family_with_the_same_null_rule() {
        let family = SUITE
            .replace(
                "    gpus: 2\n",
                "    gpus: 2\n    description: the family\n    env: {NCCL_DEBUG: INFO, KEEP: \"1\"}\n    meta: {runner: gpu, deps: {a: 1, b: 2}}\n",
            )
            .replace(
                "name: glm4-slow, gpus: 8}",
                "name: glm4-slow, gpus: 8, env: {NCCL_DEBUG: null, NEW: ~}, description: null, meta: {runner: null, deps: {b: null, c: 3}}}",
            );
        let m = parse(&family).unwrap();
        let slow = &m.batches["glm4-slow"];
        assert!(!slow.env.contains_key("NCCL_DEBUG") && !slow.env.contains_key("NEW"));
        assert_eq!(slow.env["KEEP"], "1");
        assert_eq!(slow.description, None);
        assert_eq!(
            slow.meta,
            serde_json::json!({"deps": {"a": 1, "c": 3}, "test_file": "tests/test_glm4.py"})
        );
        let qwen = &m.batches["megatron-test_qwen3_0.6B_fsdp"];
        assert_eq!(qwen.env["NCCL_DEBUG"], "INFO");
        assert_eq!(qwen.description.as_deref(), Some("the family"));
        // `env: null` removes all the family's variables (cibox's own stay).
        // `name: null` is the derived name, as when not written.
        let err = parse(&family.replace("name: glm4-slow", "name: null")).unwrap_err();
        assert!(
            err.contains("`megatron-test_glm4`, which batches.megatron.each.1 has already"),
            "{err}"
        );
        let m = parse(&family.replace("env: {NCCL_DEBUG: null, NEW: ~}", "env: null, args: null"))
            .unwrap();
        let slow = &m.batches["glm4-slow"];
        assert_eq!(
            slow.env.keys().collect::<Vec<_>>(),
            ["CIBOX_TEST_ARGS", "CIBOX_TEST_FILE"]
        );
        // A key an entry's batch cannot be without says so.
        for (key, want) in [
            (
                "gpus",
                "each.2.gpus: an entry's batch cannot be without a GPU count (`null` removes the family's 2): give a number, or drop the key to keep the family's",
            ),
            (
                "timeout",
                "each.2.timeout: an entry's batch cannot be without a timeout (`null` removes the family's 30m): give a duration, or drop the key to keep the family's",
            ),
        ] {
            let err = parse(&SUITE.replace(
                "name: glm4-slow, gpus: 8",
                &format!("name: glm4-slow, gpus: 8, {key}: null").replacen(
                    "gpus: 8, gpus: null",
                    "gpus: null",
                    1,
                ),
            ))
            .unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        let err = parse(&SUITE.replace("env: {SEED: \"1\"}", "env: {SEED: [1]}")).unwrap_err();
        assert!(
            err.contains("each.1.env.SEED: an environment value must be a string"),
            "{err}"
        );
        let err = parse(&SUITE.replace("env: {SEED: \"1\"}", "meta: {a: [~]}")).unwrap_err();
        assert!(err.contains("each.1.meta.a.0: is empty (null)"), "{err}");
    }

    #[test]
    fn entries_that_collide_or_say_too_much_are_refused_with_a_position() {
        let err = parse(&SUITE.replace(", name: glm4-slow", "")).unwrap_err();
        assert!(
            err.contains("batches.megatron.each.2.file: gives the batch name `megatron-test_glm4`, which batches.megatron.each.1 has already"),
            "{err}"
        );
        let err = parse(&SUITE.replace("name: glm4-slow", "name: unit")).unwrap_err();
        assert!(err.contains("which batches.unit has already"), "{err}");
        // A family's name stands for its entries: no entry may take it, its own
        // family's or another's (defined before or after it).
        let err = parse(&SUITE.replace("name: glm4-slow", "name: megatron")).unwrap_err();
        assert!(
            err.contains("batches.megatron.each.2.name: gives the batch name `megatron`, which batches.megatron (a test list, whose name stands for all its entries) has already"),
            "{err}"
        );
        let two = SUITE.replace(
            "layers:",
            "  other:\n    gpus: 1\n    run: [x]\n    each: [{file: t/a.py}]\nlayers:",
        );
        parse(&two).unwrap();
        let err = parse(&two.replace("name: glm4-slow", "name: other")).unwrap_err();
        assert!(
            err.contains("gives the batch name `other`, which batches.other (a test list"),
            "{err}"
        );
        let err = parse(&SUITE.replace(
            "tests/test_glm4.py, gpus: 8, timeout",
            "../etc/passwd, gpus: 8, timeout",
        ))
        .unwrap_err();
        assert!(
            err.contains("each.1.file: `../etc/passwd` is not a path relative"),
            "{err}"
        );
        let err = parse(&SUITE.replace(
            "gpus: 8, timeout: 1h",
            "gpus: null, timeout: 1h, colour: red",
        ))
        .unwrap_err();
        assert!(err.contains("each.1.colour: unknown key `colour`"), "{err}");
        let mut huge = SUITE.replace("      - {file: tests/test_qwen3_0.6B_fsdp.py}\n", "");
        let list: String = (0..MAX_BATCHES + 1)
            .map(|i| format!("      - {{file: t/{i}.py}}\n"))
            .collect();
        huge = huge.replace("    each:\n", &format!("    each:\n{list}"));
        let err = parse(&huge).unwrap_err();
        assert!(
            err.contains("a manifest holds at most 10000 batches"),
            "{err}"
        );
    }
}
