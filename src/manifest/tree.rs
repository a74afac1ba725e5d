//! The passes over the positioned YAML tree before serde reads it: [`prepare`] drops
//! `x-*` keys and lays `defaults:` and the top-level `container:` under each batch (and
//! under `changed.run`), with [`overlay`] merging mappings key by key, then takes the
//! keys set to `null` out ([`drop_nulls`]); [`require_maps`] refuses a list or a value
//! where a mapping belongs ([`MAPPINGS`]).

use crate::yaml::{self, Mark, Node};

use super::changed::CHANGED_RUN_DEFAULTS;
use super::check::Checker;
use super::error::ManifestError;

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
    &["batches", "*", "collect"],
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
        if node.is_null() {
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
/// replaces `a`. A key `b` sets to `null` (`memlock: null`, `mounts: null`, or just
/// `key:`) stays `null` in the result, whatever `a` had there: the marker goes through
/// every layer laid under it (the defaults, then the top-level `container`), and
/// [`drop_nulls`] takes it out once all are laid. Entries from `a` keep their
/// positions, so an error in a default points at the default.
fn overlay(a: &Node, b: Node) -> Node {
    match (&a.value, b.value) {
        (yaml::NodeValue::Map(base), yaml::NodeValue::Map(over)) => {
            let mut entries: Vec<(Node, Node)> = Vec::new();
            for (k, v) in over {
                let key = k.scalar_text().unwrap_or_default().to_string();
                let merged = match base.iter().find(|(bk, _)| bk.scalar_text() == Some(&key)) {
                    Some((_, bv)) if !v.is_null() => overlay(bv, v),
                    _ => v,
                };
                entries.push((k, merged));
            }
            for (k, v) in base {
                let key = k.scalar_text().unwrap_or_default();
                if !entries
                    .iter()
                    .any(|(have, _)| have.scalar_text() == Some(key))
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

/// The mappings whose keys name definitions (a batch, a layer, an image, a cache, a
/// change group): `name:` with nothing under it defines nothing and stays, for serde to
/// refuse as the wrong type.
const DEFINITIONS: &[&[&str]] = &[
    &["batches"],
    &["layers"],
    &["images"],
    &["caches"],
    &["changed", "groups"],
];

/// Once every layer is laid: a key set to `null` is taken out of its mapping, so that
/// it removes what a lower layer put there and, where nothing was, is as if not written
/// (a required key so removed is then named as missing). Lists are left alone (a null
/// in a list is a value, for the checks to name), and so are a test list's entries,
/// which lie over their family later (`each`).
fn drop_nulls(node: &mut Node, at: &mut Vec<String>) {
    let yaml::NodeValue::Map(entries) = &mut node.value else {
        return;
    };
    let definitions = DEFINITIONS
        .iter()
        .any(|d| d.len() == at.len() && d.iter().zip(at.iter()).all(|(p, s)| p == s));
    if !definitions {
        entries.retain(|(_, v)| !v.is_null());
    }
    for (k, v) in entries.iter_mut() {
        at.push(k.scalar_text().unwrap_or_default().to_string());
        drop_nulls(v, at);
        at.pop();
    }
}

/// Before the manifest is read: top-level `x-*` keys are dropped (a place for anchors,
/// the compose convention), `defaults:` is laid under every batch, and the top-level
/// `container:` under each batch's own `container:` (a batch overrides any key); then
/// the keys set to `null` are taken out, each having removed what was under it.
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
                // every batch overrides them; first, so that a key wrong there is
                // named at `defaults`, not at the first batch it was laid under.
                kept.insert(0, (k, v.clone()));
                defaults = Some(v);
            }
            _ => kept.push((k, v)),
        }
    }
    let container = kept
        .iter()
        .find(|(k, _)| k.scalar_text() == Some("container"))
        .map(|(_, v)| v.clone());
    // Before anything is laid in: what laying it in would come to.
    expanded_weight(&kept, defaults.as_ref(), container.as_ref())?;
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
    let mut root = Node {
        value: yaml::NodeValue::Map(kept),
        mark,
    };
    drop_nulls(&mut root, &mut Vec::new());
    Ok(root)
}

/// The most values a manifest may hold once `defaults`, the top-level `container` and
/// test lists are laid into its batches (and its layers name the batches they stand
/// for): each batch is a copy of what is laid into it, so a large default under many
/// batches, or a large family under many entries, would otherwise multiply.
pub(super) const MAX_EXPANDED_VALUES: usize = 1_000_000;
/// The most text (bytes) it may hold then.
pub(super) const MAX_EXPANDED_BYTES: usize = 64 << 20;

/// A size as the bounds' messages say it.
pub(super) fn shown_bytes(bytes: usize) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
    }
}

/// What one batch (or test list) comes to once laid out: where it is, its key path,
/// its values and bytes, and its entries when it is a test list.
struct Share {
    mark: Mark,
    name: String,
    weight: (usize, usize),
    entries: Option<usize>,
}

/// Refuses a manifest whose batches would come to more than [`MAX_EXPANDED_VALUES`] or
/// [`MAX_EXPANDED_BYTES`] once `defaults` and the top-level `container` are laid under
/// each batch (and `changed.run`) and a test list's family under each entry: counted
/// from the tree as written, before anything is copied. Each batch is counted as all
/// of its own keys, the defaults and the container (what laying them in can come to at
/// most); a test list as that many times its entries, plus the entries. The error
/// points at the batch that comes to the most.
fn expanded_weight(
    top: &[(Node, Node)],
    defaults: Option<&Node>,
    container: Option<&Node>,
) -> Result<(), (Mark, String)> {
    let add =
        |a: (usize, usize), b: (usize, usize)| (a.0.saturating_add(b.0), a.1.saturating_add(b.1));
    let times = |a: (usize, usize), n: usize| (a.0.saturating_mul(n), a.1.saturating_mul(n));
    let weight = |n: Option<&Node>| n.map_or((0, 0), Node::weight);
    let laid = add(weight(defaults), weight(container));
    // The document as written, each batch once more below with what is laid into it.
    let mut total = top
        .iter()
        .fold((1, 0), |w, (k, v)| add(w, add(k.weight(), v.weight())));
    // The batch that comes to the most.
    let mut largest: Option<Share> = None;
    let mut count = |mark: Mark, name: String, w: (usize, usize), entries: Option<usize>| {
        total = add(total, w);
        if largest
            .as_ref()
            .is_none_or(|l| w.1 > l.weight.1 || (w.1 == l.weight.1 && w.0 > l.weight.0))
        {
            largest = Some(Share {
                mark,
                name,
                weight: w,
                entries,
            });
        }
    };
    for (k, v) in top {
        match k.scalar_text() {
            Some("batches") => {
                let yaml::NodeValue::Map(batches) = &v.value else {
                    continue;
                };
                for (name, batch) in batches {
                    let own = batch.weight();
                    let name_text = format!("batches.{}", name.scalar_text().unwrap_or_default());
                    let each = batch.get("each").and_then(|e| match &e.value {
                        yaml::NodeValue::Seq(items) => Some((e.weight(), items.len())),
                        _ => None,
                    });
                    match each {
                        Some((each_w, n)) if n > 0 => {
                            // Each entry: the family without its list, with the defaults
                            // and container laid in; its own keys (and the variables
                            // and `meta` naming its file) once more.
                            let family = (own.0 - each_w.0, own.1 - each_w.1);
                            let w = add(times(add(family, laid), n), times(each_w, 3));
                            count(name.mark, name_text, w, Some(n));
                        }
                        _ => count(name.mark, name_text, add(own, laid), None),
                    }
                }
            }
            Some("changed") => {
                if let Some(run) = v.get("run") {
                    count(k.mark, "changed.run".into(), add(run.weight(), laid), None);
                }
            }
            _ => {}
        }
    }
    if total.0 <= MAX_EXPANDED_VALUES && total.1 <= MAX_EXPANDED_BYTES {
        return Ok(());
    }
    let Some(Share {
        mark,
        name,
        weight: w,
        entries,
    }) = largest
    else {
        return Ok(());
    };
    let this = match entries {
        Some(n) => format!(
            "this test list {}: its {n} entries each a copy of the family",
            shown_bytes(w.1)
        ),
        None => format!("this batch {}", shown_bytes(w.1)),
    };
    Err((
        mark,
        format!(
            "{name}: laid into its batches, the manifest comes to {} of text and {} values ({this}); a manifest may come to at most {} MiB and {MAX_EXPANDED_VALUES} values once `defaults`, the top-level `container` and test lists are laid in: keep large values out of what many batches share (a test can read them from a file of the source)",
            shown_bytes(total.1),
            total.0,
            MAX_EXPANDED_BYTES >> 20,
        ),
    ))
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
        lay_container(top, own);
    }
    *batch = b;
}

/// The top-level `container` laid under `own`; `container: null` removes it (the
/// batch's container is then the locked-down default).
fn lay_container(top: &Node, own: &mut Node) {
    if own.is_null() {
        *own = Node {
            value: yaml::NodeValue::Map(Vec::new()),
            mark: own.mark,
        };
        return;
    }
    let mine = take(own);
    *own = overlay(top, mine);
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
            Some((_, own)) => lay_container(top, own),
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
    fn a_key_wrong_under_defaults_is_named_there_wherever_defaults_stands() {
        // `defaults:` after `batches:`: the key is still named at `defaults`, not at
        // the first batch it was laid under.
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\nbatches:\n  b: {gpus: 0, timeout: 1m, run: [x]}\ndefaults: {zzqq: 1}\n";
        let err = parse(text).unwrap_err();
        assert!(
            err.contains(":6:") && err.contains("defaults.zzqq: unknown key `zzqq`"),
            "{err}"
        );
        assert!(!err.contains("batches.b"), "{err}");
    }

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
    fn null_removes_what_every_lower_layer_put_there() {
        // The batch's null removes the defaults' value and the top-level one under it.
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ncontainer: {env: {NCCL_DEBUG: top, KEEP: top}, ulimits: {memlock: unlimited}}\ndefaults:\n  timeout: 1h\n  container: {env: {NCCL_DEBUG: default}, ulimits: {memlock: 1024}}\nbatches:\n  plain: {gpus: 0, run: [x]}\n  cleared:\n    gpus: 0\n    run: [x]\n    container: {env: {NCCL_DEBUG: null}, ulimits: {memlock: null}}\nchanged:\n  patterns: [t]\n  run: {command: x, container: {env: {NCCL_DEBUG: ~}, ulimits: {memlock: ~}}}\n";
        let m = parse(text).unwrap();
        let plain = &m.batches["plain"].container;
        assert_eq!(plain.env["NCCL_DEBUG"], "default");
        assert_eq!(
            plain.ulimits["memlock"],
            Ulimit {
                soft: 1024,
                hard: 1024
            }
        );
        let cleared = &m.batches["cleared"].container;
        assert_eq!(cleared.env.keys().collect::<Vec<_>>(), ["KEEP"]);
        assert!(cleared.ulimits.is_empty(), "{:?}", cleared.ulimits);
        let run = m.changed.unwrap().run.unwrap();
        assert_eq!(run.container.env.keys().collect::<Vec<_>>(), ["KEEP"]);
        assert!(run.container.ulimits.is_empty());
        // A null in the defaults removes the top-level value for every batch that does
        // not set its own; a batch's `container: null` drops the inherited container.
        let text = text
            .replace("env: {NCCL_DEBUG: default}", "env: {NCCL_DEBUG: null}")
            .replace(
                "    container: {env: {NCCL_DEBUG: null}, ulimits: {memlock: null}}\n",
                "    container: null\n",
            );
        let m = parse(&text).unwrap();
        assert_eq!(
            m.batches["plain"].container.env.keys().collect::<Vec<_>>(),
            ["KEEP"]
        );
        let cleared = &m.batches["cleared"].container;
        assert!(cleared.env.is_empty() && cleared.ulimits.is_empty());
    }

    #[test]
    fn a_null_that_removes_nothing_is_as_if_not_written() {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ncontainer: {cpus: null, env: {A: null}}\ndefaults: {timeout: 1h, env: {B: ~}}\nbatches:\n  b:\n    gpus: 0\n    run: [x]\n    env: {C: null}\n    preflight: null\n    install: null\n    image: null\n    each: null\n    meta: {label: null}\n    container: {ulimits: {memlock: null}}\n";
        let m = parse(text).unwrap();
        let b = &m.batches["b"];
        assert!(b.env.is_empty() && b.preflight.is_empty() && b.install.is_none());
        assert!(m.families.is_empty());
        assert_eq!(b.meta, serde_json::json!({}));
        assert!(b.container.env.is_empty() && b.container.ulimits.is_empty());
        // A definition left empty is still refused: it defines nothing.
        let err = parse(&format!("{text}layers:\n  l:\n")).unwrap_err();
        assert!(err.contains("layers.l: wrong type: got null"), "{err}");
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

    #[test]
    fn what_defaults_and_test_lists_lay_into_batches_is_bounded() {
        // A test list of 3,000 entries under a default of `size` bytes, or 10,000 batches.
        let family = |size: usize| {
            let entries: String = (0..3000)
                .map(|i| format!("      - {{file: tests/t{i}.py}}\n"))
                .collect();
            format!(
                "version: 1\nproject: p\nimage: {{locks: [x]}}\ndefaults:\n  timeout: 1m\n  env: {{BIG: \"{}\"}}\nbatches:\n  unit: {{gpus: 0, run: [x]}}\n  fam:\n    gpus: 0\n    run: [x]\n    each:\n{entries}",
                "x".repeat(size)
            )
        };
        let m = parse(&family(4 << 10)).unwrap();
        assert_eq!(m.batches.len(), 3001);
        let e = parse(&family(32 << 10)).unwrap_err();
        assert!(
            e.starts_with(
                "cibox.yaml:9:3: batches.fam: laid into its batches, the manifest comes to 94."
            ),
            "{e}"
        );
        assert!(
            e.contains("(this test list 94.0 MiB: its 3000 entries each a copy of the family); a manifest may come to at most 64 MiB and 1000000 values"),
            "{e}"
        );
        // Plain batches, each with the defaults and the top-level container laid in.
        let batches = |size: usize| {
            let mut t = format!(
                "version: 1\nproject: p\nimage: {{locks: [x]}}\ncontainer: {{env: {{C: \"{}\"}}}}\ndefaults: {{timeout: 1m, gpus: 0, run: [x]}}\nbatches:\n",
                "y".repeat(size)
            );
            for i in 0..10_000 {
                t.push_str(&format!("  b{i}: {{}}\n"));
            }
            t
        };
        assert_eq!(parse(&batches(1 << 10)).unwrap().batches.len(), 10_000);
        let e = parse(&batches(16 << 10)).unwrap_err();
        assert!(
            e.starts_with(
                "cibox.yaml:7:3: batches.b0: laid into its batches, the manifest comes to 156."
            ),
            "{e}"
        );
        // Values count as well as text: many small defaults under many batches.
        let mut many = String::from(
            "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults:\n  timeout: 1m\n  gpus: 0\n  run: [x]\n  meta:\n",
        );
        for i in 0..200 {
            many.push_str(&format!("    k{i}: {i}\n"));
        }
        many.push_str("batches:\n");
        for i in 0..5000 {
            many.push_str(&format!("  b{i}: {{}}\n"));
        }
        let e = parse(&many).unwrap_err();
        assert!(e.contains("MiB of text and 20"), "{e}");
    }
}
