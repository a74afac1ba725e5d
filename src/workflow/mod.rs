//! CI workflows from the manifest: rendering templates ([`render`]), whether the jobs
//! they render run batches of a GPU model on runners labelled for it ([`models`]), and
//! refusing workflows that let outsiders onto self-hosted runners ([`lint`]).

pub mod lint;
pub mod models;
pub mod render;
