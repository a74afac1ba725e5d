//! `workflow lint --format sarif`: findings as SARIF 2.1.0, the format GitHub code
//! scanning uploads (`github/codeql-action/upload-sarif`). The models are `serde-sarif`'s,
//! generated from the OASIS schema, so every field is the one the standard names.
//!
//! One run, tool `cibox`, every rule described in `tool.driver.rules` (id, short and full
//! description, default level; in the registry's order, [`registry::rules`]); one result
//! per finding with its rule, level, message and physical location (file, line, column;
//! columns count characters). Files are named relative to `root` (the repository the
//! workflows are in) where they are inside it, as code scanning expects, else by
//! absolute `file://` URI.

use std::path::Path;

use serde_sarif::sarif::{
    ArtifactLocation, Location, Message, MultiformatMessageString, PhysicalLocation, Region,
    ReportingConfiguration, ReportingDescriptor, Result as SarifResult, ResultLevel, Run, Sarif,
    Tool, ToolComponent,
};

use super::audit::registry;
use super::finding::Finding;
use super::rule::{Rule, Severity};

const SCHEMA: &str = "https://json.schemastore.org/sarif-2.1.0.json";

fn level(s: Severity) -> &'static str {
    match s {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}

fn text(t: &str) -> MultiformatMessageString {
    MultiformatMessageString::builder().text(t).build()
}

fn descriptor(rule: Rule) -> ReportingDescriptor {
    ReportingDescriptor::builder()
        .id(rule.id())
        .name(rule.id())
        .short_description(text(rule.summary()))
        .full_description(text(rule.help()))
        .help(text(rule.help()))
        .default_configuration(
            ReportingConfiguration::builder()
                .level(serde_json::Value::from(level(rule.severity())))
                .build(),
        )
        .build()
}

/// The URI a finding's file has in the log: relative to `root` with `/`, where it is
/// inside it; else absolute.
fn uri(file: &str, root: Option<&Path>) -> String {
    let path = Path::new(file);
    let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if let Some(rel) = root.and_then(|r| absolute.strip_prefix(r).ok()) {
        return rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
    }
    if absolute.is_absolute() {
        format!("file://{}", absolute.display())
    } else {
        file.to_string()
    }
}

fn result(f: &Finding, root: Option<&Path>) -> SarifResult {
    let region = Region::builder()
        .start_line(f.line as i64)
        .start_column(f.col as i64)
        .build();
    let location = PhysicalLocation::builder()
        .artifact_location(ArtifactLocation::builder().uri(uri(&f.file, root)).build())
        .region(region)
        .build();
    SarifResult::builder()
        .rule_id(f.rule.id())
        .level(match f.severity {
            Severity::Error => ResultLevel::Error,
            Severity::Warning => ResultLevel::Warning,
        })
        .message(Message::builder().text(f.what()).build())
        .locations(vec![
            Location::builder().physical_location(location).build(),
        ])
        .build()
}

/// The SARIF log of these findings.
pub fn log(findings: &[Finding], root: Option<&Path>) -> Sarif {
    let driver = ToolComponent::builder()
        .name("cibox")
        .version(env!("CARGO_PKG_VERSION"))
        .semantic_version(env!("CARGO_PKG_VERSION"))
        .rules(registry::rules().map(descriptor).collect::<Vec<_>>())
        .build();
    let run = Run::builder()
        .tool(Tool::builder().driver(driver).build())
        .column_kind(serde_json::Value::from("unicodeCodePoints"))
        .results(findings.iter().map(|f| result(f, root)).collect::<Vec<_>>())
        .build();
    Sarif::builder()
        .schema(SCHEMA)
        .version(serde_json::Value::from("2.1.0"))
        .runs(vec![run])
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::lint::lint_source;

    #[test]
    fn rules_results_levels_and_locations() {
        let text = "on: pull_request\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    steps: [{run: make}]\n";
        let findings = lint_source("wf/gpu.yml", text, &|_| None);
        let log = serde_json::to_value(log(&findings, None)).unwrap();
        assert_eq!(log["version"], "2.1.0");
        let run = &log["runs"][0];
        assert_eq!(run["tool"]["driver"]["name"], "cibox");
        let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), registry::rules().count());
        let rule = rules
            .iter()
            .find(|r| r["id"] == "untrusted-self-hosted")
            .unwrap();
        assert!(rule["shortDescription"]["text"].as_str().unwrap().len() > 10);
        assert!(rule["fullDescription"]["text"].as_str().unwrap().len() > 40);
        assert_eq!(rule["defaultConfiguration"]["level"], "error");
        let warning = rules.iter().find(|r| r["id"] == "no-timeout").unwrap();
        assert_eq!(warning["defaultConfiguration"]["level"], "warning");
        let results = run["results"].as_array().unwrap();
        assert_eq!(results.len(), 2, "{results:#?}");
        let r = results
            .iter()
            .find(|r| r["ruleId"] == "untrusted-self-hosted")
            .unwrap();
        assert_eq!(r["level"], "error");
        let loc = &r["locations"][0]["physicalLocation"];
        assert_eq!(loc["artifactLocation"]["uri"], "wf/gpu.yml");
        assert_eq!(loc["region"]["startLine"], 4);
        assert_eq!(loc["region"]["startColumn"], 14);
        assert!(
            r["message"]["text"]
                .as_str()
                .unwrap()
                .starts_with("job gpu: runs on a self-hosted runner")
        );
        let w = results
            .iter()
            .find(|r| r["ruleId"] == "no-timeout")
            .unwrap();
        assert_eq!(w["level"], "warning");
    }

    #[test]
    fn files_inside_the_root_are_relative() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join(".github/workflows")).unwrap();
        let file = root.join(".github/workflows/a.yml");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(
            uri(&file.display().to_string(), Some(&root)),
            ".github/workflows/a.yml"
        );
        let elsewhere = tempfile::tempdir().unwrap();
        let other = std::fs::canonicalize(elsewhere.path())
            .unwrap()
            .join("b.yml");
        std::fs::write(&other, "x").unwrap();
        assert_eq!(
            uri(&other.display().to_string(), Some(&root)),
            format!("file://{}", other.display())
        );
    }
}
