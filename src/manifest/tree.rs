//! The passes over the positioned YAML tree before serde reads it: [`prepare`] drops
//! `x-*` keys and lays `defaults:` and the top-level `container:` under each batch (and
//! under `changed.run`), with [`overlay`] merging mappings key by key; [`require_maps`]
//! refuses a list or a value where a mapping belongs ([`MAPPINGS`]).

use crate::yaml::{self, Mark, Node};

use super::ManifestError;
use super::changed::CHANGED_RUN_DEFAULTS;
use super::check::Checker;

/// The places that hold a mapping, `*` for any key. serde would fill a struct from a
/// list by position (`container: [0.5, 256m, …, host]` would set the network without
/// naming it): a mapping must be written as one.
const MAPPINGS: &[&[&str]] = &[
    &[],
    &["image"],
    &["images"],
    &["images", "*"],
    &["source"],
    &["container"],
    &["container", "env"],
    &["container", "ulimits"],
    &["gpu"],
    &["gpu", "idle"],
    &["batches"],
    &["batches", "*"],
    &["batches", "*", "env"],
    &["batches", "*", "fast_env"],
    &["batches", "*", "container"],
    &["batches", "*", "container", "env"],
    &["batches", "*", "container", "ulimits"],
    &["batches", "*", "meta"],
    &["batches", "*", "each", "*"],
    &["layers", "*", "meta"],
    &["layers"],
    &["layers", "*"],
    &["changed"],
    &["changed", "run"],
    &["changed", "groups"],
    &["changed", "groups", "*"],
    &["changed", "run", "env"],
    &["changed", "run", "container"],
    &["workflows"],
];

/// Refuses a list or a value where [`MAPPINGS`] says a mapping belongs.
pub(super) fn require_maps(
    node: &Node,
    check: &Checker<'_>,
    at: &[String],
) -> Result<(), ManifestError> {
    let expected = |path: &[String]| {
        MAPPINGS.iter().any(|m| {
            m.len() == path.len() && m.iter().zip(path).all(|(p, seg)| *p == "*" || p == seg)
        })
    };
    if !expected(at) {
        return Ok(());
    }
    let yaml::NodeValue::Map(entries) = &node.value else {
        // `key:` with nothing after it is null, which serde takes as "not given".
        if matches!(&node.value, yaml::NodeValue::Scalar { text, plain: true } if text.is_empty() || text == "~" || text == "null")
        {
            return Ok(());
        }
        let what = if at.is_empty() {
            "the manifest".to_string()
        } else {
            format!("`{}`", at.join("."))
        };
        return Err(check.at(
            at,
            format!("{what} must be a mapping (`key: value` lines), not a list or a single value"),
        ));
    };
    for (k, v) in entries {
        let mut path = at.to_vec();
        path.push(k.scalar_text().unwrap_or_default().to_string());
        require_maps(v, check, &path)?;
    }
    Ok(())
}

/// `b` laid over `a`: mappings merge key by key (recursively), anything else in `b`
/// replaces `a`, and a key `b` sets to `null` (`memlock: null`, `mounts: null`, or just
/// `key:`) removes what `a` has there (a null with nothing under it stays, for the
/// checks to name). Entries from `a` keep their positions, so an
/// error in a default points at the default.
fn overlay(a: &Node, b: Node) -> Node {
    match (&a.value, b.value) {
        (yaml::NodeValue::Map(base), yaml::NodeValue::Map(over)) => {
            let mut entries: Vec<(Node, Node)> = Vec::new();
            let mut removed: Vec<String> = Vec::new();
            for (k, v) in over {
                let key = k.scalar_text().unwrap_or_default().to_string();
                let inherited = base.iter().any(|(bk, _)| bk.scalar_text() == Some(&key));
                if is_null(&v) && inherited {
                    removed.push(key);
                    continue;
                }
                let merged = match base.iter().find(|(bk, _)| bk.scalar_text() == Some(&key)) {
                    Some((_, bv)) => overlay(bv, v),
                    None => v,
                };
                entries.push((k, merged));
            }
            for (k, v) in base {
                let key = k.scalar_text().unwrap_or_default();
                if !entries
                    .iter()
                    .any(|(have, _)| have.scalar_text() == Some(key))
                    && !removed.iter().any(|r| r == key)
                {
                    entries.push((k.clone(), v.clone()));
                }
            }
            Node {
                value: yaml::NodeValue::Map(entries),
                mark: b.mark,
            }
        }
        (_, value) => Node {
            value,
            mark: b.mark,
        },
    }
}

/// A plain `null`, `~` or nothing: YAML's null.
fn is_null(node: &Node) -> bool {
    matches!(&node.value, yaml::NodeValue::Scalar { text, plain: true } if text.is_empty() || text == "~" || text == "null")
}

/// Before the manifest is read: top-level `x-*` keys are dropped (a place for anchors,
/// the compose convention), `defaults:` is laid under every batch, and the top-level
/// `container:` under each batch's own `container:` (a batch overrides any key).
pub(super) fn prepare(root: Node) -> Result<Node, (Mark, String)> {
    let Node { value, mark } = root;
    let yaml::NodeValue::Map(entries) = value else {
        return Ok(Node { value, mark });
    };
    let mut defaults: Option<Node> = None;
    let mut kept = Vec::new();
    for (k, v) in entries {
        match k.scalar_text() {
            Some(name) if name.starts_with("x-") => {}
            Some("defaults") => {
                if !matches!(v.value, yaml::NodeValue::Map(_)) {
                    return Err((
                        v.mark,
                        "defaults: must be a mapping of batch keys (`timeout: 1h`, `allow_empty: true`, …)".into(),
                    ));
                }
                // Kept as well, so that its own values are read (typed) even where
                // every batch overrides them.
                kept.push((k, v.clone()));
                defaults = Some(v);
            }
            _ => kept.push((k, v)),
        }
    }
    let container = kept
        .iter()
        .find(|(k, _)| k.scalar_text() == Some("container"))
        .map(|(_, v)| v.clone());
    for (k, v) in &mut kept {
        if k.scalar_text() != Some("batches") {
            continue;
        }
        let yaml::NodeValue::Map(batches) = &mut v.value else {
            continue;
        };
        for (_, batch) in batches.iter_mut() {
            lay_under_batch(batch, defaults.as_ref(), container.as_ref());
        }
    }
    // `changed.run` is a batch template: the defaults that fit it, and the container.
    for (k, v) in &mut kept {
        if k.scalar_text() != Some("changed") {
            continue;
        }
        let yaml::NodeValue::Map(fields) = &mut v.value else {
            continue;
        };
        let Some((_, run)) = fields
            .iter_mut()
            .find(|(k, _)| k.scalar_text() == Some("run"))
        else {
            continue;
        };
        lay_under_changed_run(run, defaults.as_ref(), container.as_ref());
    }
    Ok(Node {
        value: yaml::NodeValue::Map(kept),
        mark,
    })
}

/// Takes `node` out of its place, leaving an empty list (at the same position) there.
fn take(node: &mut Node) -> Node {
    std::mem::replace(
        node,
        Node {
            value: yaml::NodeValue::Seq(Vec::new()),
            mark: node.mark,
        },
    )
}

/// `defaults` laid under one batch, and the top-level `container` under the batch's
/// own `container` (a batch without one gets the top-level one when it is read).
fn lay_under_batch(batch: &mut Node, defaults: Option<&Node>, container: Option<&Node>) {
    if !matches!(batch.value, yaml::NodeValue::Map(_)) {
        return;
    }
    let mut b = take(batch);
    if let Some(d) = defaults {
        b = overlay(d, b);
    }
    if let Some(top) = container
        && let yaml::NodeValue::Map(fields) = &mut b.value
        && let Some((_, own)) = fields
            .iter_mut()
            .find(|(k, _)| k.scalar_text() == Some("container"))
    {
        let mine = take(own);
        *own = overlay(top, mine);
    }
    *batch = b;
}

/// The `defaults` that fit a template ([`CHANGED_RUN_DEFAULTS`]) laid under
/// `changed.run`, and the top-level `container` under its own (or as its own).
fn lay_under_changed_run(run: &mut Node, defaults: Option<&Node>, container: Option<&Node>) {
    if !matches!(run.value, yaml::NodeValue::Map(_)) {
        return;
    }
    let mut r = take(run);
    if let Some(Node {
        value: yaml::NodeValue::Map(d),
        mark,
    }) = defaults
    {
        let fitting = Node {
            value: yaml::NodeValue::Map(
                d.iter()
                    .filter(|(k, _)| {
                        k.scalar_text()
                            .is_some_and(|k| CHANGED_RUN_DEFAULTS.contains(&k))
                    })
                    .cloned()
                    .collect(),
            ),
            mark: *mark,
        };
        r = overlay(&fitting, r);
    }
    if let Some(top) = container
        && let yaml::NodeValue::Map(fields) = &mut r.value
    {
        match fields
            .iter_mut()
            .find(|(k, _)| k.scalar_text() == Some("container"))
        {
            Some((_, own)) => {
                let mine = take(own);
                *own = overlay(top, mine);
            }
            None => fields.push((
                Node {
                    value: yaml::NodeValue::Scalar {
                        text: "container".into(),
                        plain: true,
                    },
                    mark: top.mark,
                },
                top.clone(),
            )),
        }
    }
    *run = r;
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::{REAL, assert_refused, parse};
    use crate::manifest::{ContainerUser, Ipc, Network, Ulimit};

    #[test]
    fn a_manifest_for_real_gpu_tests() {
        let m = parse(REAL).unwrap();
        let e2e = &m.batches["e2e"];
        assert_eq!(e2e.timeout.to_string(), "2h");
        assert!(e2e.allow_empty);
        assert_eq!(e2e.env["SHARED"], "1");
        assert_eq!(e2e.env["OWN"], "2");
        // Mappings merge key by key: the batch's meta and env keep the defaults'.
        assert_eq!(
            e2e.meta,
            serde_json::json!({"label": "run-ci-e2e", "runner": "gpu-8x"})
        );
        let c = &e2e.container;
        assert_eq!(c.ipc, Ipc::Host);
        assert_eq!(c.network, Network::Bridge);
        assert_eq!(c.cap_add, ["SYS_NICE", "IPC_LOCK"]);
        assert_eq!(c.ulimits["memlock"], Ulimit { soft: -1, hard: -1 });
        assert_eq!(
            c.ulimits["nofile"],
            Ulimit {
                soft: 1024,
                hard: 65536
            }
        );
        assert_eq!(c.user, ContainerUser::Root);
        assert_eq!(c.env["A"], "top");
        assert_eq!(c.env["B"], "mine");
        let mounts: Vec<(String, &str)> = c
            .mounts
            .iter()
            .map(|m| (m.source.display().to_string(), m.target.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                ("/data/models".to_string(), "/models"),
                ("/data/datasets".to_string(), "/data/datasets")
            ]
        );
        // The other batch overrides the user and drops the mounts; the rest is the top's.
        let cpu = &m.batches["cpu"].container;
        assert_eq!(cpu.user, ContainerUser::Invoker);
        assert!(cpu.mounts.is_empty());
        assert_eq!(cpu.ipc, Ipc::Private);
        assert_eq!(m.batches["cpu"].timeout.to_string(), "10m");
        assert_eq!(m.layers["gpu"].meta["deps"][0], "flash-attn");
        assert_eq!(e2e.container.ipc, Ipc::Host);
        assert_eq!(e2e.container.network, Network::Bridge);
        assert_eq!(cpu.network, Network::None);
    }

    #[test]
    fn null_removes_an_inherited_value_at_every_level() {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ncontainer: {env: {A: top, B: top}, mounts: [\"/data/m:/m\"]}\ndefaults:\n  timeout: 1h\n  env: {K: v}\n  container: {ulimits: {memlock: unlimited, stack: 8388608}}\nbatches:\n  gpu: {gpus: 1, run: [x]}\n  cpu:\n    gpus: 0\n    run: [x]\n    env: {K: null}\n    container: {ulimits: {memlock: null}, mounts: null, env: {B: null}}\n";
        let m = parse(text).unwrap();
        let gpu = &m.batches["gpu"];
        assert_eq!(gpu.container.ulimits.len(), 2);
        assert_eq!(gpu.container.mounts.len(), 1);
        let cpu = &m.batches["cpu"];
        assert_eq!(cpu.container.ulimits.keys().collect::<Vec<_>>(), ["stack"]);
        assert!(cpu.container.mounts.is_empty());
        assert!(!cpu.env.contains_key("K") && gpu.env["K"] == "v");
        assert_eq!(cpu.container.env.keys().collect::<Vec<_>>(), ["A"]);
        // A value that is required stays required: removing it is named.
        let err = parse(&text.replace("env: {K: null}", "timeout: null")).unwrap_err();
        assert!(
            err.contains("batches.cpu: missing required key `timeout`"),
            "{err}"
        );
    }

    #[test]
    fn tree_passes_refuse_bad_input_with_a_position() {
        assert_refused(
            REAL,
            &[
                (
                    "      <<: *nccl",
                    "      <<: 3",
                    "cibox.yaml:25:11: YAML syntax: a merge key (`<<`) takes a mapping or a list of mappings",
                ),
                (
                    "meta: {label: run-ci-e2e}",
                    "meta: [a]",
                    "batches.e2e.meta: `batches.e2e.meta` must be a mapping",
                ),
                (
                    "defaults:\n  timeout: 2h",
                    "defaults:\n  timout: 2h",
                    "unknown key `timout`; did you mean `timeout`?",
                ),
                (
                    "defaults:\n  timeout: 2h",
                    "defaults:\n  timeout: 2h\n  gpus: many",
                    "cibox.yaml:15:9: defaults.gpus: wrong type",
                ),
            ],
        );
    }
}
