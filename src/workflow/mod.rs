//! CI workflows from the manifest: rendering templates ([`render`]) and refusing
//! workflows that let outsiders onto self-hosted runners ([`lint`]).

pub mod lint;
pub mod render;
