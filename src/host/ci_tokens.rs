//! Credentials that CI agents and runners put in a job's environment, which a host
//! might grant in `pass_env` by mistake: never passed into a batch, whatever a policy
//! says (with GitHub's and the engine's, in [`super::policy`]'s list). A name ending
//! in `*` is a prefix.

/// The agents' and runners' own tokens, by CI.
pub const CI_AGENT_TOKENS: &[&str] = &[
    // Buildkite: the job's agent session token (what `buildkite-agent artifact`,
    // `meta-data` and `pipeline upload` use), the agent's registration token, and the
    // job API's token and socket.
    "BUILDKITE_AGENT_ACCESS_TOKEN",
    "BUILDKITE_AGENT_TOKEN",
    "BUILDKITE_AGENT_JOB_API_TOKEN",
    "BUILDKITE_AGENT_JOB_API_SOCKET",
    // GitLab: the job token, its ID tokens of old, and what holds the job token again
    // (the registry's and dependency proxy's passwords, the clone URL).
    "CI_JOB_TOKEN",
    "CI_JOB_JWT*",
    "CI_REGISTRY_PASSWORD",
    "CI_DEPENDENCY_PROXY_PASSWORD",
    "CI_DEPLOY_PASSWORD",
    "CI_REPOSITORY_URL",
    // Woodpecker and Drone: the clone credentials.
    "CI_NETRC_PASSWORD",
    "DRONE_NETRC_PASSWORD",
    // Azure Pipelines: the job's access token.
    "SYSTEM_ACCESSTOKEN",
    // CircleCI and Bitbucket Pipelines: the job's OIDC tokens.
    "CIRCLE_OIDC_TOKEN*",
    "BITBUCKET_STEP_OIDC_TOKEN",
];
