//! Ctrl-C and `kill`: SIGINT and SIGTERM set a flag that long work polls to
//! stop cleanly, rather than leave behind what only it can remove (`smoe
//! pack`'s temporary directory, `smoe bench --mem-cap`'s memory cgroups).

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the SIGINT/SIGTERM handler.
static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Relaxed: a flag polled by the work it stops; it publishes nothing else.
    REQUESTED.store(true, Ordering::Relaxed);
}

/// From now on, the first SIGINT or SIGTERM only sets the flag
/// ([`requested`]); the next has its default action again, so that work
/// stuck where it does not look at the flag can still be stopped.
pub fn catch() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed `sigaction` is a valid empty one; `on_signal`
        // only stores to an atomic, which is async-signal-safe, and stays
        // valid for the process's life. SA_RESETHAND restores the default
        // action after the first signal (sigaction(2)). A child process
        // gets the default actions back at exec (execve(2)).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// The flag itself, for work that polls it (the packer's `cancel`).
pub fn flag() -> &'static AtomicBool {
    &REQUESTED
}

/// Whether a SIGINT or SIGTERM came since [`catch`].
pub fn requested() -> bool {
    // Relaxed: see `on_signal`.
    REQUESTED.load(Ordering::Relaxed)
}
