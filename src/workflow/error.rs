//! Why the workflows could not be rendered: one line each, naming the template and,
//! where known, its line.

use std::path::PathBuf;

use super::render::{CPU, FUEL, MAX_OUTPUT_BYTES, MAX_TEMPLATE_BYTES, MEMORY};

/// Why the workflows could not be rendered: a configuration error (nothing is written).
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// What the render's own process said (see `workflow::confined`).
    #[error("{message}")]
    InChild {
        message: String,
        details: Vec<String>,
    },
    /// The render's process went over its memory or CPU bound, or died.
    #[error(
        "{}: went over what a render may use ({} GiB of memory, {} s of CPU): {how}; a template that builds values without end cannot be rendered",
        .template.display(),
        MEMORY >> 30,
        CPU
    )]
    OverBounds { template: PathBuf, how: String },
    #[error("workflows dir {}: {source}", .dir.display())]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", .template.display())]
    Unreadable {
        template: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// minijinja refused the template, or failed rendering it.
    #[error(
        "{}{}: {kind}{}{}",
        .template.display(),
        .line.map(|l| format!(":{l}")).unwrap_or_default(),
        .undefined.as_ref().map(|u| format!(": {u}")).unwrap_or_default(),
        .detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default()
    )]
    Template {
        template: PathBuf,
        line: Option<usize>,
        kind: minijinja::ErrorKind,
        /// What was undefined (`` `b.nope` is not defined ``), when minijinja gives
        /// only its span.
        undefined: Option<String>,
        detail: Option<String>,
    },
    #[error(
        "{}: larger than {} KiB, the most a template may be",
        .template.display(),
        MAX_TEMPLATE_BYTES >> 10
    )]
    TooLarge { template: PathBuf },
    #[error("{}: not UTF-8 text (byte {byte})", .template.display())]
    NotUtf8 { template: PathBuf, byte: usize },
    #[error(
        "template {}: ran out of its instruction budget{}: a render may take about {FUEL} steps and handle about {} MiB of data; nothing written",
        .template.display(),
        .line.map(|l| format!(" (at line {l})")).unwrap_or_default(),
        (FUEL * 64) >> 20
    )]
    OutOfFuel {
        template: PathBuf,
        line: Option<usize>,
    },
    #[error(
        "template {}: rendered output over {} MiB, the most a workflow file may be (what `workflow lint` reads); nothing written",
        .template.display(),
        MAX_OUTPUT_BYTES >> 20
    )]
    OutputTooLarge { template: PathBuf },
    #[error("{}: the rendered output is not UTF-8", .template.display())]
    OutputNotUtf8 { template: PathBuf },
    #[error(
        "{}: the rendered output is not YAML: line {line} (of the output, banner included): {message}",
        .template.display()
    )]
    NotYaml {
        template: PathBuf,
        line: usize,
        message: String,
    },
    #[error(
        "{}: the rendered pipeline fails Buildkite's pipeline schema at {at} (line {line} of the output): {message}; nothing written",
        .template.display()
    )]
    FailsSchema {
        template: PathBuf,
        /// Where in the pipeline: `steps.2.key`.
        at: String,
        line: usize,
        message: String,
    },
    #[error(
        "{}: the rendered output fails `workflow lint` (nothing written): {}",
        .template.display(),
        .errors.join("; ")
    )]
    FailsLint {
        template: PathBuf,
        /// The lint's errors, one line each.
        errors: Vec<String>,
    },
}

impl crate::error::ErrorKind for RenderError {
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }

    fn details(&self) -> &[String] {
        match self {
            RenderError::InChild { details, .. } => details,
            _ => &[],
        }
    }
}
