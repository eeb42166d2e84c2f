//! The C structs of docs/c-api.md and their conversions to and from the core's
//! types. Nothing here decides anything: defaults come from
//! [`Config::default`], limits from the core, except the checks that only
//! exist because C can pass any bit pattern (an enum-like `uint32_t`, a
//! `struct_size`).
//!
//! # One schema
//!
//! `smoe_config` and `smoe_stats` are written out here because cbindgen
//! reads them (it does not expand macros); the Rust side of their fields is
//! declared once, in `src/config.rs`. The conversions below are
//! generated from that schema field by field: each C field converts through
//! its Rust type's [`CValue`], struct literals name every field of both
//! sides, and a constant check keeps the C fields in the schema's order, so
//! the two declarations cannot drift apart and still compile.
//!
//! # Extensible structs
//!
//! `smoe_config` and `smoe_stats` start with `uint32_t struct_size` and follow
//! the Linux kernel's `copy_struct_from_user` rule (as `openat2`/`clone3`
//! do): a caller built against an older header passes a smaller struct, a
//! newer one a larger struct. Smaller than v1 is an error; for a config,
//! bytes past what this library knows must be zero (a newer caller that set a
//! field this library cannot honour must hear so), and fields past the
//! caller's size keep their defaults; for stats, only the bytes both sides
//! know are written.

use std::ffi::{c_char, CStr, CString, OsStr};
use std::mem::{size_of, MaybeUninit};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::ptr::{self, NonNull};

use crate::{Config, DirectIo, Error, Policy, Populate, SlotInfo, Stats, Streamer};

/// Streamer settings for `smoe_open`. Initialize with `smoe_config_init`,
/// then change fields; a `NULL` config means all defaults.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct smoe_config {
    /// `sizeof(smoe_config)`; `smoe_config_init` sets it.
    pub struct_size: u32,
    /// Number of slots; 0 = auto.
    pub ring_slots: u32,
    /// Slot size in MiB (`slot_mb × 1048576` bytes); 0 = the largest padded
    /// blob rounded up to 16384 bytes.
    pub slot_mb: u32,
    /// I/O worker threads, 1..=64; 0 = 16.
    pub workers: u32,
    /// 0 auto (fall back to buffered, with a warning), 1 require, 2 off.
    pub direct_io: u32,
    /// 1 on (default), 0 off: the pre-warm thread (docs/c-api.md).
    pub prewarm: u32,
    /// Pre-warm budget in slots; 0 = slots − max(128, slots/4).
    pub prewarm_slots: u32,
    /// 1 = check each blob's xxh3 after reading; default 0.
    pub verify: u32,
    /// Bytes of dense weights the engine keeps resident; `UINT64_MAX` = size
    /// of the vault's `scout.*` files (default).
    pub scout_bytes: u64,
    /// Memory the engine needs besides the ring and the scout; 0 = 2 GiB.
    pub engine_overhead_bytes: u64,
    /// Histogram file: `NULL` = `<vault>/expert_freq.bin`; `""` = do not
    /// persist. Any bytes (a path); read during `smoe_open` only. A file
    /// there that is not this vault's histogram (or is the vault file, a
    /// device, FIFO, socket or directory) is never replaced: persistence is
    /// then off until `smoe_close`, with a warning.
    pub freq_path: *const c_char,
    /// Added after version 1: routing-trace capture. `NULL` or `""` = off.
    /// Otherwise every OK claim is recorded, and at `smoe_close` the
    /// claims are written to this file as a routing trace (docs/format.md
    /// §5.3), replaced atomically: header `token,layer,r0,...,rK-1` (K = the
    /// most experts any row has), one row per (token, layer) with that
    /// layer's experts in claim order, each once; a shorter row leaves its
    /// trailing fields empty. Token boundary: a claim of the same layer as
    /// the previous claim continues its row, a higher layer starts the next
    /// row of the same token, a lower layer starts the next token (tokens
    /// count from 0), so the engine must claim a token's layers in
    /// ascending order. Claims from several threads are recorded in the
    /// order they complete. Only a missing file or one whose first line is
    /// a trace header is replaced; anything else there (another file, the
    /// vault or histogram file, a device, FIFO or directory) turns capture
    /// off, with a warning. Up to 16777216 claims are recorded (4 bytes
    /// each); later ones are counted in `smoe_stats.trace_dropped`. Read
    /// during `smoe_open` only.
    pub trace_path: *const c_char,
    /// Added after version 1: the eviction policy, `SMOE_POLICY_LRU` (0,
    /// the default: least recently used first) or `SMOE_POLICY_ADAPTIVE` (1:
    /// layer-aware, for rings smaller than a decode step's working set;
    /// docs/c-api.md, "Eviction"). Any other value fails `smoe_open` with
    /// `SMOE_ERR_ARGUMENT`.
    pub policy: u32,
    /// Added after version 1: when the ring's pages are committed.
    /// `SMOE_POPULATE_OFF` (0, the default): as slots are first loaded;
    /// `SMOE_POPULATE_BACKGROUND` (1): a thread pre-faults them slot by
    /// slot after open (contents unchanged); `SMOE_POPULATE_OPEN` (2):
    /// `smoe_open` pre-faults them before it returns, with several threads,
    /// so that no load pays for a first touch. An elastic ring stops at its
    /// high watermark. Any other value fails `smoe_open` with
    /// `SMOE_ERR_ARGUMENT`.
    pub populate: u32,
    /// Added after version 1: 1 = lock the ring in memory (`mlock`: every
    /// page committed at open, never swapped); default 0. When the OS
    /// refuses (`RLIMIT_MEMLOCK`, privilege), `smoe_open` fails with
    /// `SMOE_ERR_NO_MEMORY` or `SMOE_ERR_UNSUPPORTED` and the OS error in
    /// the message. A locked ring is not elastic.
    pub lock: u32,
    /// Added after version 1: 1 (default) = elastic ring: idle slots are
    /// taken offline and their pages released while memory is short (the
    /// cgroup's limit, the system's available memory), and given back when
    /// it is not (docs/c-api.md, "Elastic ring"); 0 = a fixed ring. Ignored
    /// when `lock` or `pinned` is 1.
    pub elastic: u32,
    /// Added after version 1: 1 = the host pins the ring for a device
    /// (`cudaHostRegister` over `smoe_ring_region`, or any driver that pins
    /// user memory for DMA); default 0. A pinned ring is not elastic
    /// (pinned pages cannot be given back, and a slot released and loaded
    /// again would leave the device reading the old pages) and is
    /// populated: in the background as with `populate` = 1, or during
    /// `smoe_open` with `populate` = 2 (docs/c-api.md, "CUDA hosts").
    /// A ring whose pages are all committed (`pinned`, `lock`, or
    /// `populate` with `elastic` 0) must fit in 7/8 of the memory that
    /// can be committed, else `smoe_open` fails with `SMOE_ERR_NO_MEMORY`
    /// saying how many slots fit; sized automatically, it takes its budget
    /// (docs/c-api.md, "Ring sizing").
    pub pinned: u32,
}

/// A claimed expert, filled by `smoe_claim`/`smoe_claim_wait`; pass it to
/// `smoe_release` once.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct smoe_slot {
    /// The payload, 16 KB aligned; valid until this ticket is released.
    pub data: *const u8,
    /// Payload bytes.
    pub size: u64,
    /// Pass to `smoe_release` (through this struct).
    pub ticket: u64,
    /// `data == ring base + slot_index × slot_bytes`.
    pub slot_index: u32,
    /// Layer id.
    pub layer: u32,
    /// Expert id.
    pub expert: u32,
    /// No demand read was needed: data retained from an earlier claim, or
    /// brought in by speculation or pre-warm.
    pub hit: bool,
}

/// Counters and sizes, filled by `smoe_get_stats`. Set `struct_size` to
/// `sizeof(smoe_stats)` before the call; new fields are only ever added at
/// the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct smoe_stats {
    /// Set by the caller to `sizeof(smoe_stats)`; on success the library
    /// sets it to the bytes it wrote (the smaller of the two sizes).
    pub struct_size: u32,
    /// OK claims.
    pub claims: u64,
    /// OK claims with `hit` true; hits/claims is the ring's coverage.
    pub hits: u64,
    /// Claims answered `SMOE_PENDING`.
    pub pending: u64,
    /// Bytes read from the vault.
    pub bytes_read: u64,
    /// Reads done for demand.
    pub reads_demand: u64,
    /// Reads done for speculation.
    pub reads_speculative: u64,
    /// Reads done for pre-warm.
    pub reads_prewarm: u64,
    /// Loads that replaced another expert.
    pub evictions: u64,
    /// Failed or short reads.
    pub io_errors: u64,
    /// Blobs that failed their checksum (verify on).
    pub checksum_errors: u64,
    /// Slots holding an expert.
    pub resident: u64,
    /// Slots in the ring.
    pub ring_slots: u64,
    /// Bytes per slot.
    pub slot_bytes: u64,
    /// I/O worker threads.
    pub workers: u64,
    /// 1 if every worker descriptor does direct I/O.
    pub direct_io: u64,
    /// Added after version 1's list: histogram files found at open but
    /// ignored (corrupt, truncated, another vault's or shape).
    pub freq_ignored: u64,
    /// Added after version 1's list: slots the pre-warm thread may fill
    /// (0 when it does not run).
    pub prewarm_slots: u64,
    /// Added after version 1's list: OK claims recorded for the trace
    /// (`trace_path`; 0 when capture is off).
    pub trace_events: u64,
    /// Added after version 1's list: OK claims not recorded because the
    /// trace was full; the file written at close holds the claims before.
    pub trace_dropped: u64,
    /// Added after version 1's list: the eviction policy in use
    /// (`SMOE_POLICY_LRU` or `SMOE_POLICY_ADAPTIVE`).
    pub policy: u64,
    /// Added after version 1's list: slots that may hold data now
    /// (`ring_slots` minus those the elastic ring took offline).
    pub slots_active: u64,
    /// Added after version 1's list: times the elastic ring shrank.
    pub shrinks: u64,
    /// Added after version 1's list: times the elastic ring grew back.
    pub grows: u64,
    /// Added after version 1's list: slots a claim holds now (refcount
    /// above 0); an engine sizes a wave of claims as
    /// `slots_active − slots_held`.
    pub slots_held: u64,
    /// Added in wave 3: evictions of loads that no claim had taken (reads
    /// wasted, most often speculation that did not come true).
    pub evicted_unclaimed: u64,
    /// Added in wave 4: payload bytes moved inside a slot after a read
    /// (a model opened in place whose experts of one layer do not share
    /// one offset modulo the I/O block); 0 for a vault.
    pub bytes_moved: u64,
    /// Added in wave 5: bytes read by speculative reads (bets no claim
    /// waited for while they were read).
    pub bytes_speculative: u64,
    /// Added in wave 5: of `bytes_speculative`, the bytes of loads no claim
    /// has taken yet (evicted unclaimed, or still waiting in the ring).
    pub bytes_speculative_unclaimed: u64,
    /// Added in wave 5: members of demand working sets of layers that had
    /// a bet outstanding (speculative prefetches since the layer's last
    /// demand set).
    pub prediction_routed: u64,
    /// Added in wave 5: of `prediction_routed`, the members the bet named
    /// (the prediction's recall is `prediction_hits / prediction_routed`).
    pub prediction_hits: u64,
    /// Added in wave 5: speculative reads dropped before they began, their
    /// layer's demand set having arrived without them.
    pub speculative_dropped: u64,
    /// Added in wave 5: nanoseconds the engine was busy (between
    /// `smoe_prewarm_pause(s, true)` and `smoe_prewarm_pause(s, false)`).
    pub busy_ns: u64,
    /// Added in wave 5: of `busy_ns`, the nanoseconds no read was in
    /// progress.
    pub drive_idle_ns: u64,
}

/// An open streamer (opaque). Made by `smoe_open`, freed by `smoe_close`;
/// used by `smoe_prefetch`, `smoe_claim`, `smoe_claim_wait`, `smoe_release`,
/// `smoe_prewarm_pause`, `smoe_flush_stats`, `smoe_get_stats`,
/// `smoe_ring_region`, `smoe_expert_info` and `smoe_vault_metadata`.
pub struct smoe_streamer {
    /// The core streamer every call forwards to.
    pub(crate) inner: Streamer,
    /// The open-time warnings, one per line, for `smoe_warnings`.
    pub(crate) warnings: CString,
}

// docs/c-api.md: every call but `smoe_close` may run on one streamer from many
// threads at once, and the exports share it as `&smoe_streamer`.
const _: fn() = || {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<smoe_streamer>();
};

impl smoe_streamer {
    /// Wraps an open streamer. Its metadata needs no C copy: the vault
    /// keeps it NUL-terminated ([`crate::vault::Vault::meta_c`]).
    pub(crate) fn new(inner: Streamer) -> smoe_streamer {
        let warnings = c_string_until_nul(&inner.warnings().join("\n"));
        smoe_streamer { inner, warnings }
    }
}

/// `text` up to its first NUL (all a C reader could see anyway).
fn c_string_until_nul(text: &str) -> CString {
    let bytes = text.as_bytes();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    CString::new(&bytes[..end]).unwrap_or_default()
}

/// The v1 size of `smoe_config` (docs/c-api.md, up to and including `freq_path`,
/// padded to the struct's alignment): the smallest `struct_size` accepted,
/// and what the unsized `smoe_config_init` of v1 writes. Fixed forever.
pub(crate) const CONFIG_SIZE_V1: usize = (std::mem::offset_of!(smoe_config, freq_path)
    + size_of::<*const c_char>())
.next_multiple_of(std::mem::align_of::<smoe_config>());
/// `sizeof(smoe_config)` of this library.
pub(crate) const CONFIG_SIZE: usize = size_of::<smoe_config>();
/// The v1 size of `smoe_stats`, the smallest `struct_size` accepted: the
/// fields docs/c-api.md lists, up to and including `direct_io`.
pub(crate) const STATS_SIZE_V1: usize = std::mem::offset_of!(smoe_stats, direct_io) + 8;
/// `sizeof(smoe_stats)` of this library: v1 plus the fields added since.
pub(crate) const STATS_SIZE: usize = size_of::<smoe_stats>();
/// The largest `struct_size` accepted for an input struct, as `openat2`
/// refuses more than a page: a garbage size must not make the library scan
/// far past the caller's struct for non-zero bytes.
pub(crate) const STRUCT_SIZE_MAX: u32 = 4096;

impl smoe_config {
    /// Writes the defaults into the caller's config of `struct_size` bytes
    /// (`smoe_config_init_sized`), never more: the fields this library
    /// knows that lie within them take their defaults, bytes past this
    /// library's `smoe_config` (a newer header's fields) become zero, which
    /// `smoe_open` reads as "not set", and `struct_size` becomes
    /// `struct_size`. Nothing is written on error.
    ///
    /// # Safety
    /// `cfg` is non-NULL, aligned, and valid for writing `struct_size` bytes.
    pub(crate) unsafe fn init_sized(
        cfg: NonNull<smoe_config>,
        struct_size: u32,
    ) -> Result<(), Error> {
        if struct_size > STRUCT_SIZE_MAX {
            return Err(Error::argument(format!(
                "struct_size is {struct_size}, larger than any smoe_config can be \
                 ({STRUCT_SIZE_MAX}); pass sizeof(smoe_config)"
            )));
        }
        if (struct_size as usize) < CONFIG_SIZE_V1 {
            return Err(Error::argument(format!(
                "struct_size is {struct_size}, smaller than smoe_config v1 \
                 ({CONFIG_SIZE_V1} bytes); pass sizeof(smoe_config)"
            )));
        }
        check_size_ends_on_a_field("", "smoe_config", struct_size, Self::FIELD_EXTENTS)?;
        let size = struct_size as usize;
        let known = size.min(CONFIG_SIZE);
        let value = smoe_config::defaults_in_zeroed_memory(struct_size);
        // SAFETY: `known ≤ CONFIG_SIZE` bytes are in bounds of the local
        // value and, being `≤ size`, of the caller's struct; the copy is
        // untyped, so it is sound for the pointer field.
        unsafe {
            ptr::copy_nonoverlapping(
                value.as_ptr().cast::<u8>(),
                cfg.cast::<u8>().as_ptr(),
                known,
            );
        }
        if size > known {
            // SAFETY: bytes `known..size` are within the caller's struct.
            unsafe { ptr::write_bytes(cfg.cast::<u8>().as_ptr().add(known), 0, size - known) };
        }
        Ok(())
    }

    /// Reads the caller's config by the extensible-struct rule (module doc)
    /// and converts it.
    ///
    /// # Safety
    /// `cfg` is non-NULL, aligned, and valid for reading `cfg->struct_size`
    /// bytes (at least its first `uint32_t`); `freq_path` and `trace_path`
    /// (when within `struct_size`) are NULL or valid NUL-terminated strings.
    pub(crate) unsafe fn read(cfg: NonNull<smoe_config>) -> Result<Config, Error> {
        // SAFETY: the caller guarantees the first field is readable.
        let size = unsafe { cfg.cast::<u32>().as_ptr().read() };
        if size > STRUCT_SIZE_MAX {
            return Err(Error::argument(format!(
                "cfg->struct_size is {size}, larger than any smoe_config can be \
                 ({STRUCT_SIZE_MAX}); was it set (smoe_config_init)?"
            )));
        }
        check_size_v1("cfg", "smoe_config", size, CONFIG_SIZE_V1)?;
        check_size_ends_on_a_field("cfg->", "smoe_config", size, Self::FIELD_EXTENTS)?;
        let size = size as usize;
        if size > CONFIG_SIZE {
            // SAFETY: the caller guarantees `size` bytes are readable, and
            // `CONFIG_SIZE < size`.
            let tail = unsafe {
                std::slice::from_raw_parts(
                    cfg.cast::<u8>().as_ptr().add(CONFIG_SIZE),
                    size - CONFIG_SIZE,
                )
            };
            if let Some(at) = tail.iter().position(|&b| b != 0) {
                return Err(Error::argument(format!(
                    "cfg->struct_size is {size} but this library knows only the first \
                     {CONFIG_SIZE} bytes of smoe_config, and byte {} is not zero: \
                     the caller sets a field this library version does not support",
                    CONFIG_SIZE + at
                )));
            }
        }
        let mut known = smoe_config::defaults();
        // SAFETY: both regions hold at least `min(size, CONFIG_SIZE)` bytes
        // (the caller's by contract); the copy is untyped, so it is sound for
        // the pointer field, and fields past the caller's size keep their
        // defaults.
        unsafe {
            ptr::copy_nonoverlapping(
                cfg.cast::<u8>().as_ptr(),
                ptr::addr_of_mut!(known).cast::<u8>(),
                size.min(CONFIG_SIZE),
            );
        }
        // SAFETY: `freq_path` and `trace_path` came from the caller (or are
        // the NULL defaults), who guarantees them.
        unsafe { known.to_core() }
    }
}

/// How a setting's Rust type travels in its `smoe_config` field: the C type,
/// and the conversions both ways. Only defaults go from Rust to C.
pub(crate) trait CValue: Sized {
    /// The field's C type.
    type C: Copy;

    /// The C value of `default`, a setting's default.
    fn c_default(default: &Self) -> Self::C;

    /// The setting C passed in the field named `field`, or an argument error
    /// naming the field and its value when Rust's type cannot hold it.
    ///
    /// # Safety
    /// A pointer `value` is NULL or valid as the type says (for a path: a
    /// NUL-terminated string that outlives the call).
    unsafe fn from_c(value: Self::C, field: &str) -> Result<Self, Error>;

    /// A valid C value other than `value`, to test that each field arrives
    /// where it belongs.
    #[cfg(test)]
    fn another_c(value: Self::C) -> Self::C;
}

/// A count or size: the same number.
impl CValue for u32 {
    type C = u32;
    fn c_default(default: &Self) -> u32 {
        *default
    }
    unsafe fn from_c(value: u32, _field: &str) -> Result<Self, Error> {
        Ok(value)
    }
    #[cfg(test)]
    fn another_c(value: u32) -> u32 {
        value ^ 1
    }
}

/// A byte count: the same number.
impl CValue for u64 {
    type C = u64;
    fn c_default(default: &Self) -> u64 {
        *default
    }
    unsafe fn from_c(value: u64, _field: &str) -> Result<Self, Error> {
        Ok(value)
    }
    #[cfg(test)]
    fn another_c(value: u64) -> u64 {
        value ^ 1
    }
}

/// An optional byte count: `UINT64_MAX` is `None`.
impl CValue for Option<u64> {
    type C = u64;
    fn c_default(default: &Self) -> u64 {
        default.unwrap_or(u64::MAX)
    }
    unsafe fn from_c(value: u64, _field: &str) -> Result<Self, Error> {
        Ok((value != u64::MAX).then_some(value))
    }
    #[cfg(test)]
    fn another_c(value: u64) -> u64 {
        value ^ 1
    }
}

/// A switch: 0 or 1; anything else is an argument error naming the field.
impl CValue for bool {
    type C = u32;
    fn c_default(default: &Self) -> u32 {
        u32::from(*default)
    }
    unsafe fn from_c(value: u32, field: &str) -> Result<Self, Error> {
        match value {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(Error::argument(format!(
                "cfg->{field} is {other}, expected 0 or 1"
            ))),
        }
    }
    #[cfg(test)]
    fn another_c(value: u32) -> u32 {
        value ^ 1
    }
}

/// The eviction policy: `SMOE_POLICY_LRU` or `SMOE_POLICY_ADAPTIVE`.
impl CValue for Policy {
    type C = u32;
    fn c_default(default: &Self) -> u32 {
        policy_value(*default)
    }
    unsafe fn from_c(value: u32, field: &str) -> Result<Self, Error> {
        match value {
            super::SMOE_POLICY_LRU => Ok(Policy::Lru),
            super::SMOE_POLICY_ADAPTIVE => Ok(Policy::Adaptive),
            other => Err(Error::argument(format!(
                "cfg->{field} is {other}, expected 0 (SMOE_POLICY_LRU) or 1 (SMOE_POLICY_ADAPTIVE)"
            ))),
        }
    }
    #[cfg(test)]
    fn another_c(value: u32) -> u32 {
        value ^ 1
    }
}

/// When the ring is committed: `SMOE_POPULATE_OFF`, `_BACKGROUND` or
/// `_OPEN`.
impl CValue for Populate {
    type C = u32;
    fn c_default(default: &Self) -> u32 {
        *default as u32
    }
    unsafe fn from_c(value: u32, field: &str) -> Result<Self, Error> {
        match value {
            super::SMOE_POPULATE_OFF => Ok(Populate::Off),
            super::SMOE_POPULATE_BACKGROUND => Ok(Populate::Background),
            super::SMOE_POPULATE_OPEN => Ok(Populate::Open),
            other => Err(Error::argument(format!(
                "cfg->{field} is {other}, expected 0 (SMOE_POPULATE_OFF), 1 (SMOE_POPULATE_BACKGROUND) or 2 (SMOE_POPULATE_OPEN)"
            ))),
        }
    }
    #[cfg(test)]
    fn another_c(value: u32) -> u32 {
        (value + 1) % 3
    }
}

fn policy_value(policy: Policy) -> u32 {
    match policy {
        Policy::Lru => super::SMOE_POLICY_LRU,
        Policy::Adaptive => super::SMOE_POLICY_ADAPTIVE,
    }
}

/// The direct-I/O policy: 0 auto, 1 require, 2 off.
impl CValue for DirectIo {
    type C = u32;
    fn c_default(default: &Self) -> u32 {
        direct_io_value(*default)
    }
    unsafe fn from_c(value: u32, field: &str) -> Result<Self, Error> {
        match value {
            0 => Ok(DirectIo::Auto),
            1 => Ok(DirectIo::Require),
            2 => Ok(DirectIo::Off),
            other => Err(Error::argument(format!(
                "cfg->{field} is {other}, expected 0 (auto), 1 (require) or 2 (off)"
            ))),
        }
    }
    #[cfg(test)]
    fn another_c(value: u32) -> u32 {
        (value + 1) % 3
    }
}

/// A path: NULL is `None`; otherwise any bytes (not necessarily UTF-8).
impl CValue for Option<PathBuf> {
    type C = *const c_char;
    /// Only NULL can be a default: a path would need a C string for the
    /// caller's struct to point to for as long as it lives.
    fn c_default(default: &Self) -> *const c_char {
        assert!(default.is_none(), "a path default has no C string");
        ptr::null()
    }
    unsafe fn from_c(value: *const c_char, _field: &str) -> Result<Self, Error> {
        if value.is_null() {
            return Ok(None);
        }
        // SAFETY: non-NULL, and the caller guarantees a valid string.
        let bytes = unsafe { CStr::from_ptr(value) }.to_bytes();
        Ok(Some(PathBuf::from(OsStr::from_bytes(bytes))))
    }
    #[cfg(test)]
    fn another_c(value: *const c_char) -> *const c_char {
        if value.is_null() {
            c"/another/path".as_ptr()
        } else {
            ptr::null()
        }
    }
}

/// Checks, at compile time, that `offsets` (a C struct's fields, in schema
/// order) increase and all lie past the leading `uint32_t struct_size`: the
/// C struct lists the schema's fields in the schema's order.
// Used only in `const _` items, which the MSRV's compiler (1.85) does not
// count as a use; stable's does.
#[allow(dead_code, reason = "used in anonymous consts (see above)")]
const fn assert_schema_order(offsets: &[usize]) {
    let mut i = 0;
    while i < offsets.len() {
        assert!(
            offsets[i] >= size_of::<u32>() && (i == 0 || offsets[i - 1] < offsets[i]),
            "a C struct's fields are not in its schema's order"
        );
        i += 1;
    }
}

/// Generates, from `config_schema!`, the conversions between `smoe_config`
/// and [`Config`] (see the module doc).
macro_rules! config_conversions {
    ($([$($marker:ident)?] $(#[$doc:meta])* $name:ident : $ty:ty = $default:expr,)*) => {
        impl smoe_config {
            /// The names of the fields after `struct_size`, in C order.
            #[doc(hidden)]
            pub const FIELD_NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// Each field after `struct_size`: its name and byte range.
            const FIELD_EXTENTS: &'static [FieldExtent] = &[$(FieldExtent {
                name: stringify!($name),
                offset: std::mem::offset_of!(smoe_config, $name),
                bytes: size_of::<<$ty as CValue>::C>(),
            }),*];

            /// The defaults `smoe_config_init` writes: those of
            /// [`Config::default`] in C terms, `struct_size` this library's
            /// `sizeof(smoe_config)`.
            pub(crate) fn defaults() -> smoe_config {
                let core = Config::default();
                smoe_config {
                    struct_size: CONFIG_SIZE as u32,
                    $($name: <$ty as CValue>::c_default(&core.$name),)*
                }
            }

            /// [`smoe_config::defaults`] with `struct_size` set to
            /// `struct_size`, built in zeroed memory field by field, so any
            /// padding is zero rather than whatever the stack held.
            fn defaults_in_zeroed_memory(struct_size: u32) -> MaybeUninit<smoe_config> {
                let core = Config::default();
                let mut value = MaybeUninit::<smoe_config>::zeroed();
                // SAFETY: all-zero bytes are a valid `smoe_config` (integers
                // and a NULL pointer).
                let v = unsafe { value.assume_init_mut() };
                v.struct_size = struct_size;
                $(v.$name = <$ty as CValue>::c_default(&core.$name);)*
                value
            }

            /// Converts a config (whose size was checked) to the core's,
            /// checking every field C could set to a value Rust's type cannot
            /// hold. The Rust-only fields of [`Config`] keep their defaults.
            ///
            /// # Safety
            /// Every pointer field is NULL or valid as its type says (see
            /// [`CValue::from_c`]).
            pub(crate) unsafe fn to_core(self) -> Result<Config, Error> {
                Ok(Config {
                    $(
                        // SAFETY: the caller guarantees this field, if a
                        // pointer, is NULL or valid.
                        $name: unsafe { <$ty as CValue>::from_c(self.$name, stringify!($name)) }?,
                    )*
                    ..Config::default()
                })
            }
        }

        const _: () = assert_schema_order(&[$(std::mem::offset_of!(smoe_config, $name)),*]);

        /// Each setting of `config`, by name, as `Debug` shows it.
        #[cfg(test)]
        fn config_field_values(config: &Config) -> Vec<(&'static str, String)> {
            vec![$((stringify!($name), format!("{:?}", config.$name))),*]
        }

        /// `config` with the field `name` set to another valid value.
        #[cfg(test)]
        fn with_another_value(mut config: smoe_config, name: &str) -> smoe_config {
            $(if name == stringify!($name) {
                config.$name = <$ty as CValue>::another_c(config.$name);
            })*
            config
        }
    };
}

crate::config::config_schema!(config_conversions);

/// Generates, from `stats_schema!`, the conversion from [`Stats`] to
/// `smoe_stats` (see the module doc).
macro_rules! stats_conversions {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        impl smoe_stats {
            /// The names of the fields after `struct_size`, in C order.
            #[doc(hidden)]
            pub const FIELD_NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// Each field after `struct_size`: its name and byte range
            /// (every counter is a `uint64_t`).
            const FIELD_EXTENTS: &'static [FieldExtent] = &[$(FieldExtent {
                name: stringify!($name),
                offset: std::mem::offset_of!(smoe_stats, $name),
                bytes: size_of::<u64>(),
            }),*];

            /// `stats` in C terms with `struct_size` set to `struct_size`,
            /// built in zeroed memory field by field, so the padding after
            /// `struct_size` is zero rather than whatever the stack held.
            fn from_core(stats: &Stats, struct_size: u32) -> MaybeUninit<smoe_stats> {
                let mut value = MaybeUninit::<smoe_stats>::zeroed();
                // SAFETY: all-zero bytes are a valid `smoe_stats` (integers
                // only).
                let v = unsafe { value.assume_init_mut() };
                v.struct_size = struct_size;
                $(v.$name = stats.$name;)*
                value
            }

            /// Never called: its destructuring and its struct literal name
            /// every field of both sides, so a field missing from either
            /// does not compile.
            #[allow(dead_code)]
            fn every_field_is_in_the_schema(stats: &Stats) -> smoe_stats {
                let Stats { $($name,)* } = stats.clone();
                smoe_stats {
                    struct_size: 0,
                    $($name,)*
                }
            }
        }

        const _: () = assert_schema_order(&[$(std::mem::offset_of!(smoe_stats, $name)),*]);

        /// Each counter of `stats` (the C side), in schema order.
        #[cfg(test)]
        fn c_stats_values(stats: &smoe_stats) -> Vec<u64> {
            vec![$(stats.$name),*]
        }

        /// A `Stats` whose counters are 1, 2, 3, ... in schema order.
        #[cfg(test)]
        fn numbered_stats() -> Stats {
            let mut n = 0;
            Stats {
                $($name: {
                    n += 1;
                    n
                },)*
            }
        }
    };
}

crate::config::stats_schema!(stats_conversions);

/// The C value of a direct-I/O policy.
fn direct_io_value(policy: DirectIo) -> u32 {
    match policy {
        DirectIo::Auto => 0,
        DirectIo::Require => 1,
        DirectIo::Off => 2,
    }
}

/// An argument error when `size` is below the v1 size of `what`.
fn check_size_v1(parameter: &str, what: &str, size: u32, v1: usize) -> Result<(), Error> {
    if (size as usize) < v1 {
        return Err(Error::argument(format!(
            "{parameter}->struct_size is {size}, smaller than {what} v1 ({v1} bytes); \
             set it to sizeof({what})"
        )));
    }
    Ok(())
}

/// A field of a versioned C struct: where it lies.
struct FieldExtent {
    name: &'static str,
    offset: usize,
    bytes: usize,
}

/// An argument error when `size` ends inside one of `fields`: the caller's
/// struct would hold part of a field, and a pointer built from half the
/// caller's bytes and half a default is never safe to follow. A size that
/// ends between fields (in padding) or past them all is fine.
fn check_size_ends_on_a_field(
    parameter: &str,
    what: &str,
    size: u32,
    fields: &[FieldExtent],
) -> Result<(), Error> {
    let size = size as usize;
    match fields
        .iter()
        .find(|f| f.offset < size && size < f.offset + f.bytes)
    {
        Some(f) => Err(Error::argument(format!(
            "{parameter}struct_size is {size}, which ends inside {what}.{} (bytes {}..{}); \
             set it to sizeof({what})",
            f.name,
            f.offset,
            f.offset + f.bytes
        ))),
        None => Ok(()),
    }
}

impl From<SlotInfo> for smoe_slot {
    fn from(info: SlotInfo) -> Self {
        smoe_slot {
            data: info.data,
            size: info.size,
            ticket: info.ticket,
            slot_index: info.slot_index,
            layer: info.layer,
            expert: info.expert,
            hit: info.hit,
        }
    }
}

impl smoe_stats {
    /// Writes `stats` to the caller's struct by the extensible-struct rule:
    /// `min(out->struct_size, sizeof(smoe_stats))` bytes, `struct_size`
    /// becoming that count. Nothing is written on error.
    ///
    /// # Safety
    /// `out` is non-NULL, aligned, valid for reading its first `uint32_t`
    /// and for writing `out->struct_size` bytes.
    pub(crate) unsafe fn write(out: NonNull<smoe_stats>, stats: &Stats) -> Result<(), Error> {
        // SAFETY: the caller guarantees the first field is readable.
        let size = unsafe { out.cast::<u32>().as_ptr().read() };
        check_size_v1("out", "smoe_stats", size, STATS_SIZE_V1)?;
        check_size_ends_on_a_field("out->", "smoe_stats", size, Self::FIELD_EXTENTS)?;
        let written = (size as usize).min(STATS_SIZE);
        let value = smoe_stats::from_core(stats, written as u32);
        // SAFETY: `written` bytes are in bounds of both the local value and
        // (by the caller's contract, `written ≤ struct_size`) of `*out`.
        unsafe {
            ptr::copy_nonoverlapping(
                value.as_ptr().cast::<u8>(),
                out.cast::<u8>().as_ptr(),
                written,
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    /// A config followed by bytes this library does not know.
    #[repr(C)]
    struct Larger {
        config: smoe_config,
        extra: [u8; 16],
    }

    fn read(cfg: &smoe_config) -> Result<Config, Error> {
        // SAFETY: `cfg` is a valid reference; callers keep `struct_size`
        // within the bytes actually behind it.
        unsafe { smoe_config::read(NonNull::from(cfg)) }
    }

    #[test]
    fn v1_sizes_are_the_abi() {
        // 52 bytes of fields on 32-bit targets, padded to 56 by the u64 alignment.
        assert_eq!(CONFIG_SIZE_V1, 56);
        assert_eq!(STATS_SIZE_V1, 8 + 15 * 8);
        assert_eq!(std::mem::offset_of!(smoe_stats, claims), 8);
        assert_eq!(std::mem::offset_of!(smoe_stats, direct_io), 8 + 14 * 8);
        assert_eq!(std::mem::offset_of!(smoe_config, scout_bytes), 32);
        assert_eq!(std::mem::offset_of!(smoe_config, freq_path), 48);
    }

    #[test]
    fn defaults_are_the_cores() {
        let c = smoe_config::defaults();
        assert_eq!(c.struct_size as usize, CONFIG_SIZE);
        assert_eq!(
            (c.ring_slots, c.slot_mb, c.workers, c.direct_io),
            (0, 0, 0, 0)
        );
        assert_eq!((c.prewarm, c.prewarm_slots, c.verify), (1, 0, 0));
        assert_eq!(c.scout_bytes, u64::MAX);
        assert_eq!(c.engine_overhead_bytes, 0);
        assert!(c.freq_path.is_null());
        assert!(c.trace_path.is_null());
        let core = read(&c).unwrap();
        assert_eq!(format!("{core:?}"), format!("{:?}", Config::default()));
    }

    #[test]
    fn every_field_converts() {
        let path = c"/tmp/freq.bin";
        let c = smoe_config {
            ring_slots: 4,
            slot_mb: 2,
            workers: 3,
            direct_io: 2,
            prewarm: 0,
            prewarm_slots: 9,
            verify: 1,
            scout_bytes: 123,
            engine_overhead_bytes: 456,
            freq_path: path.as_ptr(),
            ..smoe_config::defaults()
        };
        let core = read(&c).unwrap();
        assert_eq!((core.ring_slots, core.slot_mb, core.workers), (4, 2, 3));
        assert_eq!(core.direct_io, DirectIo::Off);
        assert!(!core.prewarm && core.verify);
        assert_eq!(core.prewarm_slots, 9);
        assert_eq!(core.scout_bytes, Some(123));
        assert_eq!(core.engine_overhead_bytes, 456);
        assert_eq!(core.freq_path, Some(PathBuf::from("/tmp/freq.bin")));
        for (value, policy) in [(0, DirectIo::Auto), (1, DirectIo::Require)] {
            let c = smoe_config {
                direct_io: value,
                ..smoe_config::defaults()
            };
            assert_eq!(read(&c).unwrap().direct_io, policy);
            assert_eq!(direct_io_value(policy), value);
        }
    }

    /// Guards the schema: each C field lands in the Rust field of its name
    /// and no other, and the defaults agree both ways. Generic over the
    /// schema, so a new field is covered without an edit here.
    #[test]
    fn every_config_field_round_trips() {
        let defaults = smoe_config::defaults();
        let base = config_field_values(&read(&defaults).unwrap());
        assert_eq!(base, config_field_values(&Config::default()));
        assert_eq!(base.len(), smoe_config::FIELD_NAMES.len());
        for &name in smoe_config::FIELD_NAMES {
            let changed = config_field_values(&read(&with_another_value(defaults, name)).unwrap());
            let differs: Vec<&str> = changed
                .iter()
                .zip(&base)
                .filter(|(now, before)| now != before)
                .map(|(now, _)| now.0)
                .collect();
            assert_eq!(differs, [name], "only cfg->{name} was changed");
        }
    }

    /// Each counter reaches the C field of its name (generic, as above).
    #[test]
    fn every_stats_field_round_trips() {
        let core = numbered_stats();
        // SAFETY: all-zero bytes are a valid `smoe_stats` (integers only).
        let mut out: smoe_stats = unsafe { std::mem::zeroed() };
        out.struct_size = STATS_SIZE as u32;
        // SAFETY: `out` is a whole `smoe_stats`.
        unsafe { smoe_stats::write(NonNull::from(&mut out), &core) }.unwrap();
        let expected: Vec<u64> = (1..=smoe_stats::FIELD_NAMES.len() as u64).collect();
        assert_eq!(c_stats_values(&out), expected);
        assert_eq!(
            STATS_SIZE,
            8 + 8 * smoe_stats::FIELD_NAMES.len(),
            "no C field outside the schema"
        );
    }

    #[test]
    fn freq_path_empty_and_non_utf8() {
        let empty = smoe_config {
            freq_path: c"".as_ptr(),
            ..smoe_config::defaults()
        };
        assert_eq!(read(&empty).unwrap().freq_path, Some(PathBuf::new()));
        let latin1 = c"/tmp/fr\xe9q";
        let odd = smoe_config {
            freq_path: latin1.as_ptr(),
            ..smoe_config::defaults()
        };
        let path = read(&odd).unwrap().freq_path.unwrap();
        assert_eq!(path.as_os_str().as_bytes(), b"/tmp/fr\xe9q");
    }

    #[test]
    fn out_of_range_values_name_the_field() {
        let cases: [(smoe_config, &str); 5] = [
            (
                smoe_config {
                    populate: 3,
                    ..smoe_config::defaults()
                },
                "cfg->populate is 3, expected 0 (SMOE_POPULATE_OFF), 1 (SMOE_POPULATE_BACKGROUND) or 2",
            ),
            (
                smoe_config {
                    direct_io: 3,
                    ..smoe_config::defaults()
                },
                "cfg->direct_io is 3",
            ),
            (
                smoe_config {
                    prewarm: 2,
                    ..smoe_config::defaults()
                },
                "cfg->prewarm is 2",
            ),
            (
                smoe_config {
                    verify: u32::MAX,
                    ..smoe_config::defaults()
                },
                "cfg->verify is 4294967295",
            ),
            (
                smoe_config {
                    struct_size: 4,
                    ..smoe_config::defaults()
                },
                "cfg->struct_size is 4, smaller",
            ),
        ];
        for (c, message) in cases {
            let err = read(&c).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Argument);
            assert!(err.message().starts_with(message), "{}", err.message());
        }
    }

    #[test]
    fn init_sized_writes_exactly_struct_size() {
        // SAFETY: all-0xa5 bytes are a valid `Larger` (integers, and a
        // pointer that is never dereferenced here).
        let fresh = || -> Larger { unsafe { std::mem::transmute([0xa5u8; size_of::<Larger>()]) } };
        let bytes = |l: &Larger| -> Vec<u8> {
            // SAFETY: `l` is a whole `Larger`, readable for its size, with
            // no padding (a multiple of 8 bytes, then 16).
            unsafe {
                std::slice::from_raw_parts((l as *const Larger).cast::<u8>(), size_of::<Larger>())
            }
            .to_vec()
        };
        for refused in [
            0,
            4,
            CONFIG_SIZE_V1 as u32 - 1,
            STRUCT_SIZE_MAX + 1,
            u32::MAX,
        ] {
            let mut l = fresh();
            // SAFETY: a refused size writes nothing.
            let err = unsafe { smoe_config::init_sized(NonNull::from(&mut l.config), refused) }
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Argument);
            assert!(bytes(&l).iter().all(|&b| b == 0xa5), "{refused}: written");
        }
        for size in [CONFIG_SIZE, CONFIG_SIZE + 8, size_of::<Larger>()] {
            let mut l = fresh();
            // SAFETY: `l` holds `size` writable bytes.
            unsafe { smoe_config::init_sized(NonNull::from(&mut l.config), size as u32) }.unwrap();
            let written = bytes(&l);
            assert_eq!(l.config.struct_size as usize, size);
            assert!(
                written[CONFIG_SIZE..size].iter().all(|&b| b == 0),
                "tail zeroed"
            );
            assert!(
                written[size..].iter().all(|&b| b == 0xa5),
                "{size}: overrun"
            );
            let core = read(&l.config).unwrap();
            assert_eq!(format!("{core:?}"), format!("{:?}", Config::default()));
        }
    }

    #[test]
    fn larger_struct_needs_a_zero_tail() {
        let mut larger = Larger {
            config: smoe_config {
                struct_size: size_of::<Larger>() as u32,
                ring_slots: 7,
                ..smoe_config::defaults()
            },
            extra: [0; 16],
        };
        assert_eq!(read(&larger.config).unwrap().ring_slots, 7);
        larger.extra[5] = 1;
        let err = read(&larger.config).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Argument);
        assert!(
            err.message()
                .contains(&format!("byte {} is not zero", CONFIG_SIZE + 5)),
            "{}",
            err.message()
        );
        larger.config.struct_size = STRUCT_SIZE_MAX + 1;
        assert_eq!(
            read(&larger.config).unwrap_err().kind(),
            ErrorKind::Argument
        );
    }

    #[test]
    fn stats_write_only_the_known_bytes() {
        #[repr(C)]
        struct LargerStats {
            stats: smoe_stats,
            extra: [u64; 2],
        }
        let core = numbered_stats();
        // SAFETY: all-0xff bytes are a valid `LargerStats` (integers only).
        let mut out: LargerStats = unsafe { std::mem::transmute([0xffu8; STATS_SIZE + 16]) };
        out.stats.struct_size = size_of::<LargerStats>() as u32;
        // SAFETY: `out` is valid for its whole size.
        unsafe { smoe_stats::write(NonNull::from(&mut out.stats), &core) }.unwrap();
        assert_eq!(out.stats.struct_size as usize, STATS_SIZE);
        assert_eq!(
            (
                out.stats.claims,
                out.stats.checksum_errors,
                out.stats.direct_io,
                out.stats.prewarm_slots
            ),
            (1, 10, 15, 17),
            "fields numbered in schema order"
        );
        // A v1 caller (version 1's fields only) gets exactly those.
        // SAFETY: all-0xff bytes are a valid `LargerStats`.
        let mut v1: LargerStats = unsafe { std::mem::transmute([0xffu8; STATS_SIZE + 16]) };
        v1.stats.struct_size = STATS_SIZE_V1 as u32;
        // SAFETY: `v1` is valid for its whole size.
        unsafe { smoe_stats::write(NonNull::from(&mut v1.stats), &core) }.unwrap();
        assert_eq!(v1.stats.struct_size as usize, STATS_SIZE_V1);
        assert_eq!(v1.stats.direct_io, 15);
        assert_eq!(v1.stats.freq_ignored, u64::MAX, "past a v1 caller's struct");
        assert_eq!(
            out.extra,
            [u64::MAX; 2],
            "bytes past smoe_stats are untouched"
        );

        let mut small = smoe_stats {
            struct_size: 8,
            ..out.stats
        };
        small.claims = 99;
        // SAFETY: `small` is a valid, whole `smoe_stats`.
        let err = unsafe { smoe_stats::write(NonNull::from(&mut small), &core) }.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Argument);
        assert_eq!(
            (small.struct_size, small.claims),
            (8, 99),
            "nothing written"
        );
    }

    #[test]
    fn slot_info_converts() {
        let info = SlotInfo {
            data: 0x4000 as *const u8,
            size: 10,
            ticket: 0x1_0000_0002,
            slot_index: 2,
            layer: 3,
            expert: 4,
            hit: true,
        };
        let slot = smoe_slot::from(info);
        assert_eq!(
            (slot.data, slot.size, slot.ticket, slot.slot_index),
            (info.data, 10, info.ticket, 2)
        );
        assert_eq!((slot.layer, slot.expert, slot.hit), (3, 4, true));
    }

    #[test]
    fn warnings_stop_at_a_nul() {
        assert_eq!(c_string_until_nul("{\"a\":1}").as_bytes(), b"{\"a\":1}");
        assert_eq!(c_string_until_nul("{}\0junk").as_bytes(), b"{}");
        assert_eq!(c_string_until_nul("").as_bytes(), b"");
    }
}
