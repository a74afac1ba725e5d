//! The exit codes of docs/interface.md §2. Every path out of cibox ends in one of these.
//! Each error type says which kind of [`Failure`] it is, next to its definition;
//! [`Failure::code`] is the one place a kind becomes a code.

/// Success.
pub const SUCCESS: u8 = 0;
/// A batch ran and its tests failed (or it ran no test and `allow_empty` is off).
pub const TESTS_FAILED: u8 = 1;
/// Usage or configuration error: bad flag, bad manifest, unknown batch or layer.
pub const USAGE: u8 = 2;
/// Image refused: not a full `sha256:` ID, not present locally, lockset mismatch.
pub const IMAGE_REFUSED: u8 = 3;
/// The GPUs asked for could not be leased within the wait allowed.
pub const CAPACITY: u8 = 4;
/// Infrastructure error: engine unreachable, GPU probe failed, no GPU runtime.
pub const INFRA: u8 = 5;
/// A batch hit its timeout.
pub const TIMEOUT: u8 = 124;

/// The kinds of failure the exit codes tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A bad flag, manifest or configuration: fix the input.
    Usage,
    /// The image cannot be used.
    ImageRefused,
    /// The GPUs asked for could not be leased within the wait allowed.
    Capacity,
    /// The host, engine or GPUs failed (or could not be trusted).
    Infra,
    /// cibox was asked to stop by this signal.
    Signal(nix::sys::signal::Signal),
}

impl Failure {
    /// The exit code of a failure of this kind.
    pub const fn code(self) -> u8 {
        match self {
            Failure::Usage => USAGE,
            Failure::ImageRefused => IMAGE_REFUSED,
            Failure::Capacity => CAPACITY,
            Failure::Infra => INFRA,
            Failure::Signal(sig) => signal(sig as i32),
        }
    }
}

/// The code for "ended by signal N" (130 SIGINT, 143 SIGTERM, 129 SIGHUP).
pub const fn signal(signo: i32) -> u8 {
    (128 + signo) as u8
}

/// Rank used to combine the outcomes of several batches: 5 > 3 > 124 > 1 > 4 > 0.
fn severity(code: u8) -> u8 {
    match code {
        INFRA => 6,
        IMAGE_REFUSED => 5,
        TIMEOUT => 4,
        TESTS_FAILED => 3,
        CAPACITY => 2,
        SUCCESS => 0,
        // Anything else (usage errors, signals) ends a run at once and is never combined;
        // rank it above all so it is not hidden if it ever is.
        _ => 7,
    }
}

/// The most severe of several exit codes (docs/interface.md §2).
pub fn most_severe(codes: impl IntoIterator<Item = u8>) -> u8 {
    codes
        .into_iter()
        .max_by_key(|c| severity(*c))
        .unwrap_or(SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_the_documented_one() {
        assert_eq!(most_severe([0, 4, 1]), 1);
        assert_eq!(most_severe([1, 124]), 124);
        assert_eq!(most_severe([124, 3]), 3);
        assert_eq!(most_severe([3, 5, 0]), 5);
        assert_eq!(most_severe([4, 0]), 4);
        assert_eq!(most_severe([]), 0);
        assert_eq!(signal(2), 130);
        assert_eq!(signal(15), 143);
        assert_eq!(signal(1), 129);
    }
}
