/*
 * smoe: stream Mixture-of-Experts expert weights from SSD (C API v1).
 *
 * GENERATED FILE, DO NOT EDIT. It is written by cbindgen from src/ffi/ when
 * the crate builds (`cargo build`), using cbindgen.toml; commit the result.
 * CI builds with CI set, which never rewrites this file, and fails when it
 * differs from what the source generates.
 */

#ifndef SMOE_H
#define SMOE_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#if defined(__clang__)
#define SMOE_NULLABLE _Nullable
#define SMOE_NONNULL _Nonnull
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wnullability-extension"
#define SMOE_H_DIAGNOSTIC_PUSHED
#else
#define SMOE_NULLABLE
#define SMOE_NONNULL
#endif
#if defined(__GNUC__) || defined(__clang__)
#define SMOE_DEPRECATED(note) __attribute__((deprecated(note)))
#else
#define SMOE_DEPRECATED(note)
#endif

/*
 * The version of the smoe library this header belongs to (the crate's
 * version, from its Cargo.toml); smoe_version() returns the loaded library's.
 */
#define SMOE_VERSION_MAJOR 0
#define SMOE_VERSION_MINOR 1
#define SMOE_VERSION_PATCH 0
#define SMOE_VERSION_STRING "0.1.0"

/**
 * The version of the C ABI this library implements. Compare it with
 * `smoe_abi_version()` at run time to detect a header/library mismatch.
 */
#define SMOE_ABI_VERSION 1

/**
 * `smoe_config.policy`: evict the least recently used idle slot (default).
 */
#define SMOE_POLICY_LRU 0

/**
 * `smoe_config.policy`: evict the idle slot whose layer the decode loop
 * reaches last (docs/c-api.md, "Eviction").
 */
#define SMOE_POLICY_ADAPTIVE 1

/**
 * `smoe_config.populate`: the ring's pages are committed as slots are
 * first loaded (default).
 */
#define SMOE_POPULATE_OFF 0

/**
 * `smoe_config.populate`: a thread pre-faults the ring after open.
 */
#define SMOE_POPULATE_BACKGROUND 1

/**
 * `smoe_config.populate`: `smoe_open` pre-faults the ring before it
 * returns (docs/c-api.md, "The ring's memory").
 */
#define SMOE_POPULATE_OPEN 2

/**
 * The result of every call that can fail. Values are fixed by the ABI and
 * never reused (a retired value stays reserved); `smoe_status_str()` names
 * each one.
 */
typedef enum smoe_status {
  /**
   * Success.
   */
  SMOE_OK = 0,
  /**
   * Claim: not resident yet, its read is queued.
   */
  SMOE_PENDING = 1,
  /**
   * NULL, bad struct_size, out-of-range value.
   */
  SMOE_ERR_ARGUMENT = -1,
  /**
   * (layer, expert) is not in the vault.
   */
  SMOE_ERR_NOT_FOUND = -2,
  /**
   * Open or read failed (errno in the message).
   */
  SMOE_ERR_IO = -3,
  /**
   * Vault invalid, or a blob failed its checksum.
   */
  SMOE_ERR_FORMAT = -4,
  /**
   * The ring could not be allocated.
   */
  SMOE_ERR_NO_MEMORY = -5,
  /**
   * Every slot is claimed or loading.
   */
  SMOE_ERR_RING_FULL = -6,
  /**
   * Release of a ticket that is not held.
   */
  SMOE_ERR_STALE = -7,
  /**
   * E.g. direct I/O required but refused.
   */
  SMOE_ERR_UNSUPPORTED = -8,
  /**
   * A bug: a panic caught at the boundary.
   */
  SMOE_ERR_INTERNAL = -99,
} smoe_status;

/**
 * An open streamer (opaque). Made by `smoe_open`, freed by `smoe_close`;
 * used by `smoe_prefetch`, `smoe_claim`, `smoe_claim_wait`, `smoe_release`,
 * `smoe_prewarm_pause`, `smoe_flush_stats`, `smoe_get_stats`,
 * `smoe_ring_region`, `smoe_expert_info` and `smoe_vault_metadata`.
 */
typedef struct smoe_streamer smoe_streamer;

/**
 * A device tier (opaque). Made by `smoe_tier_new`, freed by
 * `smoe_tier_free`; every other call may run on it from many threads at
 * once (one at a time inside).
 */
typedef struct smoe_tier smoe_tier;

/**
 * Streamer settings for `smoe_open`. Initialize with `smoe_config_init`,
 * then change fields; a `NULL` config means all defaults.
 */
typedef struct smoe_config {
  /**
   * `sizeof(smoe_config)`; `smoe_config_init` sets it.
   */
  uint32_t struct_size;
  /**
   * Number of slots; 0 = auto.
   */
  uint32_t ring_slots;
  /**
   * Slot size in MiB (`slot_mb × 1048576` bytes); 0 = the largest padded
   * blob rounded up to 16384 bytes.
   */
  uint32_t slot_mb;
  /**
   * I/O worker threads, 1..=64; 0 = 16.
   */
  uint32_t workers;
  /**
   * 0 auto (fall back to buffered, with a warning), 1 require, 2 off.
   */
  uint32_t direct_io;
  /**
   * 1 on (default), 0 off: the pre-warm thread (docs/c-api.md).
   */
  uint32_t prewarm;
  /**
   * Pre-warm budget in slots; 0 = slots − max(128, slots/4).
   */
  uint32_t prewarm_slots;
  /**
   * 1 = check each blob's xxh3 after reading; default 0.
   */
  uint32_t verify;
  /**
   * Bytes of dense weights the engine keeps resident; `UINT64_MAX` = size
   * of the vault's `scout.*` files (default).
   */
  uint64_t scout_bytes;
  /**
   * Memory the engine needs besides the ring and the scout; 0 = 2 GiB.
   */
  uint64_t engine_overhead_bytes;
  /**
   * Histogram file: `NULL` = `<vault>/expert_freq.bin`; `""` = do not
   * persist. Any bytes (a path); read during `smoe_open` only. A file
   * there that is not this vault's histogram (or is the vault file, a
   * device, FIFO, socket or directory) is never replaced: persistence is
   * then off until `smoe_close`, with a warning.
   */
  const char *SMOE_NULLABLE freq_path;
  /**
   * Added after version 1: routing-trace capture. `NULL` or `""` = off.
   * Otherwise every OK claim is recorded, and at `smoe_close` the
   * claims are written to this file as a routing trace (docs/format.md
   * §5.3), replaced atomically: header `token,layer,r0,...,rK-1` (K = the
   * most experts any row has), one row per (token, layer) with that
   * layer's experts in claim order, each once; a shorter row leaves its
   * trailing fields empty. Token boundary: a claim of the same layer as
   * the previous claim continues its row, a higher layer starts the next
   * row of the same token, a lower layer starts the next token (tokens
   * count from 0), so the engine must claim a token's layers in
   * ascending order. Claims from several threads are recorded in the
   * order they complete. Only a missing file or one whose first line is
   * a trace header is replaced; anything else there (another file, the
   * vault or histogram file, a device, FIFO or directory) turns capture
   * off, with a warning. Up to 16777216 claims are recorded (4 bytes
   * each); later ones are counted in `smoe_stats.trace_dropped`. Read
   * during `smoe_open` only.
   */
  const char *SMOE_NULLABLE trace_path;
  /**
   * Added after version 1: the eviction policy, `SMOE_POLICY_LRU` (0,
   * the default: least recently used first) or `SMOE_POLICY_ADAPTIVE` (1:
   * layer-aware, for rings smaller than a decode step's working set;
   * docs/c-api.md, "Eviction"). Any other value fails `smoe_open` with
   * `SMOE_ERR_ARGUMENT`.
   */
  uint32_t policy;
  /**
   * Added after version 1: when the ring's pages are committed.
   * `SMOE_POPULATE_OFF` (0, the default): as slots are first loaded;
   * `SMOE_POPULATE_BACKGROUND` (1): a thread pre-faults them slot by
   * slot after open (contents unchanged); `SMOE_POPULATE_OPEN` (2):
   * `smoe_open` pre-faults them before it returns, with several threads,
   * so that no load pays for a first touch. An elastic ring stops at its
   * high watermark. Any other value fails `smoe_open` with
   * `SMOE_ERR_ARGUMENT`.
   */
  uint32_t populate;
  /**
   * Added after version 1: 1 = lock the ring in memory (`mlock`: every
   * page committed at open, never swapped); default 0. When the OS
   * refuses (`RLIMIT_MEMLOCK`, privilege), `smoe_open` fails with
   * `SMOE_ERR_NO_MEMORY` or `SMOE_ERR_UNSUPPORTED` and the OS error in
   * the message. A locked ring is not elastic.
   */
  uint32_t lock;
  /**
   * Added after version 1: 1 (default) = elastic ring: idle slots are
   * taken offline and their pages released while memory is short (the
   * cgroup's limit, the system's available memory), and given back when
   * it is not (docs/c-api.md, "Elastic ring"); 0 = a fixed ring. Ignored
   * when `lock` or `pinned` is 1.
   */
  uint32_t elastic;
  /**
   * Added after version 1: 1 = the host pins the ring for a device
   * (`cudaHostRegister` over `smoe_ring_region`, or any driver that pins
   * user memory for DMA); default 0. A pinned ring is not elastic
   * (pinned pages cannot be given back, and a slot released and loaded
   * again would leave the device reading the old pages) and is
   * populated: in the background as with `populate` = 1, or during
   * `smoe_open` with `populate` = 2 (docs/c-api.md, "CUDA hosts").
   * A ring whose pages are all committed (`pinned`, `lock`, or
   * `populate` with `elastic` 0) must fit in 7/8 of the memory that
   * can be committed, else `smoe_open` fails with `SMOE_ERR_NO_MEMORY`
   * saying how many slots fit; sized automatically, it takes its budget
   * (docs/c-api.md, "Ring sizing").
   */
  uint32_t pinned;
} smoe_config;

/**
 * A claimed expert, filled by `smoe_claim`/`smoe_claim_wait`; pass it to
 * `smoe_release` once.
 */
typedef struct smoe_slot {
  /**
   * The payload, 16 KB aligned; valid until this ticket is released.
   */
  const uint8_t *SMOE_NULLABLE data;
  /**
   * Payload bytes.
   */
  uint64_t size;
  /**
   * Pass to `smoe_release` (through this struct).
   */
  uint64_t ticket;
  /**
   * `data == ring base + slot_index × slot_bytes`.
   */
  uint32_t slot_index;
  /**
   * Layer id.
   */
  uint32_t layer;
  /**
   * Expert id.
   */
  uint32_t expert;
  /**
   * No demand read was needed: data retained from an earlier claim, or
   * brought in by speculation or pre-warm.
   */
  bool hit;
} smoe_slot;

/**
 * Counters and sizes, filled by `smoe_get_stats`. Set `struct_size` to
 * `sizeof(smoe_stats)` before the call; new fields are only ever added at
 * the end.
 */
typedef struct smoe_stats {
  /**
   * Set by the caller to `sizeof(smoe_stats)`; on success the library
   * sets it to the bytes it wrote (the smaller of the two sizes).
   */
  uint32_t struct_size;
  /**
   * OK claims.
   */
  uint64_t claims;
  /**
   * OK claims with `hit` true; hits/claims is the ring's coverage.
   */
  uint64_t hits;
  /**
   * Claims answered `SMOE_PENDING`.
   */
  uint64_t pending;
  /**
   * Bytes read from the vault.
   */
  uint64_t bytes_read;
  /**
   * Reads done for demand.
   */
  uint64_t reads_demand;
  /**
   * Reads done for speculation.
   */
  uint64_t reads_speculative;
  /**
   * Reads done for pre-warm.
   */
  uint64_t reads_prewarm;
  /**
   * Loads that replaced another expert.
   */
  uint64_t evictions;
  /**
   * Failed or short reads.
   */
  uint64_t io_errors;
  /**
   * Blobs that failed their checksum (verify on).
   */
  uint64_t checksum_errors;
  /**
   * Slots holding an expert.
   */
  uint64_t resident;
  /**
   * Slots in the ring.
   */
  uint64_t ring_slots;
  /**
   * Bytes per slot.
   */
  uint64_t slot_bytes;
  /**
   * I/O worker threads.
   */
  uint64_t workers;
  /**
   * 1 if every worker descriptor does direct I/O.
   */
  uint64_t direct_io;
  /**
   * Added after version 1's list: histogram files found at open but
   * ignored (corrupt, truncated, another vault's or shape).
   */
  uint64_t freq_ignored;
  /**
   * Added after version 1's list: slots the pre-warm thread may fill
   * (0 when it does not run).
   */
  uint64_t prewarm_slots;
  /**
   * Added after version 1's list: OK claims recorded for the trace
   * (`trace_path`; 0 when capture is off).
   */
  uint64_t trace_events;
  /**
   * Added after version 1's list: OK claims not recorded because the
   * trace was full; the file written at close holds the claims before.
   */
  uint64_t trace_dropped;
  /**
   * Added after version 1's list: the eviction policy in use
   * (`SMOE_POLICY_LRU` or `SMOE_POLICY_ADAPTIVE`).
   */
  uint64_t policy;
  /**
   * Added after version 1's list: slots that may hold data now
   * (`ring_slots` minus those the elastic ring took offline).
   */
  uint64_t slots_active;
  /**
   * Added after version 1's list: times the elastic ring shrank.
   */
  uint64_t shrinks;
  /**
   * Added after version 1's list: times the elastic ring grew back.
   */
  uint64_t grows;
  /**
   * Added after version 1's list: slots a claim holds now (refcount
   * above 0); an engine sizes a wave of claims as
   * `slots_active − slots_held`.
   */
  uint64_t slots_held;
  /**
   * Added in wave 3: evictions of loads that no claim had taken (reads
   * wasted, most often speculation that did not come true).
   */
  uint64_t evicted_unclaimed;
  /**
   * Added in wave 4: payload bytes moved inside a slot after a read
   * (a model opened in place whose experts of one layer do not share
   * one offset modulo the I/O block); 0 for a vault.
   */
  uint64_t bytes_moved;
  /**
   * Added in wave 5: bytes read by speculative reads (bets no claim
   * waited for while they were read).
   */
  uint64_t bytes_speculative;
  /**
   * Added in wave 5: of `bytes_speculative`, the bytes of loads no claim
   * has taken yet (evicted unclaimed, or still waiting in the ring).
   */
  uint64_t bytes_speculative_unclaimed;
  /**
   * Added in wave 5: members of demand working sets of layers that had
   * a bet outstanding (speculative prefetches since the layer's last
   * demand set).
   */
  uint64_t prediction_routed;
  /**
   * Added in wave 5: of `prediction_routed`, the members the bet named
   * (the prediction's recall is `prediction_hits / prediction_routed`).
   */
  uint64_t prediction_hits;
  /**
   * Added in wave 5: speculative reads dropped before they began, their
   * layer's demand set having arrived without them.
   */
  uint64_t speculative_dropped;
  /**
   * Added in wave 5: nanoseconds the engine was busy (between
   * `smoe_prewarm_pause(s, true)` and `smoe_prewarm_pause(s, false)`).
   */
  uint64_t busy_ns;
  /**
   * Added in wave 5: of `busy_ns`, the nanoseconds no read was in
   * progress.
   */
  uint64_t drive_idle_ns;
} smoe_stats;

/**
 * What `smoe_tier_admit` decided.
 */
typedef struct smoe_tier_promotion {
  /**
   * The device slot to copy the expert into, from its claimed ring slot,
   * then `smoe_tier_loaded` (or `smoe_tier_failed`); -1: not admitted,
   * nothing to do.
   */
  int32_t slot;
  /**
   * The layer of the expert the slot held, now gone from the device; -1
   * when the slot was empty (or nothing was admitted).
   */
  int32_t evicted_layer;
  /**
   * That expert's index in its layer; -1 likewise.
   */
  int32_t evicted_expert;
} smoe_tier_promotion;

/**
 * A device tier's counters since `smoe_tier_new`. The caller sets
 * `struct_size` to `sizeof(smoe_tier_stats)`; see `smoe_tier_get_stats`.
 */
typedef struct smoe_tier_stats {
  /**
   * Set by the caller to `sizeof(smoe_tier_stats)`; the library sets it to
   * the bytes it wrote.
   */
  uint32_t struct_size;
  /**
   * Experts looked up (every use of a decode step).
   */
  uint64_t lookups;
  /**
   * Lookups that found the expert ready in a device slot.
   */
  uint64_t hits;
  /**
   * Promotions handed out by `smoe_tier_admit`.
   */
  uint64_t promotions;
  /**
   * Promotions whose copy failed (`smoe_tier_failed`).
   */
  uint64_t failed;
  /**
   * Experts evicted without a single hit since they were loaded: copies
   * that bought nothing.
   */
  uint64_t never_used;
  /**
   * Ready experts evicted.
   */
  uint64_t evictions;
  /**
   * Bytes reported copied (`smoe_tier_loaded`).
   */
  uint64_t bytes_copied;
} smoe_tier_stats;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * The ABI version of the library actually loaded, `SMOE_ABI_VERSION` of the
 * header it was built from.
 *
 * # Returns
 * Always `SMOE_ABI_VERSION` (1 for this library).
 *
 * # Safety
 * None: takes nothing, may be called at any time from any thread.
 */
uint32_t smoe_abi_version(void);

/**
 * The version of the library actually loaded, e.g. `"0.1.0"`:
 * `SMOE_VERSION_STRING` of the header it was built from. The header's
 * `SMOE_VERSION_MAJOR`, `SMOE_VERSION_MINOR` and `SMOE_VERSION_PATCH` are its
 * three numbers, all generated from the crate's version. Within one
 * `SMOE_ABI_VERSION` a newer library keeps every older program working; the
 * version tells which fixes and additions a program gets.
 *
 * # Returns
 * A static NUL-terminated string, never NULL, never to be freed:
 * `MAJOR.MINOR.PATCH`, with a `-pre` suffix on a pre-release.
 *
 * # Safety
 * None: takes nothing, may be called at any time from any thread.
 */
const char *SMOE_NONNULL smoe_version(void);

/**
 * The name of a status, e.g. `"SMOE_ERR_IO"`.
 *
 * # Returns
 * A static NUL-terminated string, never NULL, never to be freed: the
 * constant's name for each `smoe_status` value, or `"SMOE_UNKNOWN_STATUS"`
 * for any other `int`.
 *
 * # Safety
 * None: any `int` value is accepted.
 */
const char *SMOE_NONNULL smoe_status_str(smoe_status st);

/**
 * This thread's last error message: the message of the most recent call on
 * this thread that failed (or caught a panic), with its context (file,
 * offset, layer and expert, OS error).
 *
 * # Returns
 * A NUL-terminated string, never NULL, owned by the library: `""` if no call
 * on this thread has failed. It stays valid until the next `smoe_` call on
 * this thread (or the thread's exit); copy it to keep it.
 *
 * # Safety
 * From C: none beyond the lifetime above. From Rust this is `unsafe` because
 * the returned reference's `'static` lifetime is a lie: the caller must not
 * use it after the next call into this module on the same thread.
 */
const char *SMOE_NONNULL smoe_last_error(void);

/**
 * Fills the caller's config of `struct_size` bytes with every default:
 * `ring_slots` 0 (auto), `slot_mb` 0, `workers` 0 (16), `direct_io` 0
 * (auto), `prewarm` 1, `prewarm_slots` 0, `verify` 0, `scout_bytes`
 * `UINT64_MAX`, `engine_overhead_bytes` 0 (2 GiB), `freq_path` NULL.
 *
 * `struct_size` is the caller's `sizeof(smoe_config)`; C and C++ pass it
 * through the header's `smoe_config_init(cfg)` macro, Swift (which cannot
 * call a macro) passes `UInt32(MemoryLayout<smoe_config>.size)`. Exactly
 * `struct_size` bytes are written, never more, as zlib's `inflateInit_`
 * takes the caller's `sizeof(z_stream)`: a program built against an older,
 * smaller `smoe_config` never has its struct overrun. Fields this library
 * knows within those bytes take their defaults; bytes past this library's
 * `smoe_config` (fields of a newer header) are zeroed, which `smoe_open`
 * reads as "not set"; `cfg->struct_size` becomes `struct_size`.
 *
 * # Returns
 * - `SMOE_OK`: written.
 * - `SMOE_ERR_ARGUMENT`: `cfg` is NULL, or `struct_size` is smaller than
 *   the v1 `smoe_config` (56 bytes on 64-bit targets), larger than 4096, or
 *   ends inside a field; nothing is written.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `cfg` is either NULL or valid for writing `struct_size` bytes.
 */
enum smoe_status smoe_config_init_sized(struct smoe_config *SMOE_NULLABLE cfg, uint32_t struct_size);

/**
 * The config initializer of ABI v1, kept for programs built against a
 * header without `smoe_config_init_sized`: it writes the v1 `smoe_config`
 * (56 bytes on 64-bit targets), the only size such a program can have,
 * and never more, whatever this library's `sizeof(smoe_config)`.
 *
 * In C and C++ `smoe_config_init(cfg)` is a macro defined after this
 * declaration, which calls `smoe_config_init_sized` with the caller's
 * `sizeof(smoe_config)`; only a call that bypasses the macro, such as
 * `(smoe_config_init)(cfg)`, Swift or `dlsym`, reaches this function.
 *
 * # Returns
 * Nothing. A NULL `cfg` is a no-op that records "cfg is NULL" for
 * `smoe_last_error()`.
 *
 * # Safety
 * `cfg` is either NULL or valid for writing the v1 `smoe_config`.
 */
SMOE_DEPRECATED("writes only the v1 smoe_config; call smoe_config_init_sized(cfg, sizeof(smoe_config))") void smoe_config_init(struct smoe_config *SMOE_NULLABLE cfg);

/**
 * Opens the vault at `vault_path` (its directory or its `experts.smoe`),
 * allocates the ring and starts the I/O workers.
 *
 * `cfg` follows the extensible-struct rule: `struct_size` smaller than the
 * v1 `smoe_config`, larger than 4096 or ending inside a field is an error
 * (a pointer field cut in two is never read); bytes past the struct
 * this library knows must be zero. A NULL `cfg` means all defaults.
 *
 * # Returns
 * - `SMOE_OK`: `*out` holds a new streamer; free it with `smoe_close`.
 * - `SMOE_ERR_ARGUMENT`: `vault_path` or `out` is NULL, a bad
 *   `cfg->struct_size`, a field out of range (`direct_io` not 0..=2,
 *   `prewarm` or `verify` not 0/1, `workers` over 64, a `slot_mb` smaller
 *   than a blob); the message names the field and its value. Also: the
 *   vault file is not a regular file (a FIFO, device, socket or
 *   directory); it is never opened, so `smoe_open` does not block on it.
 * - `SMOE_ERR_IO`: the vault could not be opened or read.
 * - `SMOE_ERR_FORMAT`: the vault is invalid.
 * - `SMOE_ERR_NO_MEMORY`: the ring could not be allocated, or (a model
 *   opened in place) its headers need more memory than the process may
 *   have; the message names the file.
 * - `SMOE_ERR_UNSUPPORTED`: `direct_io` is 1 (require) and the filesystem
 *   refuses direct I/O.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic), or a worker could not start.
 *
 * On any error `*out` is not written.
 *
 * # Safety
 * `vault_path` is either NULL or a valid NUL-terminated string (any bytes:
 * it is a path). `cfg` is either NULL or valid for reading
 * `cfg->struct_size` bytes, and its `freq_path` is NULL or a valid
 * NUL-terminated string; both are only read during the call. `out` is
 * either NULL or valid for writing one pointer.
 */
enum smoe_status smoe_open(const char *SMOE_NULLABLE vault_path, const struct smoe_config *SMOE_NULLABLE cfg, struct smoe_streamer *SMOE_NULLABLE *SMOE_NULLABLE out);

/**
 * Stops the I/O workers (waiting for reads in flight), frees the ring and
 * the streamer. Every `data` pointer, ticket and `smoe_vault_metadata`
 * string of this streamer is invalid afterwards.
 *
 * # Returns
 * Nothing. A NULL `s` is a no-op.
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet
 * closed, and no other call on it is running or will be made.
 */
void smoe_close(struct smoe_streamer *SMOE_NULLABLE s);

/**
 * Makes sure (`layer`, `expert`) is resident or on its way: queues its read
 * (demand, or speculative if `speculative`) into a free or least recently
 * used idle slot. Never waits for I/O; an expert already resident or in
 * flight costs no read and no second slot.
 *
 * # Returns
 * - `SMOE_OK`: resident, in flight, or queued now.
 * - `SMOE_ERR_ARGUMENT`: `s` is NULL.
 * - `SMOE_ERR_NOT_FOUND`: (`layer`, `expert`) is not in the vault.
 * - `SMOE_ERR_RING_FULL`: every slot is claimed or loading.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic, here or in a worker).
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet closed.
 */
enum smoe_status smoe_prefetch(struct smoe_streamer *SMOE_NULLABLE s, uint32_t layer, uint32_t expert, bool speculative);

/**
 * Claims (`layer`, `expert`) if its data is in the ring. Never blocks: if
 * it is not, queues a demand read (unless one is in flight) and answers
 * `SMOE_PENDING`, so a polling loop always ends. Release an OK claim once
 * with `smoe_release`.
 *
 * # Returns
 * - `SMOE_OK`: `*out` describes the claimed slot.
 * - `SMOE_PENDING`: not resident yet, its read is queued; `*out` untouched.
 * - `SMOE_ERR_ARGUMENT`: `s` or `out` is NULL, or the expert already holds
 *   the most unreleased claims a slot can count.
 * - `SMOE_ERR_NOT_FOUND`: (`layer`, `expert`) is not in the vault.
 * - `SMOE_ERR_IO` / `SMOE_ERR_FORMAT`: its last read failed / failed its
 *   checksum (reported once; a later prefetch or claim retries).
 * - `SMOE_ERR_RING_FULL`: not resident and every slot is claimed or loading.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic, here or in a worker).
 *
 * Only `SMOE_OK` writes `*out`.
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet
 * closed; `out` is either NULL or valid for writing one `smoe_slot`.
 */
enum smoe_status smoe_claim(struct smoe_streamer *SMOE_NULLABLE s, uint32_t layer, uint32_t expert, struct smoe_slot *SMOE_NULLABLE out);

/**
 * `smoe_claim`, waiting up to `timeout_ns` nanoseconds for the read: it
 * spins briefly, polls (yielding its core) until 500 µs after the call,
 * then sleeps until a worker finishes a read, using no CPU while it
 * sleeps.
 *
 * # Returns
 * As `smoe_claim`; `SMOE_PENDING` when the timeout passes first (a
 * `timeout_ns` of 0 tries exactly once). Only `SMOE_OK` writes `*out`.
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet
 * closed; `out` is either NULL or valid for writing one `smoe_slot`.
 */
enum smoe_status smoe_claim_wait(struct smoe_streamer *SMOE_NULLABLE s, uint32_t layer, uint32_t expert, uint64_t timeout_ns, struct smoe_slot *SMOE_NULLABLE out);

/**
 * Queues the reads of a layer's working set, in the order given
 * (docs/c-api.md "Working sets"): a member already resident or in
 * flight costs nothing and takes no slot, and loads queued for earlier
 * members are never evicted for later ones while they wait unclaimed.
 * Never waits. Duplicates are allowed.
 *
 * # Returns
 * - `SMOE_OK`: every member is resident or in flight now, or holds the
 *   error of its failed read for its next claim (as `smoe_prefetch`
 *   answers it); also for `n` 0.
 * - `SMOE_ERR_RING_FULL`: the ring could not take the rest (every slot is
 *   held or loading): they are not queued; `smoe_claim_any` queues them as
 *   slots free up.
 * - `SMOE_ERR_ARGUMENT`: `s` is NULL, or `experts` is NULL with `n` > 0.
 * - `SMOE_ERR_NOT_FOUND`: `layer` (for `n` 0 too) or a member is not in
 *   the vault (the message names it); nothing is queued.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic, here or in a worker).
 *
 * `*queued` (if `queued` is not NULL) receives, with `SMOE_OK` and
 * `SMOE_ERR_RING_FULL`, how many members (duplicates counted) are now
 * resident or in flight; it is not written otherwise.
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet
 * closed; `experts` is either NULL or valid for reading `n` values;
 * `queued` is either NULL or valid for writing one `uint32_t`.
 */
enum smoe_status smoe_prefetch_set(struct smoe_streamer *SMOE_NULLABLE s, uint32_t layer, const uint32_t *SMOE_NULLABLE experts, uint32_t n, bool speculative, uint32_t *SMOE_NULLABLE queued);

/**
 * Claims one member of a layer's working set (docs/c-api.md "Working
 * sets"): one that is resident now if any (a retained hit or a finished
 * load, in the set's order), else the first whose read completes, waiting
 * at most `timeout_ns` nanoseconds (0: never wait). Members neither
 * resident nor in flight get demand reads as slots free up; a read in
 * flight is marked demand. `out->expert` says which member was claimed:
 * remove it from the set before the next call. Release the claim with
 * `smoe_release`.
 *
 * # Returns
 * - `SMOE_OK`: `*out` holds the claim.
 * - `SMOE_PENDING`: the timeout passed first.
 * - `SMOE_ERR_RING_FULL`: at once, when no member is resident or in flight
 *   and every active slot is held: release a claim first (waiting would
 *   never end).
 * - `SMOE_ERR_IO` / `SMOE_ERR_FORMAT`: a member's read failed / failed its
 *   checksum; `out->layer` and `out->expert` name that member (the rest
 *   of `*out` is zero), and the error is reported once.
 * - `SMOE_ERR_ARGUMENT`: `s` or `out` is NULL, `n` is 0, or `experts` is
 *   NULL; or every member that could be claimed already holds the most
 *   claims its slot counts (a member at that limit is passed over while
 *   another can be claimed).
 * - `SMOE_ERR_NOT_FOUND`: `layer` or a member is not in the vault (the
 *   message names it). Every member is checked before any is claimed:
 *   nothing is claimed or queued then.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic, here or in a worker).
 *
 * Only `SMOE_OK` and a member's failed read write `*out`.
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet
 * closed; `experts` is either NULL or valid for reading `n` values; `out`
 * is either NULL or valid for writing one `smoe_slot`.
 */
enum smoe_status smoe_claim_any(struct smoe_streamer *SMOE_NULLABLE s, uint32_t layer, const uint32_t *SMOE_NULLABLE experts, uint32_t n, uint64_t timeout_ns, struct smoe_slot *SMOE_NULLABLE out);

/**
 * Releases the claim `slot` describes (by its `ticket`): after this its
 * `data` may be overwritten. The slot keeps its data for later claims until
 * it is evicted.
 *
 * # Returns
 * - `SMOE_OK`: released.
 * - `SMOE_ERR_ARGUMENT`: `s` or `slot` is NULL.
 * - `SMOE_ERR_STALE`: the ticket is not held (never claimed, already
 *   released, or its slot was evicted and reloaded); nothing changes. A
 *   second release while another claim with an equal ticket is held
 *   cannot be told from that claim's: it returns `SMOE_OK` and drops that
 *   claim's count (docs/c-api.md, "Claims").
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet
 * closed; `slot` is either NULL or valid for reading one `smoe_slot`.
 */
enum smoe_status smoe_release(struct smoe_streamer *SMOE_NULLABLE s, const struct smoe_slot *SMOE_NULLABLE slot);

/**
 * Tells the pre-warm thread the engine is `busy` (`true`: stop issuing
 * reads; once this returns, at most the one read already issued may start)
 * or idle (`false`: resume, re-warming what requests evicted meanwhile).
 *
 * # Returns
 * Nothing. A NULL `s` is a no-op that records "s is NULL" for
 * `smoe_last_error()`.
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet closed.
 */
void smoe_prewarm_pause(struct smoe_streamer *SMOE_NULLABLE s, bool busy);

/**
 * Persists the claim histogram now, atomically (temporary file, fsync,
 * rename, directory fsync). It is also persisted by `smoe_close`.
 *
 * # Returns
 * - `SMOE_OK`: written, or persistence is off (`freq_path = ""`, a
 *   read-only vault directory, or a file at the path at open that is not
 *   this vault's histogram, which is never replaced: see `smoe_warnings`).
 * - `SMOE_ERR_IO`: the file could not be written (path and OS error in
 *   `smoe_last_error()`), or a file that is not this vault's histogram was
 *   put at the path after `smoe_open`: it is kept, nothing is written, and
 *   `smoe_last_error()` names it and what it is.
 * - `SMOE_ERR_ARGUMENT`: `s` is NULL.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet closed.
 */
enum smoe_status smoe_flush_stats(struct smoe_streamer *SMOE_NULLABLE s);

/**
 * Fills `*out` with the streamer's counters and sizes. The caller sets
 * `out->struct_size` to `sizeof(smoe_stats)`; the library writes
 * min(`out->struct_size`, its own `sizeof(smoe_stats)`) bytes, never more,
 * and sets `out->struct_size` to that count. Counters are read one by one
 * (each exact, not a snapshot of all at one instant).
 *
 * # Returns
 * - `SMOE_OK`: written.
 * - `SMOE_ERR_ARGUMENT`: `s` or `out` is NULL, or `out->struct_size` is
 *   smaller than the v1 `smoe_stats` or ends inside a field; nothing is
 *   written.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet
 * closed; `out` is either NULL or valid for reading its `struct_size` field
 * and for writing `out->struct_size` bytes.
 */
enum smoe_status smoe_get_stats(const struct smoe_streamer *SMOE_NULLABLE s, struct smoe_stats *SMOE_NULLABLE out);

/**
 * The ring, for registering it once with a GPU API: its base (16384-byte
 * aligned), its total bytes, and the bytes per slot (slot `i` starts at
 * `base + i × slot_bytes`). Valid until `smoe_close`.
 *
 * # Returns
 * - `SMOE_OK`: `*base`, `*bytes` and `*slot_bytes` written.
 * - `SMOE_ERR_ARGUMENT`: `s`, `base`, `bytes` or `slot_bytes` is NULL (all
 *   three out-params are required); nothing is written.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet
 * closed; each of `base`, `bytes`, `slot_bytes` is either NULL or valid for
 * writing its type.
 */
enum smoe_status smoe_ring_region(const struct smoe_streamer *SMOE_NULLABLE s, void *SMOE_NULLABLE *SMOE_NULLABLE base, uint64_t *SMOE_NULLABLE bytes, uint64_t *SMOE_NULLABLE slot_bytes);

/**
 * Where (`layer`, `expert`) lives in the vault: its payload `size`, its
 * `padded_size` (the bytes a read covers) and its byte `offset` in
 * `experts.smoe`.
 *
 * # Returns
 * - `SMOE_OK`: `*size`, `*padded_size` and `*offset` written.
 * - `SMOE_ERR_ARGUMENT`: `s`, `size`, `padded_size` or `offset` is NULL
 *   (all three out-params are required); nothing is written.
 * - `SMOE_ERR_NOT_FOUND`: (`layer`, `expert`) is not in the vault.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet
 * closed; each of `size`, `padded_size`, `offset` is either NULL or valid
 * for writing a `uint64_t`.
 */
enum smoe_status smoe_expert_info(const struct smoe_streamer *SMOE_NULLABLE s, uint32_t layer, uint32_t expert, uint64_t *SMOE_NULLABLE size, uint64_t *SMOE_NULLABLE padded_size, uint64_t *SMOE_NULLABLE offset);

/**
 * The vault's metadata: a JSON object, as written by the converter.
 *
 * It is all of it, byte for byte: `smoe_open` refuses (`SMOE_ERR_FORMAT`) a
 * vault whose metadata is not UTF-8, holds a NUL byte or is over 64 MiB, so
 * the string is never cut short. It is the streamer's only copy.
 *
 * # Returns
 * A NUL-terminated string, never NULL, owned by the streamer: `""` if the
 * vault has no metadata, or if `s` is NULL (which also records "s is NULL"
 * for `smoe_last_error()`). It stays valid until `smoe_close(s)`.
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet
 * closed. From Rust the `'static` lifetime is a lie: the reference must not
 * be used after `smoe_close(s)`.
 */
const char *SMOE_NONNULL smoe_vault_metadata(const struct smoe_streamer *SMOE_NULLABLE s);

/**
 * The warnings recorded at `smoe_open`, one per line: the fallback from
 * direct to buffered I/O, a histogram file that was missing or ignored (and
 * why), persistence disabled by a read-only directory.
 *
 * # Returns
 * A NUL-terminated string, never NULL, owned by the streamer: `""` if there
 * are none, or if `s` is NULL (which also records "s is NULL" for
 * `smoe_last_error()`). It stays valid until `smoe_close(s)`.
 *
 * # Safety
 * `s` is either NULL or a pointer returned by `smoe_open` and not yet
 * closed. From Rust the `'static` lifetime is a lie: the reference must not
 * be used after `smoe_close(s)`.
 */
const char *SMOE_NONNULL smoe_warnings(const struct smoe_streamer *SMOE_NULLABLE s);

/**
 * Makes a device tier of `slots` device slots (0: a tier that never
 * promotes) for a model of `n_layers` × `n_experts` routed experts.
 *
 * # Returns
 * - `SMOE_OK`: `*out` holds the tier; free it with `smoe_tier_free`.
 * - `SMOE_ERR_ARGUMENT`: `out` is NULL, `n_layers` or `n_experts` is 0, or
 *   `n_layers × n_experts` or `slots` is over 1,048,576 (the library's id
 *   cap); `*out` is not written.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `out` is either NULL or valid for writing one pointer.
 */
enum smoe_status smoe_tier_new(uint32_t slots, uint32_t n_layers, uint32_t n_experts, struct smoe_tier *SMOE_NULLABLE *SMOE_NULLABLE out);

/**
 * Frees a tier made by `smoe_tier_new`. NULL is a no-op. The host's device
 * memory is its own: nothing of it is touched.
 *
 * # Safety
 * `t` is NULL or a tier from `smoe_tier_new`, not freed before and used by
 * no other call during or after this one.
 */
void smoe_tier_free(struct smoe_tier *SMOE_NULLABLE t);

/**
 * A use of (`layer`, `expert`) in the decode step in progress. `*slot`
 * receives its device slot when the expert's copy has completed (a hit:
 * the slot is held, never overwritten, until `smoe_tier_step_done`), or -1
 * (compute it from the ring). Counted for admission either way.
 *
 * # Returns
 * - `SMOE_OK`: `*slot` written.
 * - `SMOE_ERR_ARGUMENT`: `t` or `slot` is NULL, or the pair is outside the
 *   tier's layers and experts; nothing is counted.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `t` is NULL or a live tier; `slot` is NULL or valid for writing an
 * `int32_t`.
 */
enum smoe_status smoe_tier_lookup(const struct smoe_tier *SMOE_NULLABLE t, uint32_t layer, uint32_t expert, int32_t *SMOE_NULLABLE slot);

/**
 * Whether (`layer`, `expert`), just computed from the ring, earns a device
 * slot: an empty one, or the slot of the unheld ready expert with the
 * fewest uses when this expert has more. `*out` says which slot to copy it
 * into and what that evicts, or `slot` -1 (already there or loading, no
 * slot free of the step, or not used more than the victim). Keep the
 * expert's ring slot claimed until the copy is done.
 *
 * # Returns
 * - `SMOE_OK`: `*out` written.
 * - `SMOE_ERR_ARGUMENT`: `t` or `out` is NULL, or the pair is outside the
 *   tier; nothing changes.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `t` is NULL or a live tier; `out` is NULL or valid for writing one
 * `smoe_tier_promotion`.
 */
enum smoe_status smoe_tier_admit(const struct smoe_tier *SMOE_NULLABLE t, uint32_t layer, uint32_t expert, struct smoe_tier_promotion *SMOE_NULLABLE out);

/**
 * The copy into `slot` has completed (`bytes` copied): its expert is a hit
 * from the next lookup on.
 *
 * # Returns
 * - `SMOE_OK`: recorded.
 * - `SMOE_ERR_ARGUMENT`: `t` is NULL or `slot` is not a slot of the tier.
 * - `SMOE_ERR_STALE`: no copy into `slot` is in flight (never admitted,
 *   already loaded or failed); nothing changes.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `t` is NULL or a live tier.
 */
enum smoe_status smoe_tier_loaded(const struct smoe_tier *SMOE_NULLABLE t, uint32_t slot, uint64_t bytes);

/**
 * The copy into `slot` failed or was abandoned: the slot is empty again,
 * and its expert is computed from the ring until admitted again.
 *
 * # Returns
 * As `smoe_tier_loaded`.
 *
 * # Safety
 * `t` is NULL or a live tier.
 */
enum smoe_status smoe_tier_failed(const struct smoe_tier *SMOE_NULLABLE t, uint32_t slot);

/**
 * The decode step's graph has finished reading its device slots: they may
 * be evicted from now on.
 *
 * # Returns
 * - `SMOE_OK`: done.
 * - `SMOE_ERR_ARGUMENT`: `t` is NULL.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `t` is NULL or a live tier.
 */
enum smoe_status smoe_tier_step_done(const struct smoe_tier *SMOE_NULLABLE t);

/**
 * Fills `*out` with the tier's counters. The caller sets
 * `out->struct_size` to `sizeof(smoe_tier_stats)`; the library writes
 * min(`out->struct_size`, its own size) bytes and sets `out->struct_size`
 * to that count.
 *
 * # Returns
 * - `SMOE_OK`: written.
 * - `SMOE_ERR_ARGUMENT`: `t` or `out` is NULL, or `out->struct_size` is
 *   smaller than this first version or ends inside a field; nothing is
 *   written.
 * - `SMOE_ERR_INTERNAL`: a bug (a caught panic).
 *
 * # Safety
 * `t` is NULL or a live tier; `out` is NULL or valid for reading its
 * `struct_size` and writing that many bytes.
 */
enum smoe_status smoe_tier_get_stats(const struct smoe_tier *SMOE_NULLABLE t, struct smoe_tier_stats *SMOE_NULLABLE out);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* SMOE_H */

#if !defined(smoe_config_init)
/*
 * smoe_config_init(cfg) passes the caller's sizeof(smoe_config) to
 * smoe_config_init_sized, so the library never writes past the struct this
 * header declares, whatever the size of the library's own (zlib's
 * inflateInit passes sizeof(z_stream) the same way). It evaluates to a
 * smoe_status. The function named smoe_config_init, declared above, is ABI
 * v1's, kept for programs built before this macro existed; Swift cannot
 * call a macro and calls
 * smoe_config_init_sized(&cfg, UInt32(MemoryLayout<smoe_config>.size)).
 */
#define smoe_config_init(cfg) smoe_config_init_sized((cfg), (uint32_t)sizeof(smoe_config))
#endif

#if defined(SMOE_H_DIAGNOSTIC_PUSHED)
#undef SMOE_H_DIAGNOSTIC_PUSHED
#pragma clang diagnostic pop
#endif
