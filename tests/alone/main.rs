//! The library's tests that need the process to themselves, one binary: they
//! measure its CPU time or RSS (`claim_wait`, `id_space`, `idle_workers`,
//! `lazy_ring`, `ring_memory`), change its working directory
//! (`trace_cwd`), move it into a memory cgroup (`elastic`, `pinned_ring`'s child), or keep every
//! core busy (`stress`). Every test takes [`alone`] first, so they run one
//! at a time whatever `--test-threads` says, and no other test of the suite
//! shares their process (those are in the `library` binary).
//!
//! Run one subject with a filter on its module, e.g.
//! `cargo test --release --test alone -- idle_workers:: --nocapture`.

use std::sync::{Mutex, MutexGuard, PoisonError};

mod claim_wait;
mod elastic;
mod id_space;
mod idle_workers;
mod lazy_ring;
mod model_fds;
mod model_memory;
mod pinned_ring;
mod read_size;
mod ring_memory;
mod stress;
mod trace_cwd;

static ALONE: Mutex<()> = Mutex::new(());

/// Held for the whole of a test of this binary: no other test of it runs
/// meanwhile. A test that failed holding it does not fail the others.
fn alone() -> MutexGuard<'static, ()> {
    ALONE.lock().unwrap_or_else(PoisonError::into_inner)
}
