//! The streamer's exports (docs/c-api.md), in the order the spec lists them. Each
//! converts its arguments, calls the core, and converts the result; see the
//! parent module for the boundary rules every one of them follows.

use std::ffi::{c_char, c_void, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;
use std::time::Duration;

use super::types::{smoe_config, smoe_slot, smoe_stats, smoe_streamer, CONFIG_SIZE_V1};
use super::{
    empty_c_str, ffi_guard, ffi_status, set_last_error, smoe_status, try_c_str, try_out, try_ref,
    try_slice,
};
use crate::{Config, Priority, Streamer};

/// Fills the caller's config of `struct_size` bytes with every default:
/// `ring_slots` 0 (auto), `slot_mb` 0, `workers` 0 (16), `direct_io` 0
/// (auto), `prewarm` 1, `prewarm_slots` 0, `verify` 0, `scout_bytes`
/// `UINT64_MAX`, `engine_overhead_bytes` 0 (2 GiB), `freq_path` NULL.
///
/// `struct_size` is the caller's `sizeof(smoe_config)`; C and C++ pass it
/// through the header's `smoe_config_init(cfg)` macro, Swift (which cannot
/// call a macro) passes `UInt32(MemoryLayout<smoe_config>.size)`. Exactly
/// `struct_size` bytes are written, never more, as zlib's `inflateInit_`
/// takes the caller's `sizeof(z_stream)`: a program built against an older,
/// smaller `smoe_config` never has its struct overrun. Fields this library
/// knows within those bytes take their defaults; bytes past this library's
/// `smoe_config` (fields of a newer header) are zeroed, which `smoe_open`
/// reads as "not set"; `cfg->struct_size` becomes `struct_size`.
///
/// # Returns
/// - `SMOE_OK`: written.
/// - `SMOE_ERR_ARGUMENT`: `cfg` is NULL, or `struct_size` is smaller than
///   the v1 `smoe_config` (56 bytes on 64-bit targets), larger than 4096, or
///   ends inside a field; nothing is written.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `cfg` is either NULL or valid for writing `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn smoe_config_init_sized(
    cfg: *mut smoe_config,
    struct_size: u32,
) -> smoe_status {
    ffi_status("smoe_config_init_sized", || {
        let cfg = try_out(cfg, "cfg")?;
        // SAFETY: non-NULL, and the caller guarantees `struct_size` writable
        // bytes.
        unsafe { smoe_config::init_sized(cfg, struct_size) }?;
        Ok(smoe_status::SMOE_OK)
    })
}

/// The config initializer of ABI v1, kept for programs built against a
/// header without `smoe_config_init_sized`: it writes the v1 `smoe_config`
/// (56 bytes on 64-bit targets), the only size such a program can have,
/// and never more, whatever this library's `sizeof(smoe_config)`.
///
/// In C and C++ `smoe_config_init(cfg)` is a macro defined after this
/// declaration, which calls `smoe_config_init_sized` with the caller's
/// `sizeof(smoe_config)`; only a call that bypasses the macro, such as
/// `(smoe_config_init)(cfg)`, Swift or `dlsym`, reaches this function.
///
/// # Returns
/// Nothing. A NULL `cfg` is a no-op that records "cfg is NULL" for
/// `smoe_last_error()`.
///
/// # Safety
/// `cfg` is either NULL or valid for writing the v1 `smoe_config`.
#[deprecated(
    note = "writes only the v1 smoe_config; call smoe_config_init_sized(cfg, sizeof(smoe_config))"
)]
#[no_mangle]
pub unsafe extern "C" fn smoe_config_init(cfg: *mut smoe_config) {
    ffi_guard("smoe_config_init", || {
        let result = try_out(cfg, "cfg").and_then(|cfg| {
            // SAFETY: non-NULL, and the caller guarantees a v1 struct's
            // bytes are writable.
            unsafe { smoe_config::init_sized(cfg, CONFIG_SIZE_V1 as u32) }
        });
        if let Err(err) = result {
            set_last_error(&err);
        }
    })
}

/// Opens the vault at `vault_path` (its directory or its `experts.smoe`),
/// allocates the ring and starts the I/O workers.
///
/// `cfg` follows the extensible-struct rule: `struct_size` smaller than the
/// v1 `smoe_config`, larger than 4096 or ending inside a field is an error
/// (a pointer field cut in two is never read); bytes past the struct
/// this library knows must be zero. A NULL `cfg` means all defaults.
///
/// # Returns
/// - `SMOE_OK`: `*out` holds a new streamer; free it with `smoe_close`.
/// - `SMOE_ERR_ARGUMENT`: `vault_path` or `out` is NULL, a bad
///   `cfg->struct_size`, a field out of range (`direct_io` not 0..=2,
///   `prewarm` or `verify` not 0/1, `workers` over 64, a `slot_mb` smaller
///   than a blob); the message names the field and its value. Also: the
///   vault file is not a regular file (a FIFO, device, socket or
///   directory); it is never opened, so `smoe_open` does not block on it.
/// - `SMOE_ERR_IO`: the vault could not be opened or read.
/// - `SMOE_ERR_FORMAT`: the vault is invalid.
/// - `SMOE_ERR_NO_MEMORY`: the ring could not be allocated, or (a model
///   opened in place) its headers need more memory than the process may
///   have; the message names the file.
/// - `SMOE_ERR_UNSUPPORTED`: `direct_io` is 1 (require) and the filesystem
///   refuses direct I/O.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic), or a worker could not start.
///
/// On any error `*out` is not written.
///
/// # Safety
/// `vault_path` is either NULL or a valid NUL-terminated string (any bytes:
/// it is a path). `cfg` is either NULL or valid for reading
/// `cfg->struct_size` bytes, and its `freq_path` is NULL or a valid
/// NUL-terminated string; both are only read during the call. `out` is
/// either NULL or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn smoe_open(
    vault_path: *const c_char,
    cfg: *const smoe_config,
    out: *mut *mut smoe_streamer,
) -> smoe_status {
    ffi_status("smoe_open", || {
        // SAFETY: the caller guarantees `vault_path` is NULL or a C string.
        let path = unsafe { try_c_str(vault_path, "vault_path") }?;
        let out = try_out(out, "out")?;
        let config = match NonNull::new(cfg.cast_mut()) {
            None => Config::default(),
            // SAFETY: non-NULL, and the caller guarantees `struct_size`
            // readable bytes and a valid `freq_path`.
            Some(cfg) => unsafe { smoe_config::read(cfg) }?,
        };
        let streamer = Streamer::open(Path::new(OsStr::from_bytes(path.to_bytes())), config)?;
        let handle = Box::into_raw(Box::new(smoe_streamer::new(streamer)));
        // SAFETY: non-NULL, and the caller guarantees it is writable.
        unsafe { out.as_ptr().write(handle) };
        Ok(smoe_status::SMOE_OK)
    })
}

/// Stops the I/O workers (waiting for reads in flight), frees the ring and
/// the streamer. Every `data` pointer, ticket and `smoe_vault_metadata`
/// string of this streamer is invalid afterwards.
///
/// # Returns
/// Nothing. A NULL `s` is a no-op.
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet
/// closed, and no other call on it is running or will be made.
#[no_mangle]
pub unsafe extern "C" fn smoe_close(s: *mut smoe_streamer) {
    ffi_guard("smoe_close", || {
        if !s.is_null() {
            // SAFETY: `s` came from `Box::into_raw(Box<smoe_streamer>)` in
            // `smoe_open` (the caller guarantees it), is freed only here, and
            // nothing else uses it any more.
            drop(unsafe { Box::from_raw(s) });
        }
    })
}

/// Makes sure (`layer`, `expert`) is resident or on its way: queues its read
/// (demand, or speculative if `speculative`) into a free or least recently
/// used idle slot. Never waits for I/O; an expert already resident or in
/// flight costs no read and no second slot.
///
/// # Returns
/// - `SMOE_OK`: resident, in flight, or queued now.
/// - `SMOE_ERR_ARGUMENT`: `s` is NULL.
/// - `SMOE_ERR_NOT_FOUND`: (`layer`, `expert`) is not in the vault.
/// - `SMOE_ERR_RING_FULL`: every slot is claimed or loading.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic, here or in a worker).
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet closed.
#[no_mangle]
pub unsafe extern "C" fn smoe_prefetch(
    s: *mut smoe_streamer,
    layer: u32,
    expert: u32,
    speculative: bool,
) -> smoe_status {
    ffi_status("smoe_prefetch", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        let s = unsafe { try_ref(s.cast_const(), "s") }?;
        let priority = if speculative {
            Priority::Speculative
        } else {
            Priority::Demand
        };
        s.inner.prefetch(layer, expert, priority)?;
        Ok(smoe_status::SMOE_OK)
    })
}

/// Claims (`layer`, `expert`) if its data is in the ring. Never blocks: if
/// it is not, queues a demand read (unless one is in flight) and answers
/// `SMOE_PENDING`, so a polling loop always ends. Release an OK claim once
/// with `smoe_release`.
///
/// # Returns
/// - `SMOE_OK`: `*out` describes the claimed slot.
/// - `SMOE_PENDING`: not resident yet, its read is queued; `*out` untouched.
/// - `SMOE_ERR_ARGUMENT`: `s` or `out` is NULL, or the expert already holds
///   the most unreleased claims a slot can count.
/// - `SMOE_ERR_NOT_FOUND`: (`layer`, `expert`) is not in the vault.
/// - `SMOE_ERR_IO` / `SMOE_ERR_FORMAT`: its last read failed / failed its
///   checksum (reported once; a later prefetch or claim retries).
/// - `SMOE_ERR_RING_FULL`: not resident and every slot is claimed or loading.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic, here or in a worker).
///
/// Only `SMOE_OK` writes `*out`.
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet
/// closed; `out` is either NULL or valid for writing one `smoe_slot`.
#[no_mangle]
pub unsafe extern "C" fn smoe_claim(
    s: *mut smoe_streamer,
    layer: u32,
    expert: u32,
    out: *mut smoe_slot,
) -> smoe_status {
    ffi_status("smoe_claim", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        let s = unsafe { try_ref(s.cast_const(), "s") }?;
        let out = try_out(out, "out")?;
        let claimed = s.inner.claim_ticket(layer, expert)?;
        // SAFETY: `out` is non-NULL and the caller guarantees it is writable.
        Ok(unsafe { write_claim(out, claimed) })
    })
}

/// `smoe_claim`, waiting up to `timeout_ns` nanoseconds for the read: it
/// spins briefly, polls (yielding its core) until 500 µs after the call,
/// then sleeps until a worker finishes a read, using no CPU while it
/// sleeps.
///
/// # Returns
/// As `smoe_claim`; `SMOE_PENDING` when the timeout passes first (a
/// `timeout_ns` of 0 tries exactly once). Only `SMOE_OK` writes `*out`.
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet
/// closed; `out` is either NULL or valid for writing one `smoe_slot`.
#[no_mangle]
pub unsafe extern "C" fn smoe_claim_wait(
    s: *mut smoe_streamer,
    layer: u32,
    expert: u32,
    timeout_ns: u64,
    out: *mut smoe_slot,
) -> smoe_status {
    ffi_status("smoe_claim_wait", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        let s = unsafe { try_ref(s.cast_const(), "s") }?;
        let out = try_out(out, "out")?;
        let timeout = Duration::from_nanos(timeout_ns);
        let claimed = s.inner.claim_wait_ticket(layer, expert, timeout)?;
        // SAFETY: `out` is non-NULL and the caller guarantees it is writable.
        Ok(unsafe { write_claim(out, claimed) })
    })
}

/// Queues the reads of a layer's working set, in the order given
/// (docs/c-api.md "Working sets"): a member already resident or in
/// flight costs nothing and takes no slot, and loads queued for earlier
/// members are never evicted for later ones while they wait unclaimed.
/// Never waits. Duplicates are allowed.
///
/// # Returns
/// - `SMOE_OK`: every member is resident or in flight now, or holds the
///   error of its failed read for its next claim (as `smoe_prefetch`
///   answers it); also for `n` 0.
/// - `SMOE_ERR_RING_FULL`: the ring could not take the rest (every slot is
///   held or loading): they are not queued; `smoe_claim_any` queues them as
///   slots free up.
/// - `SMOE_ERR_ARGUMENT`: `s` is NULL, or `experts` is NULL with `n` > 0.
/// - `SMOE_ERR_NOT_FOUND`: `layer` (for `n` 0 too) or a member is not in
///   the vault (the message names it); nothing is queued.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic, here or in a worker).
///
/// `*queued` (if `queued` is not NULL) receives, with `SMOE_OK` and
/// `SMOE_ERR_RING_FULL`, how many members (duplicates counted) are now
/// resident or in flight; it is not written otherwise.
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet
/// closed; `experts` is either NULL or valid for reading `n` values;
/// `queued` is either NULL or valid for writing one `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn smoe_prefetch_set(
    s: *mut smoe_streamer,
    layer: u32,
    experts: *const u32,
    n: u32,
    speculative: bool,
    queued: *mut u32,
) -> smoe_status {
    ffi_status("smoe_prefetch_set", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        let s = unsafe { try_ref(s.cast_const(), "s") }?;
        // SAFETY: the caller guarantees `experts` holds `n` values.
        let set = unsafe { try_slice(experts, n, "experts") }?;
        let priority = if speculative {
            Priority::Speculative
        } else {
            Priority::Demand
        };
        let present = s.inner.prefetch_set(layer, set, priority)?;
        if let Some(queued) = NonNull::new(queued) {
            // SAFETY: non-NULL, and the caller guarantees it is writable.
            unsafe { queued.as_ptr().write(present) };
        }
        if present < n {
            return Err(crate::Error::new(
                crate::ErrorKind::RingFull,
                format!(
                    "layer {layer}: the ring took {present} of the set's {n} experts; every \
                     other slot is claimed or loading: smoe_claim_any queues the rest as slots \
                     free up"
                ),
            ));
        }
        Ok(smoe_status::SMOE_OK)
    })
}

/// Claims one member of a layer's working set (docs/c-api.md "Working
/// sets"): one that is resident now if any (a retained hit or a finished
/// load, in the set's order), else the first whose read completes, waiting
/// at most `timeout_ns` nanoseconds (0: never wait). Members neither
/// resident nor in flight get demand reads as slots free up; a read in
/// flight is marked demand. `out->expert` says which member was claimed:
/// remove it from the set before the next call. Release the claim with
/// `smoe_release`.
///
/// # Returns
/// - `SMOE_OK`: `*out` holds the claim.
/// - `SMOE_PENDING`: the timeout passed first.
/// - `SMOE_ERR_RING_FULL`: at once, when no member is resident or in flight
///   and every active slot is held: release a claim first (waiting would
///   never end).
/// - `SMOE_ERR_IO` / `SMOE_ERR_FORMAT`: a member's read failed / failed its
///   checksum; `out->layer` and `out->expert` name that member (the rest
///   of `*out` is zero), and the error is reported once.
/// - `SMOE_ERR_ARGUMENT`: `s` or `out` is NULL, `n` is 0, or `experts` is
///   NULL; or every member that could be claimed already holds the most
///   claims its slot counts (a member at that limit is passed over while
///   another can be claimed).
/// - `SMOE_ERR_NOT_FOUND`: `layer` or a member is not in the vault (the
///   message names it). Every member is checked before any is claimed:
///   nothing is claimed or queued then.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic, here or in a worker).
///
/// Only `SMOE_OK` and a member's failed read write `*out`.
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet
/// closed; `experts` is either NULL or valid for reading `n` values; `out`
/// is either NULL or valid for writing one `smoe_slot`.
#[no_mangle]
pub unsafe extern "C" fn smoe_claim_any(
    s: *mut smoe_streamer,
    layer: u32,
    experts: *const u32,
    n: u32,
    timeout_ns: u64,
    out: *mut smoe_slot,
) -> smoe_status {
    ffi_status("smoe_claim_any", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        let s = unsafe { try_ref(s.cast_const(), "s") }?;
        let out = try_out(out, "out")?;
        // SAFETY: the caller guarantees `experts` holds `n` values.
        let set = unsafe { try_slice(experts, n, "experts") }?;
        let timeout = Duration::from_nanos(timeout_ns);
        match s.inner.claim_any_ticket(layer, set, timeout) {
            // SAFETY: `out` is non-NULL and the caller guarantees it is writable.
            Ok(claimed) => Ok(unsafe { write_claim(out, claimed) }),
            Err(err) => {
                if let (Some((layer, expert)), true) = (
                    err.layer_expert(),
                    matches!(err.kind(), crate::ErrorKind::Io | crate::ErrorKind::Format),
                ) {
                    let failed = smoe_slot {
                        data: std::ptr::null(),
                        size: 0,
                        ticket: 0,
                        slot_index: 0,
                        layer,
                        expert,
                        hit: false,
                    };
                    // SAFETY: `out` is non-NULL and the caller guarantees it
                    // is writable.
                    unsafe { out.as_ptr().write(failed) };
                }
                Err(err)
            }
        }
    })
}

/// Writes a claim to `out` (OK) or nothing (PENDING).
///
/// # Safety
/// `out` is valid for writing one `smoe_slot`.
unsafe fn write_claim(out: NonNull<smoe_slot>, claimed: Option<crate::SlotInfo>) -> smoe_status {
    match claimed {
        Some(info) => {
            // SAFETY: guaranteed by this function's caller.
            unsafe { out.as_ptr().write(info.into()) };
            smoe_status::SMOE_OK
        }
        None => smoe_status::SMOE_PENDING,
    }
}

/// Releases the claim `slot` describes (by its `ticket`): after this its
/// `data` may be overwritten. The slot keeps its data for later claims until
/// it is evicted.
///
/// # Returns
/// - `SMOE_OK`: released.
/// - `SMOE_ERR_ARGUMENT`: `s` or `slot` is NULL.
/// - `SMOE_ERR_STALE`: the ticket is not held (never claimed, already
///   released, or its slot was evicted and reloaded); nothing changes. A
///   second release while another claim with an equal ticket is held
///   cannot be told from that claim's: it returns `SMOE_OK` and drops that
///   claim's count (docs/c-api.md, "Claims").
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet
/// closed; `slot` is either NULL or valid for reading one `smoe_slot`.
#[no_mangle]
pub unsafe extern "C" fn smoe_release(
    s: *mut smoe_streamer,
    slot: *const smoe_slot,
) -> smoe_status {
    ffi_status("smoe_release", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        let s = unsafe { try_ref(s.cast_const(), "s") }?;
        // SAFETY: the caller guarantees `slot` is NULL or readable.
        let slot = unsafe { try_ref(slot, "slot") }?;
        s.inner.release_ticket(slot.ticket)?;
        Ok(smoe_status::SMOE_OK)
    })
}

/// Tells the pre-warm thread the engine is `busy` (`true`: stop issuing
/// reads; once this returns, at most the one read already issued may start)
/// or idle (`false`: resume, re-warming what requests evicted meanwhile).
///
/// # Returns
/// Nothing. A NULL `s` is a no-op that records "s is NULL" for
/// `smoe_last_error()`.
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet closed.
#[no_mangle]
pub unsafe extern "C" fn smoe_prewarm_pause(s: *mut smoe_streamer, busy: bool) {
    ffi_guard("smoe_prewarm_pause", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        if let Err(err) = unsafe { try_ref(s.cast_const(), "s") } {
            set_last_error(&err);
            return;
        }
        // SAFETY: checked non-NULL above; the caller guarantees it is live.
        if let Some(s) = unsafe { s.as_ref() } {
            s.inner.prewarm_pause(busy);
        }
    })
}

/// Persists the claim histogram now, atomically (temporary file, fsync,
/// rename, directory fsync). It is also persisted by `smoe_close`.
///
/// # Returns
/// - `SMOE_OK`: written, or persistence is off (`freq_path = ""`, a
///   read-only vault directory, or a file at the path at open that is not
///   this vault's histogram, which is never replaced: see `smoe_warnings`).
/// - `SMOE_ERR_IO`: the file could not be written (path and OS error in
///   `smoe_last_error()`), or a file that is not this vault's histogram was
///   put at the path after `smoe_open`: it is kept, nothing is written, and
///   `smoe_last_error()` names it and what it is.
/// - `SMOE_ERR_ARGUMENT`: `s` is NULL.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet closed.
#[no_mangle]
pub unsafe extern "C" fn smoe_flush_stats(s: *mut smoe_streamer) -> smoe_status {
    ffi_status("smoe_flush_stats", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        let s = unsafe { try_ref(s.cast_const(), "s") }?;
        s.inner.flush_stats()?;
        Ok(smoe_status::SMOE_OK)
    })
}

/// Fills `*out` with the streamer's counters and sizes. The caller sets
/// `out->struct_size` to `sizeof(smoe_stats)`; the library writes
/// min(`out->struct_size`, its own `sizeof(smoe_stats)`) bytes, never more,
/// and sets `out->struct_size` to that count. Counters are read one by one
/// (each exact, not a snapshot of all at one instant).
///
/// # Returns
/// - `SMOE_OK`: written.
/// - `SMOE_ERR_ARGUMENT`: `s` or `out` is NULL, or `out->struct_size` is
///   smaller than the v1 `smoe_stats` or ends inside a field; nothing is
///   written.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet
/// closed; `out` is either NULL or valid for reading its `struct_size` field
/// and for writing `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn smoe_get_stats(
    s: *const smoe_streamer,
    out: *mut smoe_stats,
) -> smoe_status {
    ffi_status("smoe_get_stats", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        let s = unsafe { try_ref(s, "s") }?;
        let out = try_out(out, "out")?;
        // SAFETY: non-NULL, and the caller guarantees `struct_size` is
        // readable and that many bytes writable.
        unsafe { smoe_stats::write(out, &s.inner.stats()) }?;
        Ok(smoe_status::SMOE_OK)
    })
}

/// The ring, for registering it once with a GPU API: its base (16384-byte
/// aligned), its total bytes, and the bytes per slot (slot `i` starts at
/// `base + i × slot_bytes`). Valid until `smoe_close`.
///
/// # Returns
/// - `SMOE_OK`: `*base`, `*bytes` and `*slot_bytes` written.
/// - `SMOE_ERR_ARGUMENT`: `s`, `base`, `bytes` or `slot_bytes` is NULL (all
///   three out-params are required); nothing is written.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet
/// closed; each of `base`, `bytes`, `slot_bytes` is either NULL or valid for
/// writing its type.
#[no_mangle]
pub unsafe extern "C" fn smoe_ring_region(
    s: *const smoe_streamer,
    base: *mut *mut c_void,
    bytes: *mut u64,
    slot_bytes: *mut u64,
) -> smoe_status {
    ffi_status("smoe_ring_region", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        let s = unsafe { try_ref(s, "s") }?;
        let (base, bytes, slot_bytes) = (
            try_out(base, "base")?,
            try_out(bytes, "bytes")?,
            try_out(slot_bytes, "slot_bytes")?,
        );
        let (ring, ring_bytes, ring_slot_bytes) = s.inner.ring_region();
        // SAFETY: all three are non-NULL and the caller guarantees each is
        // writable.
        unsafe {
            base.as_ptr().write(ring.cast_mut().cast::<c_void>());
            bytes.as_ptr().write(ring_bytes);
            slot_bytes.as_ptr().write(ring_slot_bytes);
        }
        Ok(smoe_status::SMOE_OK)
    })
}

/// Where (`layer`, `expert`) lives in the vault: its payload `size`, its
/// `padded_size` (the bytes a read covers) and its byte `offset` in
/// `experts.smoe`.
///
/// # Returns
/// - `SMOE_OK`: `*size`, `*padded_size` and `*offset` written.
/// - `SMOE_ERR_ARGUMENT`: `s`, `size`, `padded_size` or `offset` is NULL
///   (all three out-params are required); nothing is written.
/// - `SMOE_ERR_NOT_FOUND`: (`layer`, `expert`) is not in the vault.
/// - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet
/// closed; each of `size`, `padded_size`, `offset` is either NULL or valid
/// for writing a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn smoe_expert_info(
    s: *const smoe_streamer,
    layer: u32,
    expert: u32,
    size: *mut u64,
    padded_size: *mut u64,
    offset: *mut u64,
) -> smoe_status {
    ffi_status("smoe_expert_info", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        let s = unsafe { try_ref(s, "s") }?;
        let (size, padded_size, offset) = (
            try_out(size, "size")?,
            try_out(padded_size, "padded_size")?,
            try_out(offset, "offset")?,
        );
        let entry = s.inner.expert_info(layer, expert)?;
        // SAFETY: all three are non-NULL and the caller guarantees each is
        // writable.
        unsafe {
            size.as_ptr().write(entry.size);
            padded_size.as_ptr().write(entry.padded_size);
            offset.as_ptr().write(entry.offset);
        }
        Ok(smoe_status::SMOE_OK)
    })
}

/// The vault's metadata: a JSON object, as written by the converter.
///
/// It is all of it, byte for byte: `smoe_open` refuses (`SMOE_ERR_FORMAT`) a
/// vault whose metadata is not UTF-8, holds a NUL byte or is over 64 MiB, so
/// the string is never cut short. It is the streamer's only copy.
///
/// # Returns
/// A NUL-terminated string, never NULL, owned by the streamer: `""` if the
/// vault has no metadata, or if `s` is NULL (which also records "s is NULL"
/// for `smoe_last_error()`). It stays valid until `smoe_close(s)`.
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet
/// closed. From Rust the `'static` lifetime is a lie: the reference must not
/// be used after `smoe_close(s)`.
#[no_mangle]
pub unsafe extern "C" fn smoe_vault_metadata(s: *const smoe_streamer) -> &'static c_char {
    ffi_guard("smoe_vault_metadata", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        match unsafe { try_ref(s, "s") } {
            // SAFETY: the vault's metadata is a `CString` owned by the
            // streamer, never changed after `smoe_open` and freed only by
            // `smoe_close`; the caller promises not to use the reference
            // after that.
            Ok(s) => unsafe { &*s.inner.vault().meta_c().as_ptr() },
            Err(err) => {
                set_last_error(&err);
                empty_c_str()
            }
        }
    })
}

/// The warnings recorded at `smoe_open`, one per line: the fallback from
/// direct to buffered I/O, a histogram file that was missing or ignored (and
/// why), persistence disabled by a read-only directory.
///
/// # Returns
/// A NUL-terminated string, never NULL, owned by the streamer: `""` if there
/// are none, or if `s` is NULL (which also records "s is NULL" for
/// `smoe_last_error()`). It stays valid until `smoe_close(s)`.
///
/// # Safety
/// `s` is either NULL or a pointer returned by `smoe_open` and not yet
/// closed. From Rust the `'static` lifetime is a lie: the reference must not
/// be used after `smoe_close(s)`.
#[no_mangle]
pub unsafe extern "C" fn smoe_warnings(s: *const smoe_streamer) -> &'static c_char {
    ffi_guard("smoe_warnings", || {
        // SAFETY: the caller guarantees `s` is NULL or a live streamer.
        match unsafe { try_ref(s, "s") } {
            // SAFETY: `warnings` is a `CString` owned by the streamer, never
            // changed after `smoe_open` and freed only by `smoe_close`.
            Ok(s) => unsafe { &*s.warnings.as_ptr() },
            Err(err) => {
                set_last_error(&err);
                empty_c_str()
            }
        }
    })
}
