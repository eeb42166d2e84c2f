//! The device tier's C API (issue 50; docs/c-api.md, "A device tier"): the
//! library's rule ([`crate::tier::DeviceTier`]) for a host that keeps hot
//! experts in device memory (VRAM) it owns, keyed by (layer, expert). The
//! tier touches no device and no streamer: it says which expert goes in
//! which device slot, and when a slot may be overwritten.

use std::ptr::{self, NonNull};
use std::sync::Mutex;

use super::{ffi_guard, ffi_status, smoe_status, try_out, try_ref};
use crate::limits::MAX_EXPERT_IDS;
use crate::tier::{DeviceTier, TierError};
use crate::{Error, ErrorKind};

/// A device tier (opaque). Made by `smoe_tier_new`, freed by
/// `smoe_tier_free`; every other call may run on it from many threads at
/// once (one at a time inside).
pub struct smoe_tier {
    inner: Mutex<DeviceTier>,
    n_layers: u32,
    n_experts: u32,
}

/// What `smoe_tier_admit` decided.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct smoe_tier_promotion {
    /// The device slot to copy the expert into, from its claimed ring slot,
    /// then `smoe_tier_loaded` (or `smoe_tier_failed`); -1: not admitted,
    /// nothing to do.
    pub slot: i32,
    /// The layer of the expert the slot held, now gone from the device; -1
    /// when the slot was empty (or nothing was admitted).
    pub evicted_layer: i32,
    /// That expert's index in its layer; -1 likewise.
    pub evicted_expert: i32,
}

/// A device tier's counters since `smoe_tier_new`. The caller sets
/// `struct_size` to `sizeof(smoe_tier_stats)`; see `smoe_tier_get_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct smoe_tier_stats {
    /// Set by the caller to `sizeof(smoe_tier_stats)`; the library sets it to
    /// the bytes it wrote.
    pub struct_size: u32,
    /// Experts looked up (every use of a decode step).
    pub lookups: u64,
    /// Lookups that found the expert ready in a device slot.
    pub hits: u64,
    /// Promotions handed out by `smoe_tier_admit`.
    pub promotions: u64,
    /// Promotions whose copy failed (`smoe_tier_failed`).
    pub failed: u64,
    /// Experts evicted without a single hit since they were loaded: copies
    /// that bought nothing.
    pub never_used: u64,
    /// Ready experts evicted.
    pub evictions: u64,
    /// Bytes reported copied (`smoe_tier_loaded`).
    pub bytes_copied: u64,
}

/// `sizeof(smoe_tier_stats)` of this library (its first version).
const TIER_STATS_SIZE: usize = size_of::<smoe_tier_stats>();

impl smoe_tier {
    /// The tier's key of (layer, expert), or an argument error naming them.
    fn key(&self, layer: u32, expert: u32) -> Result<u32, Error> {
        if layer >= self.n_layers || expert >= self.n_experts {
            return Err(Error::argument(format!(
                "layer {layer}, expert {expert} is outside the tier's {} layers × {} experts",
                self.n_layers, self.n_experts
            )));
        }
        Ok(layer * self.n_experts + expert)
    }

    fn rule(&self) -> std::sync::MutexGuard<'_, DeviceTier> {
        // a panic inside the rule (a bug) poisons nothing a caller relies on:
        // each call leaves the tier consistent or panics before changing it
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn tier_error(err: TierError) -> Error {
    match err {
        TierError::NoSuchSlot { .. } => Error::argument(err.to_string()),
        TierError::NotLoading { .. } => Error::new(ErrorKind::Stale, err.to_string()),
    }
}

/// Makes a device tier of `slots` device slots (0: a tier that never
/// promotes) for a model of `n_layers` × `n_experts` routed experts.
///
/// # Returns
/// - `SMOE_OK`: `*out` holds the tier; free it with `smoe_tier_free`.
/// - `SMOE_ERR_ARGUMENT`: `out` is NULL, `n_layers` or `n_experts` is 0, or
///   `n_layers × n_experts` or `slots` is over 1,048,576 (the library's id
///   cap); `*out` is not written.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `out` is either NULL or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn smoe_tier_new(
    slots: u32,
    n_layers: u32,
    n_experts: u32,
    out: *mut *mut smoe_tier,
) -> smoe_status {
    ffi_status("smoe_tier_new", || {
        let out = try_out(out, "out")?;
        let ids = u64::from(n_layers) * u64::from(n_experts);
        if ids == 0 || ids > MAX_EXPERT_IDS || u64::from(slots) > MAX_EXPERT_IDS {
            return Err(Error::argument(format!(
                "a tier of {slots} slots over {n_layers} layers × {n_experts} experts: \
                 both counts must be at least 1, and the experts and the slots at most {MAX_EXPERT_IDS}"
            )));
        }
        let tier = Box::new(smoe_tier {
            inner: Mutex::new(DeviceTier::new(slots)),
            n_layers,
            n_experts,
        });
        // SAFETY: `out` is non-NULL and the caller guarantees it writable.
        unsafe { out.as_ptr().write(Box::into_raw(tier)) };
        Ok(smoe_status::SMOE_OK)
    })
}

/// Frees a tier made by `smoe_tier_new`. NULL is a no-op. The host's device
/// memory is its own: nothing of it is touched.
///
/// # Safety
/// `t` is NULL or a tier from `smoe_tier_new`, not freed before and used by
/// no other call during or after this one.
#[no_mangle]
pub unsafe extern "C" fn smoe_tier_free(t: *mut smoe_tier) {
    ffi_guard("smoe_tier_free", || {
        if !t.is_null() {
            // SAFETY: the caller guarantees `t` came from `Box::into_raw` in
            // `smoe_tier_new` and is freed once.
            drop(unsafe { Box::from_raw(t) });
        }
    })
}

/// A use of (`layer`, `expert`) in the decode step in progress. `*slot`
/// receives its device slot when the expert's copy has completed (a hit:
/// the slot is held, never overwritten, until `smoe_tier_step_done`), or -1
/// (compute it from the ring). Counted for admission either way.
///
/// # Returns
/// - `SMOE_OK`: `*slot` written.
/// - `SMOE_ERR_ARGUMENT`: `t` or `slot` is NULL, or the pair is outside the
///   tier's layers and experts; nothing is counted.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `t` is NULL or a live tier; `slot` is NULL or valid for writing an
/// `int32_t`.
#[no_mangle]
pub unsafe extern "C" fn smoe_tier_lookup(
    t: *const smoe_tier,
    layer: u32,
    expert: u32,
    slot: *mut i32,
) -> smoe_status {
    ffi_status("smoe_tier_lookup", || {
        // SAFETY: the caller guarantees `t` is NULL or a live tier.
        let t = unsafe { try_ref(t, "t") }?;
        let out = try_out(slot, "slot")?;
        let key = t.key(layer, expert)?;
        let found = t.rule().lookup(key).map_or(-1, |s| s as i32);
        // SAFETY: `out` is non-NULL and the caller guarantees it writable.
        unsafe { out.as_ptr().write(found) };
        Ok(smoe_status::SMOE_OK)
    })
}

/// Whether (`layer`, `expert`), just computed from the ring, earns a device
/// slot: an empty one, or the slot of the unheld ready expert with the
/// fewest uses when this expert has more. `*out` says which slot to copy it
/// into and what that evicts, or `slot` -1 (already there or loading, no
/// slot free of the step, or not used more than the victim). Keep the
/// expert's ring slot claimed until the copy is done.
///
/// # Returns
/// - `SMOE_OK`: `*out` written.
/// - `SMOE_ERR_ARGUMENT`: `t` or `out` is NULL, or the pair is outside the
///   tier; nothing changes.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `t` is NULL or a live tier; `out` is NULL or valid for writing one
/// `smoe_tier_promotion`.
#[no_mangle]
pub unsafe extern "C" fn smoe_tier_admit(
    t: *const smoe_tier,
    layer: u32,
    expert: u32,
    out: *mut smoe_tier_promotion,
) -> smoe_status {
    ffi_status("smoe_tier_admit", || {
        // SAFETY: the caller guarantees `t` is NULL or a live tier.
        let t = unsafe { try_ref(t, "t") }?;
        let out = try_out(out, "out")?;
        let key = t.key(layer, expert)?;
        let mut p = smoe_tier_promotion {
            slot: -1,
            evicted_layer: -1,
            evicted_expert: -1,
        };
        if let Some(promotion) = t.rule().admit(key) {
            // (ids and slots are at most MAX_EXPERT_IDS: they fit an i32)
            p.slot = promotion.slot as i32;
            if let Some(old) = promotion.evicted {
                p.evicted_layer = (old / t.n_experts) as i32;
                p.evicted_expert = (old % t.n_experts) as i32;
            }
        }
        // SAFETY: `out` is non-NULL and the caller guarantees it writable.
        unsafe { out.as_ptr().write(p) };
        Ok(smoe_status::SMOE_OK)
    })
}

/// The copy into `slot` has completed (`bytes` copied): its expert is a hit
/// from the next lookup on.
///
/// # Returns
/// - `SMOE_OK`: recorded.
/// - `SMOE_ERR_ARGUMENT`: `t` is NULL or `slot` is not a slot of the tier.
/// - `SMOE_ERR_STALE`: no copy into `slot` is in flight (never admitted,
///   already loaded or failed); nothing changes.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `t` is NULL or a live tier.
#[no_mangle]
pub unsafe extern "C" fn smoe_tier_loaded(
    t: *const smoe_tier,
    slot: u32,
    bytes: u64,
) -> smoe_status {
    ffi_status("smoe_tier_loaded", || {
        // SAFETY: the caller guarantees `t` is NULL or a live tier.
        let t = unsafe { try_ref(t, "t") }?;
        t.rule().loaded(slot, bytes).map_err(tier_error)?;
        Ok(smoe_status::SMOE_OK)
    })
}

/// The copy into `slot` failed or was abandoned: the slot is empty again,
/// and its expert is computed from the ring until admitted again.
///
/// # Returns
/// As `smoe_tier_loaded`.
///
/// # Safety
/// `t` is NULL or a live tier.
#[no_mangle]
pub unsafe extern "C" fn smoe_tier_failed(t: *const smoe_tier, slot: u32) -> smoe_status {
    ffi_status("smoe_tier_failed", || {
        // SAFETY: the caller guarantees `t` is NULL or a live tier.
        let t = unsafe { try_ref(t, "t") }?;
        t.rule().failed(slot).map_err(tier_error)?;
        Ok(smoe_status::SMOE_OK)
    })
}

/// The decode step's graph has finished reading its device slots: they may
/// be evicted from now on.
///
/// # Returns
/// - `SMOE_OK`: done.
/// - `SMOE_ERR_ARGUMENT`: `t` is NULL.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `t` is NULL or a live tier.
#[no_mangle]
pub unsafe extern "C" fn smoe_tier_step_done(t: *const smoe_tier) -> smoe_status {
    ffi_status("smoe_tier_step_done", || {
        // SAFETY: the caller guarantees `t` is NULL or a live tier.
        let t = unsafe { try_ref(t, "t") }?;
        t.rule().step_done();
        Ok(smoe_status::SMOE_OK)
    })
}

/// Fills `*out` with the tier's counters. The caller sets
/// `out->struct_size` to `sizeof(smoe_tier_stats)`; the library writes
/// min(`out->struct_size`, its own size) bytes and sets `out->struct_size`
/// to that count.
///
/// # Returns
/// - `SMOE_OK`: written.
/// - `SMOE_ERR_ARGUMENT`: `t` or `out` is NULL, or `out->struct_size` is
///   smaller than this first version or ends inside a field; nothing is
///   written.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `t` is NULL or a live tier; `out` is NULL or valid for reading its
/// `struct_size` and writing that many bytes.
#[no_mangle]
pub unsafe extern "C" fn smoe_tier_get_stats(
    t: *const smoe_tier,
    out: *mut smoe_tier_stats,
) -> smoe_status {
    ffi_status("smoe_tier_get_stats", || {
        // SAFETY: the caller guarantees `t` is NULL or a live tier.
        let t = unsafe { try_ref(t, "t") }?;
        let out: NonNull<smoe_tier_stats> = try_out(out, "out")?;
        // SAFETY: non-NULL, and the caller guarantees `struct_size` readable.
        let size = unsafe { out.cast::<u32>().as_ptr().read() } as usize;
        // every field after the first is a u64 from offset 8
        if size < TIER_STATS_SIZE || (size - 8) % 8 != 0 {
            return Err(Error::argument(format!(
                "out->struct_size is {size}: smoe_tier_stats is {TIER_STATS_SIZE} bytes, and a \
                 larger size must end on a field of a later version"
            )));
        }
        let s = t.rule().stats();
        let value = smoe_tier_stats {
            struct_size: TIER_STATS_SIZE as u32,
            lookups: s.lookups,
            hits: s.hits,
            promotions: s.promotions,
            failed: s.failed,
            never_used: s.never_used,
            evictions: s.evictions,
            bytes_copied: s.bytes_copied,
        };
        // SAFETY: TIER_STATS_SIZE ≤ struct_size bytes are writable (the
        // caller's contract), and `value` is that size.
        unsafe {
            ptr::copy_nonoverlapping(
                ptr::from_ref(&value).cast::<u8>(),
                out.cast::<u8>().as_ptr(),
                TIER_STATS_SIZE,
            );
        }
        Ok(smoe_status::SMOE_OK)
    })
}
