//! The ring's memory: one anonymous mapping of `slots × slot_bytes`,
//! aligned to [`DEFAULT_ALIGNMENT`] (16384), so slot `i` starts at
//! `base + i × slot_bytes` and a host can wrap the whole ring once (one
//! `MTLBuffer`, one `cudaHostRegister`). The mapping is reserved, not
//! committed: opening a ring of many gigabytes takes no time and no memory,
//! and a slot's pages are committed when a worker first reads into it. Its
//! address range is fixed for the ring's life.
//!
//! It owns the allocation and hands out raw slot pointers; who may read or
//! write a slot at a given moment is decided by the slot table, never here.

use crate::error::{Error, ErrorKind, Result};
use crate::sys::Reservation;
use crate::vault::DEFAULT_ALIGNMENT;

pub(crate) struct Ring {
    // Concurrent access to a slot is ordered by the slot table's state word
    // (a worker writes only while READING, claimants read only while holding
    // a refcount); `Reservation` is Send and Sync on that understanding.
    memory: Reservation,
    bytes: usize,
    slot_bytes: usize,
    slots: u32,
}

impl Ring {
    /// Reserves `slots × slot_bytes` zero bytes (committed page by page as
    /// slots are first written). `slot_bytes` must be a multiple of
    /// [`DEFAULT_ALIGNMENT`].
    ///
    /// With `huge_pages`: the base aligned to a huge page
    /// (2 MiB) and the OS asked to back the ring with transparent huge
    /// pages where it can, so a first pass faults one page per 2 MiB
    /// instead of 512. Slots stay where `slot_bytes` puts them; a slot
    /// released by the elastic ring splits the huge pages it shares with a
    /// neighbour (their data stays); khugepaged may later fold such a
    /// range back into a huge page, committing the offline slot's part of
    /// it again (at most one huge page's worth at each end of an offline
    /// run, at khugepaged's slow scan rate). Advice only: refused or not
    /// available, the ring works as without.
    pub(crate) fn new(slots: u32, slot_bytes: u64, huge_pages: bool) -> Result<Ring> {
        debug_assert!(
            slots > 0 && slot_bytes > 0 && slot_bytes % u64::from(DEFAULT_ALIGNMENT) == 0
        );
        let total = u64::from(slots)
            .checked_mul(slot_bytes)
            .and_then(|t| usize::try_from(t).ok())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NoMemory,
                    format!("ring of {slots} slots × {slot_bytes} bytes does not fit in memory"),
                )
            })?;
        let align = if huge_pages {
            crate::sys::HUGE_PAGE_BYTES
        } else {
            DEFAULT_ALIGNMENT as usize
        };
        let memory = Reservation::new(total, align).map_err(|e| {
            Error::new(
                ErrorKind::NoMemory,
                format!(
                    "could not reserve the ring: {slots} slots × {slot_bytes} bytes = {total} bytes: {e}"
                ),
            )
        })?;
        if huge_pages {
            // Advice: a kernel without THP, or one that refuses, leaves the
            // ring on small pages.
            let _ = memory.advise_huge_pages();
        }
        Ok(Ring {
            memory,
            bytes: total,
            slot_bytes: slot_bytes as usize,
            slots,
        })
    }

    /// The mapping, for the calls that act on its pages (populate,
    /// discard, lock); which slots they may touch is the caller's to decide.
    pub(crate) fn reservation(&self) -> &Reservation {
        &self.memory
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.memory.as_ptr()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The first byte of slot `i`.
    pub(crate) fn slot_ptr(&self, i: u32) -> *mut u8 {
        assert!(i < self.slots, "slot {i} out of range");
        // SAFETY: i < slots, so the offset stays inside the allocation.
        unsafe { self.memory.as_ptr().add(i as usize * self.slot_bytes) }
    }
}
