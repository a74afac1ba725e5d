//! Termination signals (SIGINT, SIGTERM, SIGHUP): recorded, never acted on in the
//! handler. The code that owns a workload polls [`received`] and tears it down in order
//! (workload first, lease last), then exits 128+N.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

static RECEIVED: AtomicI32 = AtomicI32::new(0);
static COUNT: AtomicU32 = AtomicU32::new(0);

extern "C" fn record(signo: i32) {
    // Keep the first one: it decides the exit code.
    let _ = RECEIVED.compare_exchange(0, signo, Ordering::SeqCst, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
}

/// How many terminating signals have arrived: a step that must still run after the
/// first (copying a cancelled batch's reports) stops at the next one.
pub fn count() -> u32 {
    COUNT.load(Ordering::SeqCst)
}

pub const TERMINATING: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Installs the recording handler for the terminating signals.
pub fn install() {
    let action = SigAction::new(
        SigHandler::Handler(record),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in TERMINATING {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        unsafe {
            let _ = sigaction(sig, &action);
        }
    }
}

/// The first terminating signal received, if any.
pub fn received() -> Option<Signal> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        n => Signal::try_from(n).ok(),
    }
}
