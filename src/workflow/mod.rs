//! CI workflows from the manifest: rendering templates ([`render`]), whether the jobs
//! they render run batches of a GPU model on runners labelled for it ([`models`]),
//! refusing workflows that let outsiders onto self-hosted runners ([`lint`]), and
//! Buildkite pipelines: Buildkite's schema and what is clear to lint ([`buildkite`]).

pub mod buildkite;
pub mod lint;
pub mod models;
pub mod render;
