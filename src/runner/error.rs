//! Why a run, or one of its batches, could not go on; and why a reporter could not
//! write what it owns. Errors of the layers below (engine, leases, images, …) pass
//! through as they are ([`crate::error::Error`]); these are the runner's own.

use crate::error::ErrorKind;
use crate::exit::Failure;

/// A reporter could not write what it owns (a reports file).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct ReporterError {
    pub what: String,
    #[source]
    pub source: std::io::Error,
}

impl ReporterError {
    pub fn new(what: impl Into<String>, source: std::io::Error) -> ReporterError {
        ReporterError {
            what: what.into(),
            source,
        }
    }
}

/// Why a request cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("unknown layer `{layer}`; {hint}")]
    UnknownLayer { layer: String, hint: String },
    #[error("unknown batch `{batch}`; {hint}")]
    UnknownBatch { batch: String, hint: String },
    #[error("batch `{batch}` is not in layer `{layer}` (its batches: {batches})")]
    NotInLayer {
        batch: String,
        layer: String,
        batches: String,
    },
    #[error("no batch to run: name batches or a --layer")]
    NothingToRun,
    #[error("no image ID: pass --image, set CIBOX_IMAGE, or set image.id in cibox.yaml")]
    NoImage,
    #[error("no ID for image `{name}`: set images.{name}.id in cibox.yaml or {var}")]
    NoNamedImage { name: String, var: String },
    #[error(
        "batch `{batch}` names no image and the manifest has no default one: it runs only as part of a layer that names one ({layers}); run it with --layer"
    )]
    NoImageOutsideLayer { batch: String, layers: String },
    #[error(
        "this run uses the images {names}: --image (or CIBOX_IMAGE) would be ambiguous; set each image's id in cibox.yaml, or CIBOX_IMAGE_<NAME>"
    )]
    AmbiguousImage { names: String },
    /// The ID is not a full `sha256:` image ID (an image refusal, exit 3).
    #[error("image refused: {0}")]
    BadImageId(String),
}

impl ErrorKind for ReporterError {
    fn failure(&self) -> Failure {
        Failure::Infra
    }
}

impl ErrorKind for PlanError {
    fn failure(&self) -> Failure {
        match self {
            PlanError::BadImageId(_) => Failure::ImageRefused,
            _ => Failure::Usage,
        }
    }
}

/// What kept a run, or one of its batches, from going on, where no domain error says it.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Where to run (source, reports folder, scope) or which test file cannot be used.
    #[error("{0}")]
    Usage(String),
    /// A file the run writes for its caller (`qualification.json`) could not be written.
    #[error("{0}")]
    Infra(String),
    /// A `gpu.pool` entry names no GPU of this host.
    #[error("{0}")]
    Pool(String),
    #[error("batch {batch} needs {need} GPUs; the pool has {pool}")]
    PoolTooSmall {
        batch: String,
        need: usize,
        pool: usize,
    },
    /// The run's lock, or a dead run's, could not be used.
    #[error("lock dir {dir}: {what}: {source}")]
    RunLocks {
        dir: String,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "reports dir {dir} exists and holds files cibox did not write; choose another --reports"
    )]
    ForeignBatchDir { dir: String },
    #[error("cannot {what} {dir}: {source}")]
    BatchDir {
        dir: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("a batch's thread panicked")]
    Panicked,
    #[error("cannot start the watchdog of a batch container: {0}")]
    Watchdog(#[source] std::io::Error),
    #[error(
        "batches run as uid {uid}, never as root, and cannot read the source {dir} (mode {mode:o}); make it readable by others (chmod o+rx), or run cibox as an unprivileged CI user"
    )]
    SourceUnreadable { dir: String, mode: u32, uid: u32 },
    /// The GPUs Slurm allocated on a node cannot be leased there (fail closed).
    #[error("{0}")]
    SlurmGpus(String),
    /// What kept a batch from running on its node, as the node said it (exit `code`).
    #[error("{message}")]
    OnNode {
        message: String,
        details: Vec<String>,
        code: u8,
    },
}

/// The kind of failure an exit code says (a node's, relayed).
pub fn failure_of_code(code: u8) -> Failure {
    match code {
        crate::exit::USAGE => Failure::Usage,
        crate::exit::IMAGE_REFUSED => Failure::ImageRefused,
        crate::exit::CAPACITY => Failure::Capacity,
        c if c > 128 => nix::sys::signal::Signal::try_from(i32::from(c) - 128)
            .map(Failure::Signal)
            .unwrap_or(Failure::Infra),
        _ => Failure::Infra,
    }
}

impl ErrorKind for RunError {
    fn details(&self) -> &[String] {
        match self {
            RunError::OnNode { details, .. } => details,
            _ => &[],
        }
    }

    fn failure(&self) -> Failure {
        match self {
            RunError::Usage(_)
            | RunError::Pool(_)
            | RunError::ForeignBatchDir { .. }
            | RunError::SourceUnreadable { .. } => Failure::Usage,
            // A reports folder cibox cannot clear or make is the user's to fix.
            RunError::BatchDir { what, .. } if matches!(*what, "clear" | "create") => {
                Failure::Usage
            }
            RunError::PoolTooSmall { .. } => Failure::Capacity,
            RunError::SlurmGpus(_) => Failure::Infra,
            RunError::OnNode { code, .. } => failure_of_code(*code),
            RunError::RunLocks { .. }
            | RunError::BatchDir { .. }
            | RunError::Panicked
            | RunError::Watchdog(_)
            | RunError::Infra(_) => Failure::Infra,
        }
    }
}
