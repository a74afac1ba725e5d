//! `cibox init`: a start for a project: a commented `cibox.yaml` from what is found in
//! it (lock files, test files by the GPUs they declare: [`crate::starter`]), an image
//! recipe stub, and workflow templates for the patterns the README recommends (CPU on
//! every pull request, GPU on the approved-commit pattern, a scheduled cache warm-up),
//! which render and lint clean; the reports folders added to `.gitignore`.
//! It never overwrites a file: what exists is left as it is, and said. It writes nothing
//! through a link: a folder it writes into that is one (a checkout's committed `.github`
//! leading outside it) is refused before anything is written, and what it writes is made
//! name by name in folders held open, never following one ([`crate::nofollow`]).

//! The writing is [`crate::starter::write`]'s.

use std::path::PathBuf;

use super::context::Context;
use crate::error::Result;
use crate::exit;
use crate::starter::write::{self, InitError};

pub fn init(_ctx: &Context) -> Result<u8> {
    let cwd = std::env::current_dir().map_err(InitError::CurrentFolder)?;
    let root = crate::git::text(&cwd, &["rev-parse", "--show-toplevel"])
        .ok()
        .map(PathBuf::from)
        .unwrap_or(cwd);
    write::init(&root)?;
    Ok(exit::SUCCESS)
}
