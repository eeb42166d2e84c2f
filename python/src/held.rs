//! A claim held for a lease and its views ([`Held`]), and one view of it
//! ([`View`]): the count that keeps the claim from being released while
//! any view shows its slot (`lease` says the rule). Below the lease and
//! DLPack's export, which both count views here.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use smoe::SlotInfo;

use crate::errors;
use crate::shared::Core;

/// How many views are alive, whether the claim's release was asked, and
/// the streamer while the claim is held.
pub(crate) struct Views {
    pub(crate) alive: usize,
    /// `release()` was called (or the `with` block ended): the lease's own
    /// methods raise from then on.
    pub(crate) release_asked: bool,
    /// The streamer, until the claim is released in the library: then it
    /// is taken and dropped (the last reference of a closed streamer tears
    /// it down, see `Core`'s drop).
    pub(crate) core: Option<Arc<Core>>,
}

/// What a lease and its views share: the claim, and its views' count.
pub(crate) struct Held {
    pub(crate) info: SlotInfo,
    /// `Streamer(..., strict=True)`.
    pub(crate) strict: bool,
    pub(crate) views: Mutex<Views>,
}

impl Held {
    pub(crate) fn views(&self) -> MutexGuard<'_, Views> {
        // Nothing panics while holding it; a poisoned count is still right.
        self.views.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a new view; refused once the release was asked.
    pub(crate) fn add_view(&self, py: Python<'_>) -> PyResult<()> {
        let mut views = self.views();
        if views.release_asked {
            // Let go first: making the error runs Python code, during
            // which another thread may take the GIL and drop a view.
            drop(views);
            return Err(self.released_error(py));
        }
        views.alive += 1;
        Ok(())
    }

    /// Uncounts a view; the last one releases a claim whose release was
    /// asked meanwhile. Needs no GIL: a DLPack consumer may drop its tensor
    /// from any thread.
    pub(crate) fn drop_view(&self) {
        let mut views = self.views();
        views.alive = views.alive.saturating_sub(1);
        let core = if views.alive == 0 && views.release_asked {
            self.release_now(&mut views)
        } else {
            None
        };
        drop(views);
        // After the lock: perhaps the teardown.
        drop(core);
    }

    /// Releases the claim in the library, unless it was already; the
    /// streamer, which the caller drops once it has let go of the lock.
    pub(crate) fn release_now(&self, views: &mut Views) -> Option<Arc<Core>> {
        let core = views.core.take()?;
        // A ticket this lease holds: it cannot be stale.
        let _ = core.streamer.release_ticket(self.info.ticket);
        // Release: pairs with `close()`'s Acquire in strict mode.
        core.held.fetch_sub(1, Ordering::Release);
        Some(core)
    }

    pub(crate) fn released_error(&self, py: Python<'_>) -> PyErr {
        errors::stale(
            py,
            format!(
                "the lease of layer {} expert {} was released",
                self.info.layer, self.info.expert
            ),
        )
    }

    /// The claim's bytes.
    pub(crate) fn data(&self) -> *const u8 {
        self.info.data
    }

    /// How many bytes the claim holds.
    pub(crate) fn size(&self) -> u64 {
        self.info.size
    }
}

impl Drop for Held {
    /// The lease and every view are gone: a claim not released yet is
    /// released now, and the streamer let go of (perhaps its teardown, on
    /// whatever thread this is: see `Core`'s drop).
    fn drop(&mut self) {
        let views = self.views.get_mut().unwrap_or_else(|p| p.into_inner());
        let core = views.core.take();
        if let Some(core) = &core {
            let _ = core.streamer.release_ticket(self.info.ticket);
            core.held.fetch_sub(1, Ordering::Release);
        }
        drop(core);
    }
}

/// One view of a lease's bytes, counted while it lives.
pub(crate) struct View(pub(crate) Arc<Held>);

impl View {
    pub(crate) fn held(&self) -> &Held {
        &self.0
    }
}

impl Drop for View {
    fn drop(&mut self) {
        self.0.drop_view();
    }
}
