//! Buildkite pipelines rendered from `workflows.buildkite`: each is checked against
//! Buildkite's published schema ([`schema`]) and, where it is clear, linted
//! ([`lint`]: a GPU step a fork's build reaches with no block step).

mod cond;
pub mod lint;
pub mod schema;
