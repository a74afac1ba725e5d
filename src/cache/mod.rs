//! Caches: folders a batch's tests write (datasets they download, checkpoints they
//! convert, CUDA extensions they compile) that later batches of the project reuse, on
//! one host, without one pull request's code planting something the next trusted run
//! loads.
//!
//! The host policy places the store, sizes each cache and says whether runs on this
//! host write through (only the host can vouch for who reaches it; a manifest, a flag or
//! a variable of the job cannot). A batch sees a cache's current generation, an
//! immutable folder, read-only beneath an overlay with a private writable layer:
//!
//! - a run the host does not trust writes into a memory-backed layer of its own,
//!   sized by the policy, thrown away with the batch: no later run sees it;
//! - a trusted run writes into a layer on disk; when its batch passes, that layer is
//!   laid over the newest generation into a new one (hard links, no data copied), the
//!   least recently used entries dropped to stay within the cap, and the new
//!   generation named current by one rename. Readers keep the generation they started
//!   with (a shared lock) until they end; a generation nobody uses and that is not
//!   current is removed.
//!
//! Layout under the store's root (see [`store`]): `PROJECT/NAME/` (mode 0700: what it
//! holds is the batch user's, and no other local user may reach it) holds `cache.lock`,
//! `current` (the current generation's name), `gens/GEN/` and `gens/GEN.lock`, and
//! `work/ID/{upper,work}` with `work/ID.lock` for trusted runs under way.

mod merge;
mod scope;
pub mod shown;
mod store;
mod walk;

pub use store::{Cache, CacheInfo, CacheStore, Reading, Writing};

use std::path::PathBuf;

/// Why a cache cannot be used. Each is the host's to fix (exit 2 before a run; a
/// promotion that fails after a batch passed is reported and leaves the cache as it
/// was).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache store {path}: {message}")]
    Store { path: PathBuf, message: String },
    #[error("cache {cache}: {message}")]
    Cache { cache: String, message: String },
    #[error("cache {cache}: {what} {path}: {source}")]
    Io {
        cache: String,
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl crate::error::ErrorKind for CacheError {
    /// The store or a cache is the host's to fix (exit 2); reading or writing its files
    /// failed underneath (exit 5).
    fn failure(&self) -> crate::exit::Failure {
        match self {
            CacheError::Io { .. } => crate::exit::Failure::Infra,
            _ => crate::exit::Failure::Usage,
        }
    }
}

/// A cache's name or a project's, as a folder name: what a manifest's `project` allows
/// (`[a-z0-9][a-z0-9_.-]*`) and what a cache name allows (letters, digits, `_`, `.`,
/// `-`, starting with a letter or digit), never `.` or `..`.
pub fn is_folder_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}
