//! The streamer's settings and counters, each declared once: a leaf that
//! the streamer, the ring sizing (`budget`) and the C API import, and that
//! imports none of them.
//!
//! A setting is one entry of [`config_schema!`] (its doc, name, Rust type and
//! default), a counter one entry of [`stats_schema!`] (its doc and name; every
//! counter is a `u64`). Every Rust view is generated from those entries:
//! [`Config`] and its `Default` and [`Stats`] here; the ring sizing's
//! `BudgetConfig` (the settings marked `[budget]`) and `Config::budget` in
//! `src/budget.rs`. The C API converts to and from its structs with the same
//! entries (`src/ffi/types.rs`).
//!
//! The C structs `smoe_config` and `smoe_stats` themselves stay written out
//! in `src/ffi/types.rs`, with their C types and C docs: cbindgen reads
//! source, not macro expansions. The generated conversions name every field
//! of both sides and check their order, so a field added here and not there,
//! or the other way round, or in another place, does not compile.
//!
//! To add a setting: an entry at the end of [`config_schema!`], and its C
//! field at the end of `smoe_config` (the C type is the one its Rust type
//! converts to, see `CValue` in `src/ffi/types.rs`). A counter: an entry at
//! the end of [`stats_schema!`], its `uint64_t` at the end of `smoe_stats`,
//! and its value in `Streamer::stats`.
//!
//! This module holds declarations only; it must never decide anything. The
//! types of its settings live here or below it (`sys`'s `DirectIo`), so it
//! never imports a module that imports it.

/// How eviction chooses among idle slots (C `smoe_config.policy`; the
/// discriminants are the C values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// Least recently used first (the default).
    #[default]
    Lru = 0,
    /// Layer-aware: experts not used in their layer's latest visit first,
    /// the least claimed first; then the one whose layer the decode loop
    /// reaches last. See docs/c-api.md, "The adaptive policy".
    Adaptive = 1,
}

/// When the ring's pages are committed (C `smoe_config.populate`; the
/// discriminants are the C values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Populate {
    /// As slots are first loaded (the default): a load into a page never
    /// touched pays its commit (the kernel's zeroing) on the I/O worker.
    #[default]
    Off = 0,
    /// A thread commits the ring slot by slot after open, beside the first
    /// loads.
    Background = 1,
    /// Open commits the ring before it returns, several threads at once,
    /// so that no load pays for it: a host's first batch finds every page
    /// committed (the engine's load time pays instead).
    Open = 2,
}

/// Claims a trace records before it stops recording (and only counts them):
/// 2^24, 64 MiB of address space, committed 4 bytes per claim as used. That
/// is 262,144 tokens of a 32-layer top-2 model, 22,310 of a 94-layer top-8
/// one. The default of [`Config`]'s `trace_capacity`.
pub const DEFAULT_TRACE_CAPACITY: usize = 1 << 24;

/// Calls `$then! { $($prefix)* <entries> }` with every streamer setting, in
/// `smoe_config`'s order. An entry is
/// `[budget]` (read by the ring sizing) or `[]`, the doc, then
/// `name: RustType = default,`.
macro_rules! config_schema {
    ($then:ident $($prefix:tt)*) => {
        $then! {
            $($prefix)*
            [budget]
            /// Number of slots; 0 sizes the ring from the memory the OS can
            /// spare (docs/c-api.md, "Ring sizing"). Either way
            /// there are never more slots than the vault has entries.
            ring_slots: u32 = 0,
            [budget]
            /// Slot size in MiB (`slot_mb × 1048576` bytes); 0 = the largest
            /// padded blob rounded up to
            /// [`DEFAULT_ALIGNMENT`](crate::vault::DEFAULT_ALIGNMENT) bytes.
            /// Every blob must fit a slot of the size given here.
            slot_mb: u32 = 0,
            []
            /// I/O worker threads, 1..=64; 0 = 16.
            workers: u32 = 0,
            []
            /// Direct I/O policy for the workers' descriptors.
            direct_io: $crate::sys::DirectIo = $crate::sys::DirectIo::Auto,
            []
            /// Run the pre-warm thread (docs/c-api.md).
            prewarm: bool = true,
            []
            /// Pre-warm budget in slots; 0 = slots − max(128, slots / 4).
            prewarm_slots: u32 = 0,
            []
            /// Check each blob's xxh3 after reading it.
            verify: bool = false,
            [budget]
            /// Bytes of dense weights the engine keeps resident; `None` = the
            /// total size of the vault's `scout.*` files.
            scout_bytes: Option<u64> = None,
            [budget]
            /// Memory the engine needs besides the ring and the scout; 0 =
            /// the ring sizing's default, 2 GiB (docs/c-api.md, "Ring
            /// sizing").
            engine_overhead_bytes: u64 = 0,
            []
            /// Histogram file; `None` = `<vault>/expert_freq.bin`, empty = do
            /// not persist.
            freq_path: Option<::std::path::PathBuf> = None,
            []
            /// Routing-trace capture (docs/format.md §5.3); `None` or empty =
            /// off. Every OK claim is recorded and written to this file at
            /// close, replacing only a missing file or an earlier trace. A
            /// relative path is taken from the working directory at open.
            trace_path: Option<::std::path::PathBuf> = None,
            []
            /// Eviction policy: [`Policy::Lru`](crate::Policy::Lru) (the
            /// default) or the layer-aware
            /// [`Policy::Adaptive`](crate::Policy::Adaptive).
            policy: $crate::config::Policy = $crate::config::Policy::Lru,
            [budget]
            /// Pre-fault the ring's pages (the OS is asked to commit them
            /// slot by slot, never changing their contents), so the first
            /// loads find them committed: in the background after open, or
            /// during open. An elastic ring stops at its high watermark.
            /// Off: pages are committed as slots are first loaded.
            populate: $crate::config::Populate = $crate::config::Populate::Off,
            [budget]
            /// Lock the ring in memory (`mlock`): every page is committed at
            /// open and never swapped. Refused by the OS (a small
            /// `RLIMIT_MEMLOCK`, no privilege), open fails with
            /// [`ErrorKind::NoMemory`](crate::ErrorKind::NoMemory) or
            /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported)
            /// naming the OS error. A locked ring is not elastic.
            lock: bool = false,
            [budget]
            /// Elastic ring: a monitor thread watches memory pressure (the
            /// cgroup's limit and non-reclaimable use, the system's available
            /// memory) and takes idle slots offline, releasing their pages,
            /// while memory is short; it gives them back when it is not
            /// (docs/c-api.md, "Elastic ring"). Ignored when `lock` or
            /// `pinned` is on.
            elastic: bool = true,
            [budget]
            /// The host pins the ring's pages for a device
            /// (`cudaHostRegister`, or any driver that pins user memory for
            /// DMA). A pinned ring is not elastic: its pages cannot be given
            /// back, and a slot released and loaded again would leave the
            /// device reading the old pages. And it is populated (as with
            /// `populate`), so that registering finds its pages committed
            /// (docs/c-api.md, "CUDA hosts"). A ring whose pages are all
            /// committed (pinned, locked, or populated and not elastic)
            /// must fit in 7/8 of the memory that can be committed
            /// ([`crate::budget::check_fits`]).
            pinned: bool = false,
        }
    };
}
pub(crate) use config_schema;

/// Calls `$then! { $($prefix)* <entries> }` with the `[budget]` entries of
/// [`config_schema!`] only, markers dropped: `doc name: Type = default,`.
/// Use it as `config_schema!(select_budget <callback>)`.
macro_rules! select_budget {
    // Done: hand the kept entries on.
    (@keep $then:ident [$($kept:tt)*]) => {
        $then! { $($kept)* }
    };
    (@keep $then:ident [$($kept:tt)*]
        [budget] $(#[$doc:meta])* $name:ident : $ty:ty = $default:expr, $($rest:tt)*) => {
        select_budget!(@keep $then [$($kept)* $(#[$doc])* $name: $ty = $default,] $($rest)*);
    };
    (@keep $then:ident [$($kept:tt)*]
        [] $(#[$doc:meta])* $name:ident : $ty:ty = $default:expr, $($rest:tt)*) => {
        select_budget!(@keep $then [$($kept)*] $($rest)*);
    };
    ($then:ident $($entries:tt)*) => {
        select_budget!(@keep $then [] $($entries)*);
    };
}
pub(crate) use select_budget;

/// Calls `$then! { $($prefix)* <entries> }` with every counter, in
/// `smoe_stats`'s order (each a `u64`). An entry is the doc, then `name,`.
macro_rules! stats_schema {
    ($then:ident $($prefix:tt)*) => {
        $then! {
            $($prefix)*
            /// OK claims.
            claims,
            /// OK claims that needed no demand read (`hit`).
            hits,
            /// Claims answered pending (`claim` returning None, `claim_wait`
            /// timing out; the polls inside `claim_wait` do not count).
            pending,
            /// Bytes read from the vault.
            bytes_read,
            /// Reads done for demand.
            reads_demand,
            /// Reads done for speculation.
            reads_speculative,
            /// Reads done for pre-warm.
            reads_prewarm,
            /// Loads that replaced another expert.
            evictions,
            /// Failed or short reads.
            io_errors,
            /// Blobs that failed their checksum (verify on).
            checksum_errors,
            /// Slots holding an expert's data.
            resident,
            /// Slots in the ring.
            ring_slots,
            /// Bytes per slot.
            slot_bytes,
            /// I/O worker threads.
            workers,
            /// 1 if every worker descriptor does direct I/O.
            direct_io,
            /// Histogram files found at open but ignored (corrupt) or
            /// protected (not this vault's histogram, so never replaced).
            freq_ignored,
            /// Slots the pre-warm thread may fill (0 when it does not run).
            prewarm_slots,
            /// OK claims recorded for the trace (0 when capture is off).
            trace_events,
            /// OK claims not recorded because the trace was full
            /// ([`DEFAULT_TRACE_CAPACITY`](crate::streamer::DEFAULT_TRACE_CAPACITY)
            /// claims).
            trace_dropped,
            /// The eviction policy in use: 0 LRU, 1 adaptive.
            policy,
            /// Slots that may hold data now: `ring_slots` minus the slots the
            /// elastic ring has taken offline under memory pressure.
            slots_active,
            /// Times the elastic ring shrank (took idle slots offline).
            shrinks,
            /// Times the elastic ring grew (gave offline slots back).
            grows,
            /// Slots a claim holds now (refcount above 0): an engine sizes a
            /// wave of claims as `slots_active − slots_held`.
            slots_held,
            /// Evictions of loads that no claim had taken: reads wasted,
            /// most often speculation that did not come true.
            evicted_unclaimed,
            /// Payload bytes moved inside a slot after a read: a model
            /// opened in place whose experts of one layer do not all sit at
            /// the same offset modulo the I/O block (SPEC §6). 0 for a vault.
            bytes_moved,
            /// Bytes read by speculative reads: bets, read before any claim
            /// waited for them (a bet a claim waited for counts as demand).
            bytes_speculative,
            /// Of `bytes_speculative`, the bytes of loads no claim has taken
            /// yet: evicted unclaimed, or still waiting in the ring. Wasted
            /// reads, unless a later claim takes them.
            bytes_speculative_unclaimed,
            /// Members of demand working sets (`prefetch_set`) of layers
            /// that had a bet outstanding (speculative prefetches since the
            /// layer's last demand set): the prediction's denominator.
            prediction_routed,
            /// Of `prediction_routed`, the members the bet named: the
            /// prediction's recall is `prediction_hits / prediction_routed`.
            prediction_hits,
            /// Speculative reads dropped before they began because their
            /// layer's demand set arrived without them (stale bets).
            speculative_dropped,
            /// Nanoseconds the engine was busy: between
            /// `prewarm_pause(true)` and `prewarm_pause(false)`.
            busy_ns,
            /// Of `busy_ns`, the nanoseconds no read was in progress: time
            /// a read ahead could have used.
            drive_idle_ns,
        }
    };
}
// Its one user outside this module, the ffi, is not built under loom.
#[cfg_attr(loom, allow(unused_imports))]
pub(crate) use stats_schema;

macro_rules! define_config {
    ($([$($marker:ident)?] $(#[$doc:meta])* $name:ident : $ty:ty = $default:expr,)*) => {
        /// Streamer settings (C `smoe_config`).
        #[derive(Clone, Debug)]
        pub struct Config {
            $($(#[$doc])* pub $name: $ty,)*
            /// Benchmark hook: count claims in the histogram (default true).
            /// Off only to measure what counting costs; not a setting of
            /// the C API. (Unlike a fault, it cannot be injected through
            /// the read seam: it is the claim path's one branch, on a field
            /// the claim reads anyway.)
            #[doc(hidden)]
            pub count_claims: bool,
            /// Test hook: claims a trace records before it only counts
            /// them (default [`DEFAULT_TRACE_CAPACITY`]).
            /// Not a setting of the C API.
            #[doc(hidden)]
            pub trace_capacity: usize,
            /// Test hook: the elastic ring's monitor reads its memory files
            /// (`proc/meminfo`, `proc/self/cgroup`, `sys/fs/cgroup/...`)
            /// under this directory instead of `/` (Linux), so a test can
            /// put the ring under pressure without root. Not a setting of
            /// the C API.
            #[doc(hidden)]
            pub pressure_root: Option<::std::path::PathBuf>,
            /// Benchmark hook: ask the OS for transparent huge pages on a
            /// ring of big slots (default true; see docs/c-api.md, "The
            /// ring's memory"). Off only to measure what they change. Not a
            /// setting of the C API.
            #[doc(hidden)]
            pub huge_pages: bool,
        }

        impl Default for Config {
            fn default() -> Self {
                Config {
                    $($name: $default,)*
                    count_claims: true,
                    trace_capacity: DEFAULT_TRACE_CAPACITY,
                    pressure_root: None,
                    huge_pages: true,
                }
            }
        }
    };
}

config_schema!(define_config);

macro_rules! define_stats {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Counters and sizes (C `smoe_stats`).
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
        }
    };
}

stats_schema!(define_stats);
