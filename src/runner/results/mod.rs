//! What a batch leaves in the reports folder: its folder, made fresh
//! ([`batch_dir`]); what is safe of its `/reports`, copied out ([`copy`]); its test
//! cases, from JUnit ([`junit`]) or from its steps ([`steps`]); which phase of its
//! script failed ([`phases`]); and its run record,
//! `result.json` ([`record`]).

pub mod batch_dir;
pub mod copy;
pub mod junit;
pub mod phases;
pub mod record;
pub mod steps;
