//! Artifacts between layers: what a batch declares as its `outputs` (a wheel it built)
//! is taken out of its finished container into the run's artifact store, each file with
//! its sha256; a batch of a later layer that `needs` it gets it mounted read-only at
//! `/artifacts/<batch>/`, checked file by file against that list first.
//!
//! The store is `<reports>/_artifacts/` (a name no batch folder can take: batch names
//! start with a letter or digit). Each producer has `<batch>/files/` (what it output,
//! regular files and folders only, plain modes) and `<batch>/listing.json` ([`Listing`]:
//! the files, their sizes and digests, and the [`Key`] of the run that made them). A
//! listing is written last, after the files, into a folder renamed into place: a
//! producer's artifact is whole or absent. The digest of `listing.json` itself is what
//! a CI job hands the next one (`cibox artifact digest`), so files and list carried
//! across runners are checked against a value that did not travel with them.
//!
//! Trust: an artifact is used only by a run of the same [`Key`]: the same CI run
//! (GitHub's run, Buildkite's build) and the same trust. A pull request's run (any
//! event that may run unmerged code) makes untrusted artifacts, which a trusted run
//! refuses, as a pull request's cache writes never reach the base branch's runs
//! ([`crate::cache`]).

mod check;
mod take;

pub use check::{Verified, listing_digest, verify};
pub use take::{OutputSpec, Taken, forget, produce, take};

use serde::{Deserialize, Serialize};

use crate::error::ErrorKind;
use crate::exit::Failure;

/// The store's folder in the reports folder.
pub const STORE: &str = "_artifacts";
/// A producer's files, in its folder of the store.
pub const FILES: &str = "files";
/// A producer's list of files and digests, in its folder of the store.
pub const LISTING: &str = "listing.json";
/// Where a consumer sees a producer's files: `/artifacts/<batch>`.
pub const MOUNT_ROOT: &str = "/artifacts";
/// What one batch may output, in all, unless the host policy says more
/// (`artifacts.max_size`).
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;
/// The most files (and folders) one batch may output.
pub const MAX_FILES: usize = 10_000;
/// The largest listing read back.
const MAX_LISTING_BYTES: u64 = 8 << 20;

/// Which run an artifact belongs to, and how far that run is trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    /// `github:OWNER/REPO:RUN_ID`, `buildkite:BUILD_ID`, or `local` outside CI.
    pub run: String,
    /// `trusted` (merged code) or `untrusted` (a pull request's, or a replay's).
    pub trust: Trust,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    Trusted,
    Untrusted,
}

impl Key {
    /// The key of `run` (see [`Key::run`]); `untrusted`: the run may run code nobody
    /// merged (a pull request's event or build, a replay).
    pub fn new(run: String, untrusted: bool) -> Key {
        Key {
            run,
            trust: if untrusted {
                Trust::Untrusted
            } else {
                Trust::Trusted
            },
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let trust = match self.trust {
            Trust::Trusted => "trusted",
            Trust::Untrusted => "untrusted",
        };
        write!(f, "run {} ({trust})", self.run)
    }
}

/// What a run needs to know of artifacts: its key, the bound, and where the engine
/// finds the reports folder when that is not where cibox does.
#[derive(Debug, Clone)]
pub struct RunArtifacts {
    pub key: Key,
    /// The most bytes one batch may output (the host policy's `artifacts.max_size`).
    pub max_bytes: u64,
    /// The reports folder on the engine's host, when cibox runs in a container.
    pub host_reports: Option<std::path::PathBuf>,
}

impl Default for RunArtifacts {
    fn default() -> RunArtifacts {
        RunArtifacts {
            key: Key::new("local".into(), false),
            max_bytes: DEFAULT_MAX_BYTES,
            host_reports: None,
        }
    }
}

/// One file of an artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// Relative to the producer's `files/`.
    pub path: String,
    pub size: u64,
    /// `sha256:` and 64 hex digits.
    pub sha256: String,
}

/// What a producer left, as `listing.json` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listing {
    pub schema: u32,
    pub project: String,
    pub batch: String,
    pub key: Key,
    /// The `outputs` patterns, as the manifest wrote them.
    pub outputs: Vec<String>,
    /// Folders, relative to `files/`, parents first.
    pub folders: Vec<String>,
    pub files: Vec<FileDigest>,
}

/// Why an artifact cannot be used. A consumer's refusal comes before anything runs:
/// exit 2, nothing made.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error(
        "the artifact of batch {producer}, which {consumer} needs, is not in {store}: run {producer}'s layer first (in CI, download its artifact into that folder)"
    )]
    Missing {
        consumer: String,
        producer: String,
        store: String,
    },
    #[error(
        "batch {consumer} needs the artifact of batch {producer}, which this run also runs: artifacts pass between layers, so run {producer} first, on its own or in an earlier layer"
    )]
    SameRun { consumer: String, producer: String },
    #[error(
        "artifact of batch {producer}: made by {theirs}, and this is {ours}: refused (an artifact reaches only a run of the same CI run and trust; a pull request's never reaches a trusted run)"
    )]
    Foreign {
        producer: String,
        theirs: Key,
        ours: Key,
    },
    #[error("artifact of batch {producer}: {why}: refused (it changed after it was made)")]
    Changed { producer: String, why: String },
    #[error("artifact of batch {producer}: its listing's digest is {found}, not {expected}")]
    Digest {
        producer: String,
        found: String,
        expected: String,
    },
    #[error(
        "batch {batch} has `outputs` or `needs`, and this host runs batches as Slurm jobs: artifacts between layers pass through the reports folder of the host that runs the layers, which a Slurm job's node does not share; run it on a host without a scheduler"
    )]
    UnderSlurm { batch: String },
    #[error("artifact store {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl ErrorKind for ArtifactError {
    fn failure(&self) -> Failure {
        match self {
            ArtifactError::Io { .. } => Failure::Infra,
            _ => Failure::Usage,
        }
    }
}

/// `sha256:` and the hex digest of `bytes`.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", crate::util::hex(&sha2::Sha256::digest(bytes)))
}
