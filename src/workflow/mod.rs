//! CI workflows from the manifest: what a template sees ([`context`]), rendering
//! templates ([`render`], its failures in [`error`]), each in a process of its own with
//! bounded memory ([`confined`]), whether the jobs they render run batches of a GPU
//! model on runners labelled for it ([`models`]), refusing workflows that let outsiders
//! onto self-hosted runners ([`lint`]), and Buildkite pipelines: Buildkite's schema and
//! what is clear to lint ([`buildkite`]).

pub mod buildkite;
pub mod confined;
pub mod context;
pub mod error;
pub mod lint;
pub mod models;
pub mod render;
