//! Whether a rendered workflow runs each batch that asks for a GPU model on runners
//! labelled for that model: a job whose literal `runs-on` labels hold none of the
//! model's key (the first word with a digit of the model's label as templates get it:
//! `h100` of `*H100*`, `a100` of `NVIDIA A100*` → `nvidia-a100`; the whole label when no
//! word has a digit) while its steps run the batch
//! (`cibox batch run NAME…`, `cibox layer run L`) is a warning: it would wait on a host
//! without that model (exit 4 there), or take a runner meant for another.

use serde_json::Value;

use crate::manifest::Manifest;

/// The warnings for workflow `file` (its rendered `text`), one line each.
pub fn label_warnings(m: &Manifest, file: &str, text: &str) -> Vec<String> {
    let Ok(Some(tree)) = crate::yaml::parse(text) else {
        return Vec::new();
    };
    let Value::Object(jobs) = tree.to_json().get("jobs").cloned().unwrap_or(Value::Null) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (id, job) in &jobs {
        // Only labels written out: a group, an expression or a matrix value is not read.
        let labels: Option<Vec<String>> = match job.get("runs-on") {
            Some(Value::String(l)) => Some(vec![l.clone()]),
            Some(Value::Array(ls)) => ls.iter().map(|l| l.as_str().map(str::to_string)).collect(),
            _ => None,
        };
        let Some(labels) = labels.filter(|ls| !ls.iter().any(|l| l.contains("${{"))) else {
            continue;
        };
        let lower: Vec<String> = labels.iter().map(|l| l.to_ascii_lowercase()).collect();
        let runs = job
            .get("steps")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| s.get("run").and_then(Value::as_str));
        let mut batches: Vec<&str> = Vec::new();
        for script in runs {
            for name in batches_run(m, script) {
                if !batches.contains(&name) {
                    batches.push(name);
                }
            }
        }
        for name in batches {
            let b = &m.batches[name];
            let Some(glob) = b.gpu_model.as_deref().filter(|_| b.gpus > 0) else {
                continue;
            };
            let key = model_key(glob);
            if key.is_empty() || lower.iter().any(|l| l.contains(&key)) {
                continue;
            }
            out.push(format!(
                "{file}: job {id} runs batch {name}, which asks for GPU model `{}`, on runners labelled {}: none names `{key}`",
                crate::util::escape(glob),
                crate::util::escape(&labels.join(", "))
            ));
        }
    }
    out
}

/// A model glob as a runner label: its wildcards dropped, lower case, each run of
/// anything but letters, digits, `.` and `_` one `-` (`*H100*` → `h100`, `NVIDIA A100*`
/// → `nvidia-a100`).
pub fn model_label(glob: &str) -> String {
    let mut out = String::new();
    for c in glob.chars().filter(|c| !matches!(c, '*' | '?')) {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_') {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// The key a runner label (or a Buildkite queue) must hold for a GPU model glob: the
/// first word with a digit of its label (`h100` of `*H100*`), else the whole label.
pub fn model_key(glob: &str) -> String {
    let label = model_label(glob);
    label
        .split('-')
        .find(|w| w.bytes().any(|b| b.is_ascii_digit()))
        .unwrap_or(&label)
        .to_string()
}

/// The manifest's batches a script runs by name: the words after `cibox batch run`
/// (up to an option or a shell operator) and the batches of a `cibox layer run`'s layer.
pub fn batches_run<'m>(m: &'m Manifest, script: &str) -> Vec<&'m str> {
    let words: Vec<&str> = script.split_whitespace().collect();
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if !(w.ends_with("cibox") && words.get(i + 2) == Some(&"run")) {
            continue;
        }
        let args = words[i + 3..]
            .iter()
            .take_while(|a| !a.starts_with('-') && !matches!(**a, "&&" | "||" | ";" | "|" | "\\"));
        match words[i + 1] {
            "batch" => {
                for a in args {
                    if let Some((name, _)) = m.batches.get_key_value(*a) {
                        out.push(name.as_str());
                    }
                }
            }
            "layer" => {
                if let Some(layer) = args.into_iter().next().and_then(|l| m.layers.get(*l)) {
                    out.extend(layer.batches.iter().map(String::as_str));
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const MANIFEST: &str = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1m, run: [x]}\nbatches:\n  h: {gpus: 2, gpu_model: \"*H100*\"}\n  a: {gpus: 1, gpu_model: \"NVIDIA A100*\"}\n  any: {gpus: 1}\nlayers:\n  gpu: {batches: [h, a]}\n";

    fn warnings(workflow: &str) -> Vec<String> {
        let m = Manifest::parse(MANIFEST, Path::new("cibox.yaml")).unwrap();
        label_warnings(&m, "gpu.yml", workflow)
    }

    #[test]
    fn a_batch_of_a_model_on_runners_not_labelled_for_it_is_a_warning() {
        let w = warnings(
            "on: push\njobs:\n  t:\n    runs-on: [self-hosted, a100]\n    steps:\n      - run: cibox batch run h any --wait 1h\n      - run: ./cibox batch run a\n",
        );
        assert_eq!(
            w,
            [
                "gpu.yml: job t runs batch h, which asks for GPU model `*H100*`, on runners labelled self-hosted, a100: none names `h100`"
            ]
        );
        // A label that holds the model's, in any case, agrees; a layer is its batches.
        assert!(
            warnings("on: push\njobs:\n  t:\n    runs-on: [self-hosted, 8-GPU-H100]\n    steps:\n      - run: cibox batch run h\n")
                .is_empty()
        );
        let w = warnings(
            "on: push\njobs:\n  t:\n    runs-on: [self-hosted, 8-gpu-h100]\n    steps:\n      - run: cibox layer run gpu && echo done\n",
        );
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("batch a, which asks for GPU model `NVIDIA A100*`"),
            "{w:?}"
        );
        assert!(w[0].contains("none names `a100`"), "{w:?}");
        // Labels from an expression, or a batch without a model, are not judged.
        assert!(
            warnings("on: push\njobs:\n  t:\n    runs-on: ${{ matrix.runner }}\n    steps:\n      - run: cibox batch run h\n")
                .is_empty()
        );
        assert!(
            warnings("on: push\njobs:\n  t:\n    runs-on: [self-hosted]\n    steps:\n      - run: cibox batch run any\n")
                .is_empty()
        );
    }
}
