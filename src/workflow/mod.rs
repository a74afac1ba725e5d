//! CI workflows from the manifest: rendering templates ([`render`]) and refusing
//! workflows that run untrusted code on self-hosted runners ([`lint`]).

pub mod lint;
pub mod render;
