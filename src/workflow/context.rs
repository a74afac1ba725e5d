//! What a template sees: the manifest, with layers resolved to batch lists, each
//! layer's warm-up and the parts its budget asks for, and the `partitions` filter that
//! splits a list as `--partition K/N` does.

use indexmap::IndexMap;
use minijinja::Value as TemplateValue;
use serde_json::{Value, json};

use super::models::model_label;
use crate::manifest::{Batch, Layer, Manifest};

/// The model a batch's GPUs must be, when it has GPUs and names one.
fn gpu_model(b: &Batch) -> Option<&str> {
    b.gpu_model.as_deref().filter(|_| b.gpus > 0)
}

fn plain(v: Value) -> TemplateValue {
    TemplateValue::from(minijinja::value::Serde(&v))
}

fn map(pairs: Vec<(&str, TemplateValue)>) -> TemplateValue {
    TemplateValue::from_pairs(pairs)
}

/// A pipeline that follows the diff (`workflow render --print OUTPUT --base REV`): the
/// diff's ends and the change groups it changed, as `cibox changed` finds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub base: String,
    pub head: String,
    pub groups: Vec<String>,
}

/// Whether a batch runs by itself in a pipeline that follows the diff: with no
/// selection (a pipeline rendered without a diff), when it names no change group, or
/// when one of its groups changed.
fn selected(b: &Batch, selection: Option<&Selection>) -> bool {
    match selection {
        None => true,
        Some(s) => b.changes.is_empty() || b.changes.iter().any(|g| s.groups.contains(g)),
    }
}

/// One batch as a template sees it.
fn batch_value(name: &str, b: &Batch, selection: Option<&Selection>) -> TemplateValue {
    plain(json!({
        "name": name,
        "description": b.description,
        "gpus": b.gpus,
        "gpu_model": gpu_model(b),
        "gpu_model_label": gpu_model(b).map(model_label),
        "timeout": b.timeout.to_string(),
        "timeout_minutes": b.timeout.0.as_secs().div_ceil(60),
        "env": b.env,
        "fast_env": b.fast_env,
        "allow_empty": b.allow_empty,
        "tests": b.tests,
        "meta": b.meta,
        "image": b.image,
        "family": b.family,
        "test_file": b.env.get("CIBOX_TEST_FILE").filter(|_| b.family.is_some()),
        "nodes": b.nodes,
        "shards": b.shards,
        "est_time": b.est_time.map(|e| e.to_string()),
        "est_seconds": b.est_time.map(|e| e.0.as_secs_f64()),
        "retries": b.retries.count,
        "soft_fail": b.soft_fail,
        "working_dir": b.working_dir,
        "queue": b.queue,
        "manual": b.manual,
        "changes": b.changes,
        "selected": selected(b, selection),
    }))
}

/// The template context: the manifest, with layers resolved to batch lists. Each
/// batch's value is made once and shared by every list that holds it (`batches`, each
/// layer's and family's `batch_list`), so many layers of `all` cost a reference per
/// batch, not a copy.
#[cfg(test)]
pub fn context(m: &Manifest) -> TemplateValue {
    context_with(m, None)
}

/// The template context with a diff's selection: each batch's `selected`, and
/// `selection` (`{base, head, groups}`; none without a diff).
pub fn context_with(m: &Manifest, selection: Option<&Selection>) -> TemplateValue {
    let values: IndexMap<&str, TemplateValue> = m
        .batches
        .iter()
        .map(|(name, b)| (name.as_str(), batch_value(name, b, selection)))
        .collect();
    let batches: TemplateValue = values.values().cloned().collect();
    let layers = map(m
        .layers
        .iter()
        .map(|(name, l)| (name.as_str(), layer_value(m, &values, name, l)))
        .collect());
    // Each test list with its entries' batches, for a matrix of them.
    let families = map(m
        .families
        .iter()
        .map(|(name, entries)| {
            (
                name.as_str(),
                map(vec![
                    ("name", TemplateValue::from(name.as_str())),
                    ("batches", plain(json!(entries))),
                    ("batch_list", batch_list(&values, entries)),
                    // A list the project's code prints: its collector, and whether
                    // its entries are in (`workflow render --print`) or to be
                    // collected where it runs.
                    (
                        "collect",
                        plain(
                            m.collectors
                                .get(name)
                                .and_then(|c| serde_json::to_value(c).ok())
                                .unwrap_or(Value::Null),
                        ),
                    ),
                    (
                        "collected",
                        TemplateValue::from(
                            m.collectors.contains_key(name) && m.collected.is_some(),
                        ),
                    ),
                ]),
            )
        })
        .collect());
    map(vec![
        ("project", TemplateValue::from(m.project.as_str())),
        ("batches", batches),
        ("families", families),
        ("layers", layers),
        (
            "image",
            plain(serde_json::to_value(&m.image).unwrap_or(Value::Null)),
        ),
        (
            "images",
            plain(serde_json::to_value(&m.images).unwrap_or(Value::Null)),
        ),
        ("changed", plain(changed_value(m))),
        (
            "selection",
            plain(
                selection
                    .map(|s| json!({"base": s.base, "head": s.head, "groups": s.groups}))
                    .unwrap_or(Value::Null),
            ),
        ),
        (
            "cibox_version",
            TemplateValue::from(env!("CARGO_PKG_VERSION")),
        ),
    ])
}

/// The shared values of `names`, in order.
fn batch_list(values: &IndexMap<&str, TemplateValue>, names: &[String]) -> TemplateValue {
    names
        .iter()
        .filter_map(|n| values.get(n.as_str()).cloned())
        .collect()
}

/// `changed`, with its run template's timeout in whole minutes for `timeout-minutes`.
fn changed_value(m: &Manifest) -> Value {
    let mut changed = serde_json::to_value(&m.changed).unwrap_or(Value::Null);
    if let Some(run) = m.changed.as_ref().and_then(|c| c.run.as_ref())
        && let Some(obj) = changed.get_mut("run").and_then(Value::as_object_mut)
    {
        obj.insert(
            "timeout_minutes".into(),
            json!(run.timeout.0.as_secs().div_ceil(60)),
        );
    }
    changed
}

/// One layer: its batches (names and shared values), the most GPUs and minutes one of
/// them takes, its models and queues, its warm-up and the parts its budget asks for.
fn layer_value(
    m: &Manifest,
    values: &IndexMap<&str, TemplateValue>,
    name: &str,
    l: &Layer,
) -> TemplateValue {
    let members = || l.batches.iter().map(|b| &m.batches[b]);
    let max_gpus = members().map(|b| b.gpus).max().unwrap_or(0);
    let mut gpu_models: Vec<&str> = Vec::new();
    for glob in members().filter_map(gpu_model) {
        if !gpu_models.contains(&glob) {
            gpu_models.push(glob);
        }
    }
    let mut queues: Vec<&str> = Vec::new();
    for q in members().filter_map(|b| b.queue.as_deref()) {
        if !queues.contains(&q) {
            queues.push(q);
        }
    }
    let max_minutes = members()
        .map(|b| b.timeout.0.as_secs().div_ceil(60))
        .max()
        .unwrap_or(0);
    let warmup = l.shape.warmup.as_deref();
    map(vec![
        ("name", TemplateValue::from(name)),
        ("description", plain(json!(l.description))),
        ("fast", TemplateValue::from(l.fast)),
        ("fail_fast", TemplateValue::from(l.fail_fast)),
        ("batches", plain(json!(l.batches))),
        ("batch_list", batch_list(values, &l.batches)),
        ("max_gpus", TemplateValue::from(max_gpus)),
        ("gpu_models", plain(json!(gpu_models))),
        ("queues", plain(json!(queues))),
        ("max_timeout_minutes", TemplateValue::from(max_minutes)),
        ("meta", plain(l.meta.clone())),
        ("image", plain(json!(l.image))),
        (
            "warmup",
            warmup
                .and_then(|w| values.get(w).cloned())
                .unwrap_or(TemplateValue::from(())),
        ),
        (
            "budget_minutes",
            plain(json!(l.shape.budget.map(|b| b.0.as_secs().div_ceil(60)))),
        ),
        ("parts", TemplateValue::from(parts(m, l))),
    ])
}

/// How many parts a layer's budget asks for (1 without one): its batches' expected
/// times (unknown ones the mean of the known), over 3/4 of the budget less the
/// warm-up's, which each part pays once.
pub fn parts(m: &Manifest, l: &Layer) -> u32 {
    let Some(budget) = l.shape.budget else {
        return 1;
    };
    let expected = crate::timing::Expected::of(m, &l.batches, &Default::default());
    let work: f64 = expected.batches.iter().map(|e| e.time.as_secs_f64()).sum();
    let warmup = l
        .shape
        .warmup
        .as_ref()
        .and_then(|w| m.batches[w].est_time)
        .map_or(std::time::Duration::ZERO, |e| e.0);
    // A sharded batch's shards are units of the split: a part may hold one shard.
    let units: usize = l.batches.iter().map(|b| m.batches[b].shards as usize).sum();
    crate::manifest::parts_for_budget(work, budget.0, warmup, units).min(MAX_TEMPLATE_PARTS)
}

/// The most parts a template may split batches into.
const MAX_TEMPLATE_PARTS: u32 = 256;

/// `batch_list | partitions(N)`: the batches split into N parts as `--partition K/N`
/// splits them by their `est_time` (a run's `--timings` may move batches between
/// parts; the parts stay N): each part's `index`, `count`, `arg` (`K/N`), `batches`
/// (names) and expected `serial_seconds` and `work_seconds`, for a matrix of N jobs.
pub(super) fn partitions(
    list: TemplateValue,
    count: u32,
) -> Result<TemplateValue, minijinja::Error> {
    let bad = |why: String| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, why);
    if !(1..=MAX_TEMPLATE_PARTS).contains(&count) {
        return Err(bad(format!(
            "partitions({count}): give 1 to {MAX_TEMPLATE_PARTS} parts"
        )));
    }
    let mut items = Vec::new();
    for b in list.try_iter()? {
        let field = |k: &str| {
            b.get_attr(k)
                .ok()
                .filter(|v| !v.is_undefined() && !v.is_none())
        };
        let name = field("name")
            .and_then(|v| v.as_str().map(str::to_string))
            .ok_or_else(|| {
                bad("partitions: give it a list of batches (a layer's `batch_list`)".into())
            })?;
        let number = |k: &str| field(k).and_then(|v| f64::try_from(v).ok());
        let est = number("est_seconds")
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| {
                (
                    std::time::Duration::from_secs_f64(s),
                    crate::timing::Source::Estimated,
                )
            });
        let slots = crate::timing::slots(
            number("gpus").unwrap_or(0.0) as u32,
            number("nodes").unwrap_or(1.0) as u32,
        );
        // A sharded batch is its shards in the split, each its share of the time, as
        // a run splits it (`B[K/N]`, what the run's record calls each shard).
        let shards = number("shards").map_or(1, |n| n.clamp(1.0, 256.0) as u32);
        if shards == 1 {
            items.push((name, est, slots));
            continue;
        }
        for k in 1..=shards {
            let share = est.map(|(t, source)| (t / shards, source));
            items.push((
                crate::manifest::shard_unit(&name, k - 1, shards),
                share,
                slots,
            ));
        }
    }
    let expected = crate::timing::Expected::from_known(items);
    let parts: Vec<Value> = crate::timing::partition::split(&expected, count)
        .into_iter()
        .map(|p| {
            json!({
                "index": p.index,
                "count": count,
                "arg": format!("{}/{count}", p.index),
                "batches": p.batches,
                "serial_seconds": p.serial.as_secs_f64(),
                "work_seconds": p.work,
            })
        })
        .collect();
    Ok(TemplateValue::from(minijinja::value::Serde(&parts)))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn templates_get_each_batchs_gpu_model_and_a_runner_label_for_it() {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1m, run: [x], gpu_model: \"*H100*\"}\nbatches:\n  h: {gpus: 2}\n  a: {gpus: 1, gpu_model: \"NVIDIA A100*\"}\n  cpu: {gpus: 0}\nlayers:\n  gpu: {batches: all}\n";
        let m = Manifest::parse(text, Path::new("cibox.yaml")).unwrap();
        let ctx = context(&m);
        let value = |i: usize, key: &str| {
            ctx.get_attr("batches")
                .and_then(|b| b.get_item_by_index(i))
                .and_then(|b| b.get_attr(key))
                .unwrap()
        };
        let batch = |i: usize, key: &str| value(i, key).to_string();
        assert_eq!(batch(0, "gpu_model"), "*H100*");
        assert_eq!(batch(0, "gpu_model_label"), "h100");
        assert_eq!(batch(1, "gpu_model_label"), "nvidia-a100");
        // A CPU batch asks no model, whatever `defaults` says.
        assert!(value(2, "gpu_model").is_none());
        assert!(!value(1, "gpu_model").is_none());
        let models = ctx
            .get_attr("layers")
            .and_then(|l| l.get_attr("gpu"))
            .and_then(|l| l.get_attr("gpu_models"))
            .unwrap();
        assert_eq!(models.to_string(), "['*H100*', 'NVIDIA A100*']");
        assert_eq!(model_label("*RTX 5090*"), "rtx-5090");
        assert_eq!(model_label("?"), "");
    }

    #[test]
    fn layers_share_their_batches_values() {
        // 200 layers of `all` over 2,000 batches: each list holds the batches' values,
        // not copies of them.
        let mut text = String::from(
            "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1m, gpus: 0, run: [x], env: {E: \"some value\"}}\nbatches:\n",
        );
        for i in 0..2000 {
            text.push_str(&format!("  b{i}: {{}}\n"));
        }
        text.push_str("layers:\n");
        for i in 0..200 {
            text.push_str(&format!("  l{i}: {{batches: all}}\n"));
        }
        let m = Manifest::parse(&text, Path::new("cibox.yaml")).unwrap();
        let ctx = context(&m);
        let first = ctx
            .get_attr("batches")
            .and_then(|b| b.get_item_by_index(0))
            .unwrap();
        let in_layer = ctx
            .get_attr("layers")
            .and_then(|l| l.get_attr("l199"))
            .and_then(|l| l.get_attr("batch_list"))
            .and_then(|b| b.get_item_by_index(0))
            .unwrap();
        type Map = IndexMap<TemplateValue, TemplateValue>;
        let (a, b) = (
            first.downcast_object_ref::<Map>().unwrap(),
            in_layer.downcast_object_ref::<Map>().unwrap(),
        );
        assert!(std::ptr::eq(a, b), "a layer's batch is a copy");
        assert_eq!(
            in_layer
                .get_attr("env")
                .unwrap()
                .get_attr("E")
                .unwrap()
                .as_str(),
            Some("some value")
        );
    }
}
