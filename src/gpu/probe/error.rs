//! Why a probe could not tell what the GPUs are doing: every case fails closed.

use crate::exit::Failure;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "GPU probe: cannot run `{program}`: {reason} (set {knob} to the program to use; no GPU on this machine? `eval \"$(cibox gpu fake --count 2)\"` gives it fake ones, docs/guide/gpus.md)"
    )]
    Spawn {
        program: String,
        reason: String,
        /// The variable that names the program (`CIBOX_NVIDIA_SMI`, `CIBOX_ROCM_SMI`).
        knob: &'static str,
    },
    #[error("GPU probe: `{program} {query}` exited with {status}: {stderr}")]
    Failed {
        program: String,
        query: &'static str,
        status: String,
        stderr: String,
    },
    #[error(
        "GPU probe: `{program} {query}` did not answer within {secs}s; the driver may be wedged"
    )]
    Timeout {
        program: String,
        query: &'static str,
        secs: u64,
    },
    #[error(
        "GPU probe: `{program} {query}` line {line}: {reason}; treating all GPUs as unavailable"
    )]
    Parse {
        program: String,
        query: &'static str,
        line: usize,
        reason: String,
    },
    /// NVML said something other than a plain answer.
    #[error("GPU probe: NVML ({lib}): {call}: {message}; treating all GPUs as unavailable")]
    Nvml {
        lib: String,
        call: String,
        message: String,
    },
    /// An NVML call that does not return cannot be interrupted: the thread that made it
    /// stays stuck, and every later probe of this process fails at once.
    #[error(
        "GPU probe: NVML ({lib}): {call} did not answer within {secs}s; the driver may be wedged"
    )]
    NvmlTimeout {
        lib: String,
        call: String,
        secs: u64,
    },
    /// A GPU that an earlier probe showed is gone: fallen off the bus, or a driver
    /// reset under way.
    #[error(
        "GPU probe: {backend}: GPU {index} ({uuid}) was there at an earlier probe and is gone now; treating all GPUs as unavailable"
    )]
    Lost {
        backend: String,
        index: u32,
        uuid: String,
    },
    /// The answer names one unit twice (a UUID, or a whole GPU's index).
    #[error("GPU probe: {backend}: {what} appears twice; treating all GPUs as unavailable")]
    Twice { backend: String, what: String },
    /// A signal arrived while the probe waited for another waiter's.
    #[error("GPU probe: stopped by {0} while waiting for another waiter's probe")]
    Interrupted(nix::sys::signal::Signal),
}

impl crate::error::ErrorKind for ProbeError {
    /// A probe that fails, hangs or says what cannot be parsed fails closed.
    fn failure(&self) -> Failure {
        Failure::Infra
    }
}
