//! What a finding is about: its rule (a name, a one-line summary, a severity and a
//! description for SARIF's rule help) and how serious it is.

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// What a finding is about; the name is printed after each finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// The file is not a workflow we can read.
    Unparsable,
    /// A self-hosted job that an outsider's event starts without a guard.
    UntrustedSelfHosted,
    /// The pull request's code checked out where the base repository's token and secrets
    /// are.
    PrHeadCheckout,
    /// Text an outsider controls inlined into a script, or run as code.
    ScriptInjection,
    /// Text an outsider controls written to `$GITHUB_ENV` or `$GITHUB_PATH`.
    EnvFileInjection,
    /// Write permissions on a job an outsider can drive.
    WritePermissions,
    /// Secrets in a `pull_request_target` job an outsider can start.
    SecretsExposed,
    /// An artifact of a pull request's run trusted on a self-hosted runner.
    UntrustedArtifact,
    /// A self-hosted job without `timeout-minutes`.
    NoTimeout,
    /// A reusable workflow lint cannot read (another repository), called where
    /// outsiders can reach it.
    UncheckedCall,
    /// A job's container or service image, or a `docker://` step, not pinned by digest.
    UnpinnedImage,
}

impl Rule {
    /// Every rule, in the order SARIF lists them.
    pub const ALL: [Rule; 11] = [
        Rule::Unparsable,
        Rule::UntrustedSelfHosted,
        Rule::PrHeadCheckout,
        Rule::ScriptInjection,
        Rule::EnvFileInjection,
        Rule::WritePermissions,
        Rule::SecretsExposed,
        Rule::UntrustedArtifact,
        Rule::NoTimeout,
        Rule::UncheckedCall,
        Rule::UnpinnedImage,
    ];

    /// One line on what the rule finds.
    pub fn summary(self) -> &'static str {
        match self {
            Rule::Unparsable => "Not a workflow lint can read",
            Rule::UntrustedSelfHosted => "A self-hosted runner that outsiders' events reach",
            Rule::PrHeadCheckout => {
                "The pull request's code checked out where the base repository's token and secrets are"
            }
            Rule::ScriptInjection => {
                "Text an outsider controls pasted into a script, or run as code"
            }
            Rule::EnvFileInjection => {
                "Text an outsider controls written to $GITHUB_ENV or $GITHUB_PATH"
            }
            Rule::WritePermissions => "Write permissions on a job that outsiders drive",
            Rule::SecretsExposed => "Secrets in a pull_request_target job that any fork can start",
            Rule::UntrustedArtifact => {
                "A fork's artifact downloaded where running it costs something"
            }
            Rule::NoTimeout => "A self-hosted job without timeout-minutes",
            Rule::UncheckedCall => "A reusable workflow or local action that lint cannot check",
            Rule::UnpinnedImage => "A container image not pinned by digest",
        }
    }

    /// What the rule finds, why it matters and what to do, for SARIF's rule help.
    pub fn description(self) -> &'static str {
        match self {
            Rule::Unparsable => {
                "The file is not a workflow lint can read: not a plain file, a symbolic link found in a folder, larger than 1 MiB, not UTF-8, not YAML, or not a GitHub Actions workflow. Nothing in it was checked."
            }
            Rule::UntrustedSelfHosted => {
                "A job on a self-hosted runner (any label that is not a GitHub-hosted one, a runner group, an expression) that an event outsiders can cause (a fork's pull request, a comment, an issue, a run of another workflow, a star, a status) starts without a guard. Guard it with the same-repository check, the commenter's association, or for outsiders' pull requests the approved-commit pattern (pull_request_target on labeled only, a label check, a checkout of github.event.pull_request.head.sha)."
            }
            Rule::PrHeadCheckout => {
                "A step fetches or checks out the pull request's code (its head or merge ref, its sha, its branch, refs/pull/N/..., gh pr checkout) under a trigger that runs with the base repository's token and secrets, without a guard; or after an approval that does not vouch for what it fetches: a member's comment names no commit, and a label approves the event's head sha, not a branch that moves."
            }
            Rule::ScriptInjection => {
                "An expression whose value an outsider writes (a title, a body, a branch name, a commit message, a step or job output, a computed matrix value, an input filled from those, an env variable set from them or through $GITHUB_ENV) is pasted into a run: script or github-script, where it becomes code; or such text is run from a file or a variable. Pass values through env: and quote them as data."
            }
            Rule::EnvFileInjection => {
                "A step writes text an outsider controls to $GITHUB_ENV (a newline in it sets any variable for every later step, and BASH_ENV, LD_PRELOAD or NODE_OPTIONS run code) or to $GITHUB_PATH (later commands come from a folder it names). Give each step that needs the value its own env: instead."
            }
            Rule::WritePermissions => {
                "A job that outsiders drive under a privileged trigger (a self-hosted one, or one that runs the pull request's code) has a token with write permissions. Give it contents: read and move writes to a job that runs no outside code."
            }
            Rule::SecretsExposed => {
                "A pull_request_target job that any fork's pull request starts without a guard reads secrets (other than GITHUB_TOKEN), or passes them to a reusable workflow."
            }
            Rule::UntrustedArtifact => {
                "Under workflow_run, a step downloads what the triggering run uploaded (a fork's pull request made that run) on a self-hosted runner, or into a job holding secrets or a token that writes code, workflows or packages. Handle such files as data, in a job without secrets or write permissions."
            }
            Rule::NoTimeout => {
                "A self-hosted job without timeout-minutes: a hung job holds the runner and its GPUs for GitHub's default of six hours."
            }
            Rule::UncheckedCall => {
                "A reusable workflow in another repository (or missing, broken, or deeper than GitHub allows), or a local action whose action.yml lint cannot read, used by a job outsiders can start. Lint it where it lives, or guard the job."
            }
            Rule::UnpinnedImage => {
                "A job's container or service image, or a docker:// step, named by tag: whoever controls the tag controls what runs. Name it by digest (IMAGE@sha256:...)."
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Rule::Unparsable => "unparsable",
            Rule::UntrustedSelfHosted => "untrusted-self-hosted",
            Rule::PrHeadCheckout => "pr-head-checkout",
            Rule::ScriptInjection => "script-injection",
            Rule::EnvFileInjection => "env-file-injection",
            Rule::WritePermissions => "write-permissions",
            Rule::SecretsExposed => "secrets-exposed",
            Rule::UntrustedArtifact => "untrusted-artifact",
            Rule::NoTimeout => "no-timeout",
            Rule::UncheckedCall => "unchecked-call",
            Rule::UnpinnedImage => "unpinned-image",
        }
    }

    pub fn severity(self) -> Severity {
        match self {
            Rule::NoTimeout | Rule::UncheckedCall | Rule::UnpinnedImage => Severity::Warning,
            _ => Severity::Error,
        }
    }
}
