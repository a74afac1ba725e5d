//! A batch's `outputs` (what it hands to later layers: patterns of files in its
//! container) and `needs` (the batches of earlier layers whose outputs it gets at
//! `/artifacts/<batch>`, read-only); see [`crate::artifact`].

use indexmap::IndexMap;

use crate::artifact::OutputSpec;
use crate::util::did_you_mean;

use super::check::Checker;
use super::error::ManifestError;
use super::types::{Batch, Layer};

/// The most `outputs` patterns, or `needs`, of one batch.
const MAX_LIST: usize = 100;

/// A batch's `outputs`: each a path relative to the source (`/work`) or absolute in its
/// container, its last name possibly a glob (see [`OutputSpec::parse`]).
pub(super) fn outputs(
    check: &Checker<'_>,
    batch: &str,
    raw: Vec<String>,
) -> Result<Vec<String>, ManifestError> {
    if raw.len() > MAX_LIST {
        return Err(check.at(
            &["batches", batch, "outputs"],
            format!("lists more than {MAX_LIST} patterns"),
        ));
    }
    for (i, p) in raw.iter().enumerate() {
        OutputSpec::parse(p)
            .map_err(|why| check.at(&["batches", batch, "outputs", &i.to_string()], why))?;
    }
    Ok(raw)
}

/// Each batch's `needs`: defined batches with `outputs`, each once, not itself, and in
/// a layer before every layer the batch is in (a layer's batches run together, so one
/// of them cannot wait for another's outputs).
pub(super) fn check_needs(
    check: &Checker<'_>,
    batches: &IndexMap<String, Batch>,
    layers: &IndexMap<String, Layer>,
) -> Result<(), ManifestError> {
    let known: Vec<String> = batches.keys().cloned().collect();
    let in_layer = |l: &Layer, b: &str| {
        l.batches.iter().any(|x| x == b) || l.shape.warmup.as_deref() == Some(b)
    };
    for (name, b) in batches {
        // An entry of a test list has its family's keys, where they are written.
        let at_batch = b.family.as_deref().unwrap_or(name);
        if b.shards > 1 && !b.outputs.is_empty() {
            return Err(check.at(
                &["batches", at_batch, "outputs"],
                "a sharded batch has no outputs: each shard would write the one artifact of its batch; build it in a batch of one shard",
            ));
        }
        if b.needs.is_empty() {
            continue;
        }
        if b.needs.len() > MAX_LIST {
            return Err(check.at(
                &["batches", at_batch, "needs"],
                format!("lists more than {MAX_LIST} batches"),
            ));
        }
        for (i, need) in b.needs.iter().enumerate() {
            let at = ["batches", at_batch, "needs", &i.to_string()];
            let Some(producer) = batches.get(need) else {
                let hint = did_you_mean(need, &known)
                    .map(|s| format!("; did you mean `{s}`?"))
                    .unwrap_or_default();
                return Err(check.at(&at, format!("batch `{need}` is not defined{hint}")));
            };
            if need == name {
                return Err(check.at(&at, "a batch cannot need its own outputs"));
            }
            if b.needs[..i].contains(need) {
                return Err(check.at(&at, format!("batch `{need}` is listed twice")));
            }
            if producer.outputs.is_empty() {
                return Err(check.at(
                    &at,
                    format!(
                        "batch `{need}` declares no `outputs`: add `outputs: [PATTERN, …]` to it"
                    ),
                ));
            }
            for (i_layer, (lname, l)) in layers.iter().enumerate() {
                if !in_layer(l, name) {
                    continue;
                }
                if in_layer(l, need) {
                    return Err(check.at(
                        &at,
                        format!("batch `{need}` is in layer `{lname}` too, which runs them together: its outputs exist only once its layer ran; put it in an earlier layer"),
                    ));
                }
                let earlier = layers
                    .values()
                    .take(i_layer)
                    .any(|before| in_layer(before, need));
                if !earlier {
                    let its: Vec<&str> = layers
                        .iter()
                        .filter(|(_, x)| in_layer(x, need))
                        .map(|(n, _)| n.as_str())
                        .collect();
                    let where_ = if its.is_empty() {
                        "in no layer".to_string()
                    } else {
                        format!("only in layer {} after it", its.join(", "))
                    };
                    return Err(check.at(
                        &at,
                        format!("batch `{need}` is in no layer before layer `{lname}` (it is {where_}): a batch's outputs reach only later layers"),
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::parse;

    const TEXT: &str = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1h, gpus: 0}\nbatches:\n  wheel: {run: [make], outputs: [\"dist/*.whl\"]}\n  test:\n    run: [t]\n    needs: [wheel]\nlayers:\n  build: {batches: [wheel]}\n  tests: {batches: [test]}\n";

    #[test]
    fn outputs_and_needs_are_read() {
        let m = parse(TEXT).unwrap();
        assert_eq!(m.batches["wheel"].outputs, ["dist/*.whl"]);
        assert_eq!(m.batches["test"].needs, ["wheel"]);
    }

    #[test]
    fn a_sharded_batch_has_no_outputs() {
        let text = TEXT.replace(
            "outputs: [\"dist/*.whl\"]}",
            "outputs: [\"dist/*.whl\"], shards: 2}",
        );
        let err = parse(&text).unwrap_err();
        assert!(
            err.contains("batches.wheel.outputs: a sharded batch has no outputs"),
            "{err}"
        );
    }

    #[test]
    fn a_need_must_be_an_earlier_layers_producer() {
        for (from, to, said) in [
            (
                "needs: [wheel]",
                "needs: [wheell]",
                "cibox.yaml:9:13: batches.test.needs.0: batch `wheell` is not defined; did you mean `wheel`?",
            ),
            (
                "build: {batches: [wheel]}\n  tests: {batches: [test]}",
                "tests: {batches: [test]}\n  build: {batches: [wheel]}",
                "batches.test.needs.0: batch `wheel` is in no layer before layer `tests` (it is only in layer build after it)",
            ),
            (
                "tests: {batches: [test]}",
                "tests: {batches: [test, wheel]}",
                "batches.test.needs.0: batch `wheel` is in layer `tests` too",
            ),
            (
                ", outputs: [\"dist/*.whl\"]",
                "",
                "batches.test.needs.0: batch `wheel` declares no `outputs`",
            ),
            (
                "needs: [wheel]",
                "needs: [test]",
                "batches.test.needs.0: a batch cannot need its own outputs",
            ),
            (
                "\"dist/*.whl\"",
                "\"../x\"",
                "cibox.yaml:6:34: batches.wheel.outputs.0: `../x`: holds `..`",
            ),
        ] {
            let text = TEXT.replace(from, to);
            assert_ne!(text, TEXT, "{from}");
            let err = parse(&text).unwrap_err();
            assert!(err.contains(said), "{from} → {to}: {err}");
        }
    }
}
