//! The documents stay true: every relative link of the README, the guide, the reference
//! and the history resolves (the file, and the heading an anchor names); the reference
//! names every command `cibox --help` lists and no command that is not; and every
//! manifest key cibox knows is named in the reference, and every key the manifest
//! page's tables name is one cibox knows.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files the docs test reads: the README and everything under docs/.
fn documents() -> Vec<PathBuf> {
    let mut out = vec![repo().join("README.md")];
    let mut dirs = vec![repo().join("docs")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// GitHub's anchor of a heading.
fn anchor(title: &str) -> String {
    title
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .collect::<String>()
        .replace(' ', "-")
}

/// The text outside code fences.
fn prose(text: &str) -> String {
    let mut fence = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if !fence {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn every_relative_link_of_the_documents_resolves() {
    let link = regex::Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let mut broken = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for c in link.captures_iter(&prose(&text)) {
            let target = &c[1];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            let shown = doc.strip_prefix(repo()).unwrap().display().to_string();
            if !path.exists() {
                broken.push(format!("{shown}: {target}: no such file"));
                continue;
            }
            if !frag.is_empty() && path.extension().is_some_and(|x| x == "md") {
                let there = std::fs::read_to_string(&path).unwrap();
                if !anchors(&there).contains(frag) {
                    broken.push(format!("{shown}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Every command `cibox --help` lists, with its subcommands: `image build`, `doctor`.
fn commands(prefix: &[&str]) -> Vec<String> {
    let r = run(cibox(repo()).args(prefix).arg("--help"));
    r.ok();
    let mut out = Vec::new();
    let mut listing = false;
    for line in r.stdout.lines() {
        if line == "Commands:" {
            listing = true;
            continue;
        }
        if listing {
            if line.is_empty() || !line.starts_with("  ") {
                break;
            }
            let Some(name) = line.split_whitespace().next() else {
                continue;
            };
            if name == "help" || line.starts_with("   ") {
                continue;
            }
            let mut path: Vec<&str> = prefix.to_vec();
            path.push(name);
            let sub = commands(&path);
            if sub.is_empty() {
                out.push(path.join(" "));
            } else {
                out.extend(sub);
            }
        }
    }
    out
}

fn reference_text() -> String {
    let mut all = String::new();
    for e in std::fs::read_dir(repo().join("docs/reference"))
        .unwrap()
        .flatten()
    {
        if e.path().extension().is_some_and(|x| x == "md") {
            all.push_str(&std::fs::read_to_string(e.path()).unwrap());
        }
    }
    all
}

#[test]
fn the_reference_names_every_command_there_is_and_no_other() {
    let reference = reference_text();
    let commands = commands(&[]);
    assert!(commands.contains(&"gpu fake".to_string()), "{commands:?}");
    let missing: Vec<&String> = commands
        .iter()
        .filter(|c| !reference.contains(&format!("`cibox {c}")))
        .collect();
    assert!(
        missing.is_empty(),
        "commands the reference does not name (as `cibox …`): {missing:?}"
    );
    // The reverse: each `cibox WORD [WORD]` the reference's command table names exists.
    let table = std::fs::read_to_string(repo().join("docs/reference/commands.md")).unwrap();
    let named = regex::Regex::new(r"(?m)^\| `cibox ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?").unwrap();
    let mut unknown = Vec::new();
    for c in named.captures_iter(&table) {
        let one = c[1].to_string();
        let two = c.get(2).map(|m| format!("{one} {}", m.as_str()));
        let known = commands
            .iter()
            .any(|k| Some(k) == two.as_ref() || *k == one || k.starts_with(&format!("{one} ")));
        if !known {
            unknown.push(c[0].to_string());
        }
    }
    assert!(
        unknown.is_empty(),
        "the reference names commands cibox lacks: {unknown:?}"
    );
}

/// The keys cibox knows at `path` of a manifest (`[]`: the top level), as its error
/// for an unknown key lists them.
fn known_keys(manifest: &str) -> Vec<String> {
    let p = Project::new(manifest);
    let r = p.cibox(&["batch", "list"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let list = r
        .stderr
        .split_once("known keys: ")
        .unwrap_or_else(|| panic!("no key list: {}", r.stderr))
        .1;
    list.lines()
        .next()
        .unwrap()
        .split(", ")
        .map(|k| k.trim().trim_matches('`').to_string())
        .collect()
}

#[test]
fn the_reference_names_every_manifest_key_there_is() {
    const BASE: &str = "version: 1\nproject: p\nimage: {locks: [cibox.yaml]}\nbatches:\n  b: {gpus: 0, timeout: 1m, run: [x]}\n";
    let sections: [(&str, String); 9] = [
        ("top level", format!("{BASE}zzqqxx: 1\n")),
        ("a batch", BASE.replace("run: [x]}", "run: [x], zzqqxx: 1}")),
        (
            "image",
            BASE.replace("locks: [cibox.yaml]}", "locks: [cibox.yaml], zzqqxx: 1}"),
        ),
        ("container", format!("{BASE}container: {{zzqqxx: 1}}\n")),
        ("gpu", format!("{BASE}gpu: {{zzqqxx: 1}}\n")),
        ("changed", format!("{BASE}changed: {{zzqqxx: 1}}\n")),
        ("a layer", format!("{BASE}layers: {{l: {{zzqqxx: 1}}}}\n")),
        ("workflows", format!("{BASE}workflows: {{zzqqxx: 1}}\n")),
        ("source", format!("{BASE}source: {{zzqqxx: 1}}\n")),
    ];
    let reference = reference_text();
    let manifest_page = std::fs::read_to_string(repo().join("docs/reference/manifest.md")).unwrap();
    let mut missing = Vec::new();
    for (what, text) in &sections {
        for key in known_keys(text) {
            let named = [format!("`{key}"), format!(".{key}`"), format!("{key}:")];
            if !named.iter().any(|n| reference.contains(n.as_str())) {
                missing.push(format!("{what}: {key}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "manifest keys the reference does not name: {missing:?}"
    );
    // The reverse: the first column of the tables of keys names keys cibox knows
    // (`batches.<name>.K`, `image.K`, `images.<name>.K`, `container.K`, `gpu.K`,
    // `changed.K`, `layers.<name>.K`, `workflows.K`, `source.K` to the key; other
    // sections to their name).
    let known = |i: usize| known_keys(&sections[i].1);
    let (top, batch, image, container) = (known(0), known(1), known(2), known(3));
    let (gpu, changed, layer, workflows, source) =
        (known(4), known(5), known(6), known(7), known(8));
    let row = regex::Regex::new(r"(?m)^\| `([a-z_.<>]+)`").unwrap();
    let mut unknown = Vec::new();
    for c in row.captures_iter(&manifest_page) {
        let parts: Vec<&str> = c[1].split('.').filter(|p| *p != "<name>").collect();
        let ok = match parts.as_slice() {
            ["batches", k, ..] => batch.iter().any(|b| b == k),
            ["image" | "images", k, ..] => image.iter().any(|b| b == k),
            ["container", k, ..] => container.iter().any(|b| b == k),
            ["gpu", k, ..] => gpu.iter().any(|b| b == k),
            ["changed", k, ..] => changed.iter().any(|b| b == k),
            ["layers", k, ..] => layer.iter().any(|b| b == k),
            ["workflows", k, ..] => workflows.iter().any(|b| b == k),
            ["source", k, ..] => source.iter().any(|b| b == k),
            [first, ..] => top.iter().any(|b| b == first),
            [] => true,
        };
        if !ok {
            unknown.push(c[1].to_string());
        }
    }
    assert!(
        unknown.is_empty(),
        "the reference's key tables name keys cibox lacks: {unknown:?}"
    );
}

/// The README's test command is the one `.ci/run` runs, exactly.
#[test]
fn ci_runs_exactly_the_readmes_test_command() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let block = readme
        .split_once("## The two commands")
        .and_then(|(_, r)| r.split_once("```sh\n"))
        .and_then(|(_, r)| r.split_once("\n```"))
        .expect("the README's two commands")
        .0;
    let commands: Vec<&str> = block
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        commands,
        [
            "bash examples/demo/run-demo.sh",
            "cargo nextest run --no-fail-fast"
        ]
    );
    let ci = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
    let last = ci.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
    assert_eq!(last, commands[1], ".ci/run's last command");
}

/// The README's example manifest is one cibox reads.
#[test]
fn the_readmes_example_manifest_is_valid() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let yaml = readme
        .split_once("```yaml\n")
        .and_then(|(_, r)| r.split_once("\n```"))
        .expect("the README's example manifest")
        .0;
    let p = Project::new(yaml);
    p.write(".cibox/images/default.Dockerfile", "FROM scratch\n");
    p.write("requirements.lock", "torch==2.9\n");
    let r = p.cibox(&["--json", "batch", "list"]);
    let v: serde_json::Value = serde_json::from_str(&r.ok().stdout).unwrap();
    assert_eq!(v["batches"].as_array().unwrap().len(), 2, "{v}");
}
