//! What a workflow is linted as: reached by its own triggers, or by those of a job that
//! calls it, with what that job passes (inputs holding untrusted values or the pull
//! request's head, secrets). Everything the facts of a workflow depend on besides its
//! own text.

use std::collections::BTreeMap;

use super::head::HeadRef;
use crate::workflow::lint::guard::{Reach, Trigger};

/// Who reaches a workflow: its own triggers, or those of the job that calls it.
pub(crate) struct Scope {
    /// The workflow's file, as findings name it.
    pub file: String,
    /// `None`: the workflow's own `on:`; else the untrusted triggers of the caller.
    pub triggers: Option<Vec<Trigger>>,
    /// What the caller's triggers say beyond their names; `None` with `triggers`.
    pub reach: Reach,
    /// Of those, the ones the calling job (or a job it needs) already keeps out.
    pub guarded: Vec<Trigger>,
    /// And the ones it lets in only when a trusted person asked.
    pub approved: Vec<Trigger>,
    /// The inputs the caller fills with untrusted values (lower-case name → why).
    pub tainted_inputs: BTreeMap<String, String>,
    /// The inputs the caller fills with the pull request's head (a ref, a sha).
    pub head_inputs: BTreeMap<String, HeadRef>,
    /// Whether the workflow has secrets: its own, or ones its caller passes.
    pub secrets_passed: bool,
    /// The files of the calls that led here, this one last (a workflow calling itself
    /// is refused by GitHub; we just stop).
    pub chain: Vec<String>,
}

impl Scope {
    /// A workflow linted on its own: reached by its own `on:`, with secrets of its own.
    pub fn own(file: &str) -> Scope {
        Scope {
            file: file.to_string(),
            triggers: None,
            reach: Reach::default(),
            guarded: Vec::new(),
            approved: Vec::new(),
            tainted_inputs: BTreeMap::new(),
            head_inputs: BTreeMap::new(),
            secrets_passed: true,
            chain: vec![file.to_string()],
        }
    }
}
