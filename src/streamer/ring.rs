//! The ring's memory: one allocation of `slots × slot_bytes`, aligned to
//! [`DEFAULT_ALIGNMENT`] (16384), so slot `i` starts at `base + i × slot_bytes` and a host can wrap
//! the whole ring once (one `MTLBuffer`, one `cudaHostRegister`).
//!
//! It owns the allocation and hands out raw slot pointers; who may read or
//! write a slot at a given moment is decided by the slot table, never here.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use crate::error::{Error, ErrorKind, Result};
use crate::vault::DEFAULT_ALIGNMENT;

pub(crate) struct Ring {
    base: NonNull<u8>,
    layout: Layout,
    slot_bytes: usize,
    slots: u32,
}

// SAFETY: the ring is plain memory; concurrent access to a slot is ordered by
// the slot table's state word (a worker writes only while READING, claimants
// read only while holding a refcount), so sharing the pointer is sound.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

impl Ring {
    /// Allocates `slots × slot_bytes` zeroed bytes (pages are committed
    /// lazily by the OS). `slot_bytes` must be a multiple of
    /// [`DEFAULT_ALIGNMENT`].
    pub(crate) fn new(slots: u32, slot_bytes: u64) -> Result<Ring> {
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
        let layout = Layout::from_size_align(total, DEFAULT_ALIGNMENT as usize).map_err(|_| {
            Error::new(
                ErrorKind::NoMemory,
                format!("ring of {total} bytes is too large to allocate"),
            )
        })?;
        // SAFETY: `layout` has a nonzero size (slots > 0, slot_bytes > 0).
        let ptr = unsafe { alloc_zeroed(layout) };
        let base = NonNull::new(ptr).ok_or_else(|| {
            Error::new(
                ErrorKind::NoMemory,
                format!(
                    "could not allocate the ring: {slots} slots × {slot_bytes} bytes = {total} bytes"
                ),
            )
        })?;
        Ok(Ring {
            base,
            layout,
            slot_bytes: slot_bytes as usize,
            slots,
        })
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.layout.size()
    }

    /// The first byte of slot `i`.
    pub(crate) fn slot_ptr(&self, i: u32) -> *mut u8 {
        assert!(i < self.slots, "slot {i} out of range");
        // SAFETY: i < slots, so the offset stays inside the allocation.
        unsafe { self.base.as_ptr().add(i as usize * self.slot_bytes) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: `base` came from `alloc_zeroed(self.layout)` and is freed once.
        unsafe { dealloc(self.base.as_ptr(), self.layout) }
    }
}
