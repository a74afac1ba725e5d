//! What a finding is about: its rule, and how serious it is.
//!
//! What users see of a rule (its id, severity, summary and help) is written where the
//! rule is: an audit's in its own file, with [`super::audit::audit_meta!`]; the loader's
//! here ([`Rule::Unparsable`]). The rules are listed once, in
//! [`super::audit::registry`].

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// What users see of a rule.
#[derive(Debug)]
pub(crate) struct RuleMeta {
    /// Its name, kebab-case: printed after each finding (`[no-timeout]`), the `rule` of
    /// `--format json`, SARIF's rule id.
    pub id: &'static str,
    /// The severity of its findings, and SARIF's default level for it.
    pub severity: Severity,
    /// One line on what it finds (SARIF's short description).
    pub summary: &'static str,
    /// What it finds, why it matters and what to do (SARIF's full description and help).
    pub help: &'static str,
}

/// The rule a finding is about. Two rules are the same when their ids are.
#[derive(Clone, Copy)]
pub struct Rule(&'static RuleMeta);

impl Rule {
    /// The loader's rule: the file is not a workflow lint can read. Not an audit: it is
    /// found before there is a workflow to audit, so its meta is here rather than in a
    /// file of its own.
    // Named like the enum variant it was: callers outside lint compare with it.
    #[allow(non_upper_case_globals)]
    pub const Unparsable: Rule = Rule(&RuleMeta {
        id: "unparsable",
        severity: Severity::Error,
        summary: "Not a workflow lint can read",
        help: "The file is not a workflow lint can read: not a plain file, a symbolic link found in a folder, larger than 1 MiB, not UTF-8, not YAML, or not a GitHub Actions workflow. Nothing in it was checked.",
    });

    pub(crate) const fn new(meta: &'static RuleMeta) -> Rule {
        Rule(meta)
    }

    /// Its name, kebab-case: printed after each finding, its `rule` in JSON, its SARIF id.
    pub fn id(self) -> &'static str {
        self.0.id
    }

    pub fn severity(self) -> Severity {
        self.0.severity
    }

    /// One line on what the rule finds.
    pub fn summary(self) -> &'static str {
        self.0.summary
    }

    /// What the rule finds, why it matters and what to do, for SARIF's rule help.
    pub fn help(self) -> &'static str {
        self.0.help
    }
}

impl PartialEq for Rule {
    fn eq(&self, other: &Rule) -> bool {
        self.id() == other.id()
    }
}

impl Eq for Rule {}

impl std::hash::Hash for Rule {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id().hash(state);
    }
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

/// A rule serializes as its id (`--format json`).
impl serde::Serialize for Rule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.id())
    }
}
