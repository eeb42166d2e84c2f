//! The streamer (docs/c-api.md): a ring of aligned slots, the slot table that
//! governs them, and the I/O workers that fill them from the vault.
//!
//! [`Streamer::prefetch`] and [`Streamer::claim`] run in the caller's thread
//! and only touch atomics (see `slots`); reads happen on the worker threads.
//! Nothing here knows about C: the `ffi` module wraps this API.

#[cfg(not(loom))]
pub(crate) mod elastic;
#[cfg(not(loom))]
mod drive;
#[cfg(not(loom))]
mod predict;
#[cfg(not(loom))]
mod prewarm;
mod ring;
pub(crate) mod slots;
#[cfg(not(loom))]
mod worker;

pub use crate::config::{Config, Policy, Populate, Stats};
#[cfg(not(loom))]
pub use imp::*;
#[cfg(not(loom))]
#[doc(hidden)]
pub use worker::{BlobReader, FileReader};

#[cfg(not(loom))]
mod imp {
    use std::collections::HashMap;
    use std::ops::Deref;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use crossbeam_utils::CachePadded;

    use super::drive::DriveClock;
    use super::elastic::{self, ElasticState};
    use super::predict::Predictions;
    use super::prewarm;
    use super::ring::Ring;
    use super::slots::{Claimed, Origin, Prefetched, SetClaim, Shape, SlotTable, Spare};
    use super::worker;
    use super::{Config, Stats};
    use crate::budget::RingPlan;
    use crate::error::{Error, ErrorKind, Result};
    use crate::model::window::IO_ALIGN;
    use crate::popularity::Histogram;
    use crate::sys::{DirectIo, OpenRegularError, OpenedFile, PressureProbe};
    use crate::trace::TraceRecorder;
    use crate::vault::ModelFile;
    use crate::vault::{Entry, Vault, DEFAULT_ALIGNMENT};
    use std::fs::File;

    // A ring has at most one slot per vault entry, so the slot table's
    // ticket field (20 bits) holds every slot index.
    const _: () = assert!(super::slots::MAX_SLOTS >= crate::vault::MAX_EXPERT_IDS);

    /// `claim_wait`'s short spin before it sleeps: rounds of 2, 4, ... 64
    /// spin hints, a few microseconds in all.
    const SPIN_ROUNDS: u32 = 12;

    /// Then `claim_wait` polls, yielding its core between tries, until this
    /// long after the call, and only then sleeps: a read that lands by then
    /// costs no wake-up, which on a virtual machine (an idle vCPU woken by
    /// the host) took 20–50 µs more than a busy poll (`cargo bench --bench
    /// claim_wait`). Longer waits burn at most this much CPU.
    const POLL_FOR: Duration = Duration::from_micros(500);

    /// Default number of I/O workers.
    pub const DEFAULT_WORKERS: u32 = 16;
    /// Most I/O workers a streamer runs.
    pub const MAX_WORKERS: u32 = 64;
    pub use crate::config::DEFAULT_TRACE_CAPACITY;

    /// How urgently an expert is wanted.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Priority {
        /// The engine needs it for the layer it is on.
        Demand,
        /// A bet on a deeper gate rank or the next token.
        Speculative,
    }

    /// Counters updated from many threads; each on its own cache line.
    #[derive(Default)]
    pub(crate) struct Counters {
        /// OK claims not counted in the histogram (`count_claims` off).
        pub(crate) claims_uncounted: CachePadded<AtomicU64>,
        /// OK claims with `hit` false (a demand read was needed). Kept
        /// instead of hits: it is the rare path, so a hit costs no counter.
        pub(crate) misses: CachePadded<AtomicU64>,
        pub(crate) pending: CachePadded<AtomicU64>,
        pub(crate) bytes_read: CachePadded<AtomicU64>,
        pub(crate) reads_demand: CachePadded<AtomicU64>,
        pub(crate) reads_speculative: CachePadded<AtomicU64>,
        pub(crate) reads_prewarm: CachePadded<AtomicU64>,
        pub(crate) io_errors: CachePadded<AtomicU64>,
        pub(crate) checksum_errors: CachePadded<AtomicU64>,
        pub(crate) bytes_moved: CachePadded<AtomicU64>,
        /// Bytes of speculative reads (no claim waited for them).
        pub(crate) bytes_speculative: CachePadded<AtomicU64>,
        /// Members of demand sets whose layer had a bet outstanding.
        pub(crate) prediction_routed: CachePadded<AtomicU64>,
        /// Of those, the members the bet named.
        pub(crate) prediction_hits: CachePadded<AtomicU64>,
        /// Speculative reads dropped before they began: their layer's set
        /// arrived without them.
        pub(crate) speculative_dropped: CachePadded<AtomicU64>,
    }

    /// What the streamer's threads share.
    pub(crate) struct Shared {
        pub(crate) vault: Vault,
        pub(crate) table: SlotTable,
        pub(crate) ring: Ring,
        pub(crate) slot_bytes: u64,
        pub(crate) verify: bool,
        pub(crate) counters: Counters,
        /// Errors of failed reads, by dense id, until a claim reports them.
        /// Touched only when a read fails and when a claim finds its failure
        /// flag set; never on the normal prefetch/claim/release path.
        pub(crate) errors: Mutex<HashMap<u32, Error>>,
        /// Set when a library thread panicked: every later call fails.
        pub(crate) broken: AtomicBool,
        pub(crate) shutdown: AtomicBool,
        pub(crate) wake: worker::Wake,
        /// Where `claim_wait` sleeps until a read lands.
        pub(crate) landed: worker::Landed,
        /// How the workers read blobs ([`worker::BlobReader`]).
        pub(crate) reader: Box<dyn worker::BlobReader>,
        /// Claim counts, persisted across sessions; drives pre-warm.
        pub(crate) histogram: Histogram,
        pub(crate) count_claims: bool,
        /// The histogram's total at open: claims this session are its
        /// growth since.
        pub(crate) histogram_base: u64,
        pub(crate) prewarm: prewarm::Control,
        /// Trace capture (`trace_path`), when on.
        pub(crate) trace: Option<TraceRecorder>,
        /// The elastic ring's slot count and counters.
        pub(crate) elastic: ElasticState,
        /// The ring's pages promised to the sizing and not committed yet
        /// (a ring committed at open): the populate loop settles them.
        pub(crate) promise: crate::budget::Promise,
        /// The bets outstanding on each layer's routing (speculative
        /// prefetches), settled by the layer's next demand set.
        pub(crate) predictions: Predictions,
        /// The engine's busy time and the drive's idle time within it.
        pub(crate) drive: DriveClock,
    }

    /// Streams expert blobs from a vault into a ring of slots. See the module
    /// doc and docs/c-api.md.
    pub struct Streamer {
        shared: Arc<Shared>,
        threads: Vec<JoinHandle<()>>,
        prewarm_thread: Option<JoinHandle<()>>,
        /// The memory thread (populate, elastic monitor), when either is on.
        memory_thread: Option<JoinHandle<()>>,
        workers: u32,
        direct_all: bool,
        warnings: Vec<String>,
        plan: RingPlan,
    }

    /// One claim's view of a slot (also what the C API's `smoe_slot` holds).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct SlotInfo {
        /// First byte of the payload (16 KB aligned).
        pub data: *const u8,
        /// Payload bytes.
        pub size: u64,
        /// Pass to [`Streamer::release_ticket`].
        pub ticket: u64,
        /// `data == ring base + slot_index × slot_bytes`.
        pub slot_index: u32,
        /// Layer id.
        pub layer: u32,
        /// Expert id.
        pub expert: u32,
        /// No demand read was needed (docs/c-api.md).
        pub hit: bool,
    }

    /// How often a wait asks its host whether to go on, and the question.
    struct Wake<'a> {
        every: Duration,
        keep_waiting: Option<&'a mut dyn FnMut() -> bool>,
    }

    impl Wake<'static> {
        /// A wait nobody stops.
        fn never() -> Wake<'static> {
            Wake {
                every: Duration::MAX,
                keep_waiting: None,
            }
        }
    }

    /// A claimed expert: derefs to its payload bytes and releases on drop.
    pub struct Claim<'s> {
        streamer: &'s Streamer,
        info: SlotInfo,
    }

    impl Claim<'_> {
        /// The claim's slot, ticket and flags.
        pub fn info(&self) -> SlotInfo {
            self.info
        }
        /// Whether no demand read was needed.
        pub fn hit(&self) -> bool {
            self.info.hit
        }
        /// Keeps the claim past this guard; release it with
        /// [`Streamer::release_ticket`].
        pub fn into_ticket(self) -> SlotInfo {
            let info = self.info;
            std::mem::forget(self);
            info
        }
    }

    impl Deref for Claim<'_> {
        type Target = [u8];
        fn deref(&self) -> &[u8] {
            // SAFETY: the claim holds a refcount on the slot, so the slot
            // table never lets a worker rewrite these bytes until the claim
            // is released; `size ≤ slot_bytes` was checked at open.
            unsafe { std::slice::from_raw_parts(self.info.data, self.info.size as usize) }
        }
    }

    impl Drop for Claim<'_> {
        fn drop(&mut self) {
            // A guard's ticket is always held, so this cannot be stale.
            let _ = self.streamer.release_ticket(self.info.ticket);
        }
    }

    impl std::fmt::Debug for Claim<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Claim").field("info", &self.info).finish()
        }
    }

    // SAFETY: `data` points into the streamer's ring, which outlives every
    // claim; the pointer is only read through while the claim is held.
    unsafe impl Send for SlotInfo {}
    // SAFETY: as above.
    unsafe impl Sync for SlotInfo {}

    impl Streamer {
        /// Opens the vault at `path` (directory or `experts.smoe`), allocates
        /// the ring and starts the workers.
        ///
        /// # Examples
        ///
        /// ```
        /// use smoe::{Config, Streamer};
        ///
        /// # let dir = tempfile::tempdir()?;
        /// # let spec = smoe::vault::synth::SynthSpec {
        /// #     n_layers: 2, n_experts: 8, blob_bytes: 20_000, dense_layers: vec![], seed: 7, top_k: 2,
        /// # };
        /// # spec.write(dir.path(), &mut |_| {})?;
        /// # let vault_dir = dir.path();
        /// let s = Streamer::open(vault_dir, Config { ring_slots: 4, ..Config::default() })?;
        /// assert_eq!(s.stats().ring_slots, 4);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn open(path: impl AsRef<Path>, config: Config) -> Result<Streamer> {
            let vault = Vault::open(path)?;
            Self::with_vault(vault, config)
        }

        /// Like [`Streamer::open`], for a vault already opened.
        pub fn with_vault(vault: Vault, config: Config) -> Result<Streamer> {
            Self::with_reader(vault, config, worker::FileReader)
        }

        /// [`Streamer::with_vault`] whose workers read blobs through
        /// `reader` instead of [`FileReader`](super::FileReader): the seam
        /// tests use to put a faulty disk under the streamer (a failing
        /// region, a panicking read). Not part of the API.
        #[doc(hidden)]
        pub fn with_reader(
            vault: Vault,
            config: Config,
            reader: impl worker::BlobReader,
        ) -> Result<Streamer> {
            let resolved = Resolved::new(&vault, &config)?;
            Self::start(vault, &config, resolved, Box::new(reader))
        }

        /// Starts a streamer from its resolved parts: shares them with the
        /// I/O workers and the pre-warm thread, and starts those threads. On
        /// failure, stops and joins whatever had started.
        fn start(
            vault: Vault,
            config: &Config,
            resolved: Resolved,
            reader: Box<dyn worker::BlobReader>,
        ) -> Result<Streamer> {
            let Resolved {
                workers,
                plan,
                ring,
                files,
                direct_all,
                histogram,
                prewarm_budget,
                trace,
                probe,
                promise,
                warnings,
            } = resolved;
            let ids = vault.header().expert_ids() as u32;
            let histogram_base = histogram.total();
            let shared = Arc::new(Shared {
                histogram,
                count_claims: config.count_claims,
                histogram_base,
                prewarm: prewarm::Control::new(prewarm_budget),
                trace,
                table: SlotTable::with_shape(
                    plan.slots,
                    ids,
                    Shape {
                        policy: config.policy,
                        experts_per_layer: vault.header().n_experts.max(1),
                        layers: vault.header().n_layers.max(1),
                    },
                ),
                elastic: ElasticState::new(plan.slots),
                ring,
                slot_bytes: plan.slot_bytes,
                verify: config.verify,
                counters: Counters::default(),
                errors: Mutex::new(HashMap::new()),
                broken: AtomicBool::new(false),
                shutdown: AtomicBool::new(false),
                wake: worker::Wake::new(workers),
                landed: worker::Landed::new(),
                reader,
                promise,
                predictions: Predictions::new(ids),
                drive: DriveClock::default(),
                vault,
            });
            // A locked ring is committed already; a pinned one is about to
            // be, by the host's registration, which is quicker on committed
            // pages.
            let mut populate =
                (config.populate != crate::config::Populate::Off || config.pinned) && !config.lock;
            if populate && config.populate == crate::config::Populate::Open {
                // Before open returns, with the threads the machine has (up
                // to 8): first touches cost most where memory is virtualised
                // (0.4 GB/s a thread on the development VM), and they scale.
                // Before any thread of the streamer starts, so that nothing
                // is left running if it fails.
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
                elastic::populate(&shared, probe.as_ref(), threads);
                populate = false;
            }
            let mut threads = start_workers(&shared, files)?;
            let prewarm_thread = if prewarm_budget > 0 {
                match start_prewarm(&shared) {
                    Ok(thread) => Some(thread),
                    Err(err) => {
                        stop(&shared, &mut threads, &mut None);
                        return Err(err);
                    }
                }
            } else {
                None
            };
            let memory_thread = if populate || probe.is_some() {
                match start_memory(&shared, populate, probe) {
                    Ok(thread) => Some(thread),
                    Err(err) => {
                        let mut prewarm_thread = prewarm_thread;
                        stop(&shared, &mut threads, &mut prewarm_thread);
                        return Err(err);
                    }
                }
            } else {
                None
            };
            Ok(Streamer {
                shared,
                threads,
                prewarm_thread,
                memory_thread,
                workers,
                direct_all,
                warnings,
                plan,
            })
        }

        /// The vault being streamed.
        pub fn vault(&self) -> &Vault {
            &self.shared.vault
        }

        /// How the ring was sized: every input, intermediate value and
        /// where each came from.
        pub fn plan(&self) -> &RingPlan {
            &self.plan
        }

        /// Warnings recorded at open (e.g. the fallback to buffered I/O).
        pub fn warnings(&self) -> &[String] {
            &self.warnings
        }

        fn check_alive(&self) -> Result<()> {
            if self.shared.broken.load(Ordering::Acquire) {
                return Err(Error::new(
                    ErrorKind::Internal,
                    "the streamer failed earlier (a library thread panicked); close it",
                ));
            }
            Ok(())
        }

        /// The dense id, entry position and entry of (layer, expert).
        #[inline]
        fn id_of(&self, layer: u32, expert: u32) -> Result<(u32, u32, &Entry)> {
            let v = &self.shared.vault;
            v.dense_id(layer, expert)
                .and_then(|id| {
                    let index = v.entry_index(id)?;
                    Some((id, index, &v.entries()[index as usize]))
                })
                .ok_or_else(|| {
                    Error::expert_is(
                        ErrorKind::NotFound,
                        layer,
                        expert,
                        format!(
                            "is not in the vault ({} layers × {} experts, {} entries)",
                            v.n_layers(),
                            v.n_experts(),
                            v.entries().len()
                        ),
                    )
                })
        }

        /// Makes sure (layer, expert) is resident or on its way; never waits
        /// for I/O. Prefetching an expert that is resident or in flight reads
        /// nothing.
        ///
        /// # Examples
        ///
        /// An engine prefetches a layer's chosen experts as demand as soon as
        /// its router has run, and bets on the next layer's as speculation:
        ///
        /// ```
        /// use smoe::{Config, Priority, Streamer};
        ///
        /// # let dir = tempfile::tempdir()?;
        /// # let spec = smoe::vault::synth::SynthSpec {
        /// #     n_layers: 2, n_experts: 8, blob_bytes: 20_000, dense_layers: vec![], seed: 7, top_k: 2,
        /// # };
        /// # spec.write(dir.path(), &mut |_| {})?;
        /// # let vault_dir = dir.path();
        /// let s = Streamer::open(vault_dir, Config::default())?;
        /// for expert in [3, 5] {
        ///     s.prefetch(0, expert, Priority::Demand)?;
        /// }
        /// s.prefetch(1, 2, Priority::Speculative)?;
        /// s.prefetch(0, 3, Priority::Demand)?; // in flight already: no second read
        /// assert!(s.prefetch(0, 99, Priority::Demand).is_err(), "not in the vault");
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn prefetch(&self, layer: u32, expert: u32, priority: Priority) -> Result<()> {
            self.check_alive()?;
            let (id, _, _) = self.id_of(layer, expert)?;
            let origin = match priority {
                Priority::Demand => Origin::Demand,
                Priority::Speculative => {
                    self.shared.predictions.bet(id);
                    Origin::Speculative
                }
            };
            match self.shared.table.prefetch(id, origin) {
                Prefetched::Queued { .. } => {
                    self.shared.wake.one();
                    Ok(())
                }
                Prefetched::Present | Prefetched::ErrorPending => Ok(()),
                Prefetched::RingFull => {
                    dropped_reservation(&self.shared);
                    Err(ring_full(&self.shared, layer, expert))
                }
            }
        }

        /// Claims (layer, expert) if its data is in the ring; `Ok(None)`
        /// (pending) otherwise, after making sure a demand read is queued.
        /// Never blocks. The claim releases when dropped.
        ///
        /// # Examples
        ///
        /// A polling loop always ends: the first claim queues the read.
        ///
        /// ```
        /// use smoe::{Config, Streamer};
        ///
        /// # let dir = tempfile::tempdir()?;
        /// # let spec = smoe::vault::synth::SynthSpec {
        /// #     n_layers: 2, n_experts: 8, blob_bytes: 20_000, dense_layers: vec![], seed: 7, top_k: 2,
        /// # };
        /// # spec.write(dir.path(), &mut |_| {})?;
        /// # let vault_dir = dir.path();
        /// let s = Streamer::open(vault_dir, Config::default())?;
        /// let claim = loop {
        ///     if let Some(c) = s.claim(1, 4)? {
        ///         break c;
        ///     }
        ///     std::thread::yield_now();
        /// };
        /// assert!(!claim.hit(), "the first claim needed a read");
        /// assert_eq!(claim.as_ptr() as usize % 16384, 0, "slot data is aligned");
        /// drop(claim); // released; the data stays retained
        /// assert!(s.claim(1, 4)?.unwrap().hit(), "a later claim is a hit");
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn claim(&self, layer: u32, expert: u32) -> Result<Option<Claim<'_>>> {
            Ok(self.claim_ticket(layer, expert)?.map(|info| Claim {
                streamer: self,
                info,
            }))
        }

        /// [`Streamer::claim`] for callers that keep the claim past a Rust
        /// scope (the C API): release with [`Streamer::release_ticket`].
        ///
        /// # Examples
        ///
        /// ```
        /// use std::time::Duration;
        /// use smoe::{Config, ErrorKind, Priority, Streamer};
        ///
        /// # let dir = tempfile::tempdir()?;
        /// # let spec = smoe::vault::synth::SynthSpec {
        /// #     n_layers: 2, n_experts: 8, blob_bytes: 20_000, dense_layers: vec![], seed: 7, top_k: 2,
        /// # };
        /// # spec.write(dir.path(), &mut |_| {})?;
        /// # let vault_dir = dir.path();
        /// let s = Streamer::open(vault_dir, Config::default())?;
        /// s.prefetch(0, 1, Priority::Demand)?;
        /// drop(s.claim_wait(0, 1, Duration::from_secs(10))?.expect("read in time"));
        /// let info = s.claim_ticket(0, 1)?.expect("retained");
        /// // ... hand `info.data` and `info.size` to the engine ...
        /// s.release_ticket(info.ticket)?;
        /// let again = s.release_ticket(info.ticket).unwrap_err();
        /// assert_eq!(again.kind(), ErrorKind::Stale, "each claim is released once");
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn claim_ticket(&self, layer: u32, expert: u32) -> Result<Option<SlotInfo>> {
            let claimed = self.try_claim(layer, expert)?;
            if claimed.is_none() {
                self.shared.counters.pending.fetch_add(1, Ordering::Relaxed);
            }
            Ok(claimed)
        }

        /// One claim attempt; pending is counted by the caller, so the polls
        /// inside `claim_wait` count once, and only if it times out.
        fn try_claim(&self, layer: u32, expert: u32) -> Result<Option<SlotInfo>> {
            self.check_alive()?;
            let (id, index, entry) = self.id_of(layer, expert)?;
            let claimed = self.shared.table.claim(id);
            self.finish_claim(layer, expert, id, index, entry, claimed)
        }

        /// What a claim of (layer, expert), dense id `id` at entry `index`,
        /// answered: the slot (counted in the histogram, the trace and the
        /// misses), `None` while it loads, or the error.
        #[inline]
        fn finish_claim(
            &self,
            layer: u32,
            expert: u32,
            id: u32,
            index: u32,
            entry: &Entry,
            claimed: Claimed,
        ) -> Result<Option<SlotInfo>> {
            let c = &self.shared.counters;
            match claimed {
                Claimed::Ready { slot, ticket, hit } => {
                    // The histogram's per-expert counter is the claim
                    // counter: an OK hit costs no other shared write.
                    if self.shared.count_claims {
                        self.shared.histogram.bump_entry(index);
                    } else {
                        c.claims_uncounted.fetch_add(1, Ordering::Relaxed);
                    }
                    if !hit {
                        c.misses.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Some(trace) = &self.shared.trace {
                        trace.record(id);
                    }
                    Ok(Some(SlotInfo {
                        data: self.shared.ring.slot_ptr(slot),
                        size: entry.size,
                        ticket,
                        slot_index: slot,
                        layer,
                        expert,
                        hit,
                    }))
                }
                Claimed::Pending { queued } => {
                    if queued {
                        self.shared.wake.one();
                    }
                    Ok(None)
                }
                Claimed::Absent => Ok(None),
                Claimed::Failed => {
                    let err = self
                        .shared
                        .errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id);
                    Err(err.unwrap_or_else(|| {
                        Error::new(ErrorKind::Io, "the last read failed").with_expert(layer, expert)
                    }))
                }
                Claimed::RingFull => {
                    dropped_reservation(&self.shared);
                    Err(ring_full(&self.shared, layer, expert))
                }
                Claimed::TooManyClaims => Err(Error::expert_is(
                    ErrorKind::Argument,
                    layer,
                    expert,
                    format!(
                        "already has the most unreleased claims its slot counts ({}, or {} per \
                         thread shard once threads claim it at once)",
                        super::slots::MAX_REFS,
                        super::slots::MAX_PINS
                    ),
                )),
            }
        }

        /// Claims (layer, expert), waiting up to `timeout` for its read: it
        /// spins briefly, polls (yielding its core) until 500 µs after the
        /// call, then sleeps until a worker finishes a read (it burns no CPU
        /// while it sleeps, and wakes as soon as its read lands or fails).
        /// `Ok(None)` at the timeout.
        ///
        /// # Examples
        ///
        /// ```
        /// use std::time::Duration;
        /// use smoe::{Config, Streamer};
        ///
        /// # let dir = tempfile::tempdir()?;
        /// # let spec = smoe::vault::synth::SynthSpec {
        /// #     n_layers: 2, n_experts: 8, blob_bytes: 20_000, dense_layers: vec![], seed: 7, top_k: 2,
        /// # };
        /// # spec.write(dir.path(), &mut |_| {})?;
        /// # let vault_dir = dir.path();
        /// let s = Streamer::open(vault_dir, Config::default())?;
        /// if let Some(claim) = s.claim_wait(1, 6, Duration::from_secs(10))? {
        ///     let weights: &[u8] = &claim; // the blob's bytes, in the ring
        ///     assert_eq!(weights.len() as u64, s.expert_info(1, 6)?.size);
        /// }
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn claim_wait(
            &self,
            layer: u32,
            expert: u32,
            timeout: Duration,
        ) -> Result<Option<Claim<'_>>> {
            Ok(self
                .claim_wait_ticket(layer, expert, timeout)?
                .map(|info| Claim {
                    streamer: self,
                    info,
                }))
        }

        /// [`Streamer::claim_wait`] returning a ticket.
        pub fn claim_wait_ticket(
            &self,
            layer: u32,
            expert: u32,
            timeout: Duration,
        ) -> Result<Option<SlotInfo>> {
            self.wait_for_claim(timeout, Wake::never(), || self.try_claim(layer, expert))
        }

        /// [`Streamer::claim_wait_ticket`] that a host can stop: it calls
        /// `keep_waiting` at least every `every` while it waits and gives
        /// up (`Ok(None)`, one pending claim counted, as a timeout) when
        /// that returns false. For a binding whose waits must answer a
        /// signal or a close from another thread (the Python package's
        /// Ctrl-C) without cutting one wait into many, each counted pending.
        pub fn claim_wait_ticket_until(
            &self,
            layer: u32,
            expert: u32,
            timeout: Duration,
            every: Duration,
            keep_waiting: &mut dyn FnMut() -> bool,
        ) -> Result<Option<SlotInfo>> {
            let wake = Wake {
                every,
                keep_waiting: Some(keep_waiting),
            };
            self.wait_for_claim(timeout, wake, || self.try_claim(layer, expert))
        }

        /// Calls `attempt` until it gives a claim or an error, or `timeout`
        /// passes (`Ok(None)`, counted as pending): it spins briefly, polls
        /// (yielding its core) until 500 µs after the call, then sleeps until
        /// a worker finishes a read, and tries again after each. A zero
        /// timeout makes one attempt and never spins.
        #[inline(never)]
        fn wait_for_claim(
            &self,
            timeout: Duration,
            wake: Wake<'_>,
            mut attempt: impl FnMut() -> Result<Option<SlotInfo>>,
        ) -> Result<Option<SlotInfo>> {
            if timeout.is_zero() {
                // 0 never waits (docs/c-api.md): one attempt, which queues
                // what it must, and no spins in which a read could land.
                let claimed = attempt()?;
                if claimed.is_none() {
                    self.shared.counters.pending.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(claimed);
            }
            let start = Instant::now();
            let deadline = start
                .checked_add(timeout)
                .unwrap_or(start + Duration::from_secs(86400 * 365));
            // A few short spins first: a read that is about to land costs no
            // sleep and wake-up.
            for round in 0..SPIN_ROUNDS {
                if let Some(info) = attempt()? {
                    return Ok(Some(info));
                }
                for _ in 0..(1u32 << round.min(6)) {
                    std::hint::spin_loop();
                }
            }
            // Then poll, yielding the core between tries (other threads, the
            // workers among them, run meanwhile), for up to POLL_FOR.
            let poll_until = deadline.min(start + POLL_FOR);
            while Instant::now() < poll_until {
                if let Some(info) = attempt()? {
                    return Ok(Some(info));
                }
                std::thread::yield_now();
            }
            // Then sleep until a read lands (a worker wakes us), trying again
            // after each; a host that can stop the wait is asked every
            // `wake.every` whether to go on.
            let Wake {
                every,
                mut keep_waiting,
            } = wake;
            let claimed = loop {
                let until = Instant::now()
                    .checked_add(every)
                    .map_or(deadline, |t| t.min(deadline));
                let claimed = self.shared.landed.wait_for(until, &mut attempt)?;
                // The host is asked only while nothing landed: a claim in
                // hand is returned, so a host that consumed a signal in
                // `keep_waiting` never sees it paired with a claim.
                if claimed.is_some() || until >= deadline {
                    break claimed;
                }
                if keep_waiting.as_mut().is_some_and(|k| !k()) {
                    break None;
                }
            };
            if claimed.is_none() {
                self.shared.counters.pending.fetch_add(1, Ordering::Relaxed);
            }
            Ok(claimed)
        }

        /// Queues the reads of a layer's working set (docs/c-api.md
        /// "Working sets"), in the order given: a member that
        /// is resident or in flight costs nothing and takes no slot; later
        /// members never evict earlier ones that wait unclaimed. Never
        /// waits. Returns how many members (duplicates counted) are now
        /// resident or in flight, or hold the error of a failed read for
        /// their next claim (as [`Streamer::prefetch`] answers them): all
        /// of them, or fewer when the ring could not take the rest (every
        /// slot held or loading), which [`Streamer::claim_any`] then queues
        /// as slots free up.
        ///
        /// # Errors
        ///
        /// [`ErrorKind::NotFound`] naming the layer (for an empty set too)
        /// or the first member not in the vault; nothing is queued then.
        ///
        /// # Examples
        ///
        /// ```
        /// use smoe::{Config, Priority, Streamer};
        ///
        /// # let dir = tempfile::tempdir()?;
        /// # let spec = smoe::vault::synth::SynthSpec {
        /// #     n_layers: 2, n_experts: 8, blob_bytes: 20_000, dense_layers: vec![], seed: 7, top_k: 2,
        /// # };
        /// # spec.write(dir.path(), &mut |_| {})?;
        /// # let vault_dir = dir.path();
        /// let s = Streamer::open(vault_dir, Config { ring_slots: 8, ..Config::default() })?;
        /// let set = [3, 5, 1, 3];
        /// assert_eq!(s.prefetch_set(0, &set, Priority::Demand)?, 4, "all queued");
        /// assert!(s.prefetch_set(0, &[9], Priority::Demand).is_err(), "not in the vault");
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn prefetch_set(&self, layer: u32, experts: &[u32], priority: Priority) -> Result<u32> {
            self.check_alive()?;
            let base = self.check_set(layer, experts)?;
            let origin = match priority {
                Priority::Demand => Origin::Demand,
                Priority::Speculative => Origin::Speculative,
            };
            let t = &self.shared.table;
            let n_experts = self.shared.vault.n_experts();
            match priority {
                // The layer's real set: settle its bet first, so that the
                // slots of dropped bets are free for the set's reads.
                Priority::Demand => self.settle(layer, base, experts),
                Priority::Speculative => {
                    for &expert in experts {
                        self.shared.predictions.bet(base + expert);
                    }
                }
            }
            // Built at the first member that needs a slot (a set of
            // residents costs no bitmap).
            let mut bits = None;
            let mut present = 0u32;
            let mut full = false;
            for &expert in experts {
                let id = base + expert;
                if t.refresh(id, origin) {
                    // Resident (kept recent) or in flight (a demand set
                    // promotes a speculative read).
                    present += 1;
                    continue;
                }
                if full {
                    // The ring took no more: queue nothing.
                    continue;
                }
                let spare = bits
                    .get_or_insert_with(|| SetBits::new(base, n_experts, experts))
                    .spare(experts);
                match t.prefetch_sparing(id, origin, spare) {
                    Prefetched::Queued { .. } => {
                        self.shared.wake.one();
                        present += 1;
                    }
                    // A member whose last read failed counts as `prefetch`
                    // answers it: its claim reports the failure (and a
                    // later prefetch reads it again). Not counting it made
                    // the C API answer RING_FULL on an empty ring.
                    Prefetched::Present | Prefetched::ErrorPending => present += 1,
                    Prefetched::RingFull => {
                        dropped_reservation(&self.shared);
                        full = true;
                    }
                }
            }
            Ok(present)
        }

        /// Settles the bet outstanding on `layer` (dense ids from `base`)
        /// against its routed set: counts the prediction's hits and drops
        /// the predicted reads the set does not name that have not begun.
        fn settle(&self, layer: u32, base: u32, routed: &[u32]) {
            let _ = layer;
            let shared = &self.shared;
            let n = shared.vault.n_experts();
            // A bet the set does not name: its read is dropped if it has not
            // begun, else, once read, its slot is the first to evict.
            let settled = shared.predictions.settle(base, n, routed, |id| {
                shared.table.drop_speculative(id) || {
                    shared.table.demote_speculative(id);
                    false
                }
            });
            if settled.routed == 0 && settled.dropped == 0 {
                return;
            }
            let c = &shared.counters;
            c.prediction_routed
                .fetch_add(settled.routed, Ordering::Relaxed);
            c.prediction_hits
                .fetch_add(settled.predicted, Ordering::Relaxed);
            if settled.dropped > 0 {
                c.speculative_dropped
                    .fetch_add(settled.dropped, Ordering::Relaxed);
                // A claim waiting on a dropped read would wait for a landing
                // that never comes: it looks again (and queues its own).
                shared.landed.notify();
            }
        }

        /// Claims one member of a layer's working set (docs/c-api.md
        /// "Working sets"): a resident one if any (a retained hit or a
        /// finished load, in the set's order), else the first whose read completes, waiting up to
        /// `timeout` (`Duration::ZERO`: never wait). Members that are
        /// neither resident nor in flight get demand reads as slots free
        /// up; a read in flight is marked demand. The claim's
        /// [`Claim::info`] says which expert it is: remove it from the set
        /// before the next call. `Ok(None)` at the timeout.
        ///
        /// # Errors
        ///
        /// - [`ErrorKind::RingFull`] at once when no member is resident or in
        ///   flight and every active slot is held: only a release can make
        ///   room, so waiting would never end.
        /// - A member's failed read, with that member's layer and expert
        ///   ([`Error::layer_expert`]).
        /// - [`ErrorKind::NotFound`] naming the layer or the first member
        ///   not in the vault: every member is checked first, and nothing
        ///   is claimed or queued then. [`ErrorKind::Argument`] for an
        ///   empty set, or when every member that can be claimed already
        ///   holds the most claims its slot counts (a member at that limit
        ///   is passed over while another can be claimed).
        ///
        /// # Examples
        ///
        /// Per expert: hand over the set, then compute whatever is in memory
        /// first.
        ///
        /// ```
        /// use std::time::Duration;
        /// use smoe::{Config, Priority, Streamer};
        ///
        /// # let dir = tempfile::tempdir()?;
        /// # let spec = smoe::vault::synth::SynthSpec {
        /// #     n_layers: 2, n_experts: 8, blob_bytes: 20_000, dense_layers: vec![], seed: 7, top_k: 2,
        /// # };
        /// # spec.write(dir.path(), &mut |_| {})?;
        /// # let vault_dir = dir.path();
        /// let s = Streamer::open(vault_dir, Config { ring_slots: 4, ..Config::default() })?;
        /// let mut set = vec![6, 2, 7, 0, 5, 1];
        /// s.prefetch_set(1, &set, Priority::Demand)?;
        /// while !set.is_empty() {
        ///     let claim = s.claim_any(1, &set, Duration::from_secs(10))?.expect("read in time");
        ///     let expert = claim.info().expert;
        ///     // ... compute expert `expert` from `&claim[..]` ...
        ///     set.retain(|&e| e != expert);
        /// } // each claim is released when dropped, making room for the rest
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn claim_any(
            &self,
            layer: u32,
            experts: &[u32],
            timeout: Duration,
        ) -> Result<Option<Claim<'_>>> {
            Ok(self
                .claim_any_ticket(layer, experts, timeout)?
                .map(|info| Claim {
                    streamer: self,
                    info,
                }))
        }

        /// [`Streamer::claim_any`] returning a ticket.
        pub fn claim_any_ticket(
            &self,
            layer: u32,
            experts: &[u32],
            timeout: Duration,
        ) -> Result<Option<SlotInfo>> {
            if experts.is_empty() {
                return Err(Error::argument(format!(
                    "the working set of layer {layer} is empty: there is nothing to claim"
                )));
            }
            // Every member is checked before any is claimed: a member not in
            // the vault found after a claim would lose that claim (and a
            // member's read error, taken by the claim) with the error.
            let base = self.check_set(layer, experts)?;
            if timeout.is_zero() {
                let claimed = self.try_claim_any(layer, base, experts)?;
                if claimed.is_none() {
                    self.shared.counters.pending.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(claimed);
            }
            self.wait_for_claim(timeout, Wake::never(), || {
                self.try_claim_any(layer, base, experts)
            })
        }

        /// [`Streamer::claim_any_ticket`] that a host can stop, as
        /// [`Streamer::claim_wait_ticket_until`] is.
        pub fn claim_any_ticket_until(
            &self,
            layer: u32,
            experts: &[u32],
            timeout: Duration,
            every: Duration,
            keep_waiting: &mut dyn FnMut() -> bool,
        ) -> Result<Option<SlotInfo>> {
            if experts.is_empty() || timeout.is_zero() {
                return self.claim_any_ticket(layer, experts, timeout);
            }
            let base = self.check_set(layer, experts)?;
            let wake = Wake {
                every,
                keep_waiting: Some(keep_waiting),
            };
            self.wait_for_claim(timeout, wake, || self.try_claim_any(layer, base, experts))
        }

        /// One pass of [`Streamer::claim_any`] ([`SlotTable::claim_set`])
        /// over a set [`Streamer::check_set`] accepted, whose layer's first
        /// dense id is `base`: `None` while a member (or another expert,
        /// whose slot a member can take once it lands) is loading.
        fn try_claim_any(
            &self,
            layer: u32,
            base: u32,
            experts: &[u32],
        ) -> Result<Option<SlotInfo>> {
            self.check_alive()?;
            let t = &self.shared.table;
            // Built only when the pass queues (a set whose head is resident
            // costs no bitmap).
            let mut bits = None;
            let bits = &mut bits;
            let spare = move || {
                let n_experts = self.shared.vault.n_experts();
                // The set borrows the bitmap for the pass.
                { bits }
                    .insert(SetBits::new(base, n_experts, experts))
                    .spare(experts)
            };
            let active = self.shared.elastic.active.load(Ordering::Relaxed);
            let pass = t.claim_set(experts.len(), |k| base + experts[k], spare, active);
            for _ in 0..pass.queued {
                self.shared.wake.one();
            }
            if pass.ring_full {
                dropped_reservation(&self.shared);
            }
            match pass.found {
                SetClaim::Member { member, claimed } => {
                    let expert = experts[member];
                    let id = base + expert;
                    let index = self.shared.vault.entry_index(id).ok_or_else(|| {
                        Error::new(
                            ErrorKind::Internal,
                            "a working set member checked at the call has no entry",
                        )
                        .with_expert(layer, expert)
                    })?;
                    let entry = &self.shared.vault.entries()[index as usize];
                    self.finish_claim(layer, expert, id, index, entry, claimed)
                }
                SetClaim::Wait => Ok(None),
                SetClaim::Full => Err(ring_full(&self.shared, layer, experts[0])),
            }
        }

        /// Checks a working set of `layer` before anything of it is queued
        /// or claimed: the layer is in the vault (for an empty set too), and
        /// so is every member. The layer's first dense id, so that each
        /// member's is `base + expert`.
        ///
        /// # Errors
        ///
        /// [`ErrorKind::NotFound`] naming the layer, or the first member
        /// not in the vault.
        fn check_set(&self, layer: u32, experts: &[u32]) -> Result<u32> {
            let v = &self.shared.vault;
            let base = layer
                .checked_mul(v.n_experts())
                .filter(|_| layer < v.n_layers())
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::NotFound,
                        format!(
                            "layer {layer} is not in the vault ({} layers × {} experts)",
                            v.n_layers(),
                            v.n_experts()
                        ),
                    )
                })?;
            for &expert in experts {
                self.id_of(layer, expert)?;
            }
            Ok(base)
        }

        /// Releases a claim by its ticket. Stale (and nothing changes) when
        /// the ticket is not held: never claimed, already released, or its
        /// slot was evicted and reloaded. A second release while another
        /// claim with an equal ticket is held cannot be told from that
        /// claim's, and drops its count (docs/c-api.md, "Claims").
        pub fn release_ticket(&self, ticket: u64) -> Result<()> {
            self.shared.table.release(ticket).map(|_| ()).map_err(|_| {
                Error::stale_ticket(
                    ticket,
                    super::slots::split_ticket(ticket),
                    "is not held: never claimed, already released, or its slot was reloaded",
                )
            })
        }

        /// Counters and sizes.
        ///
        /// # Examples
        ///
        /// ```
        /// use std::time::Duration;
        /// use smoe::{Config, Streamer};
        ///
        /// # let dir = tempfile::tempdir()?;
        /// # let spec = smoe::vault::synth::SynthSpec {
        /// #     n_layers: 2, n_experts: 8, blob_bytes: 20_000, dense_layers: vec![], seed: 7, top_k: 2,
        /// # };
        /// # spec.write(dir.path(), &mut |_| {})?;
        /// # let vault_dir = dir.path();
        /// let s = Streamer::open(vault_dir, Config { prewarm: false, ..Config::default() })?;
        /// for _ in 0..3 {
        ///     drop(s.claim_wait(0, 0, Duration::from_secs(10))?.expect("read in time"));
        /// }
        /// let st = s.stats();
        /// assert_eq!((st.claims, st.hits, st.reads_demand), (3, 2, 1));
        /// println!("coverage {:.0}%", 100.0 * st.hits as f64 / st.claims as f64);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn stats(&self) -> Stats {
            let c = &self.shared.counters;
            let r = |a: &CachePadded<AtomicU64>| a.load(Ordering::Relaxed);
            let trace = self.shared.trace.as_ref();
            let drive = self.shared.drive.times();
            let claims = self
                .shared
                .histogram
                .total()
                .wrapping_sub(self.shared.histogram_base)
                .wrapping_add(r(&c.claims_uncounted));
            Stats {
                claims,
                hits: claims.saturating_sub(r(&c.misses)),
                pending: r(&c.pending),
                bytes_read: r(&c.bytes_read),
                reads_demand: r(&c.reads_demand),
                reads_speculative: r(&c.reads_speculative),
                reads_prewarm: r(&c.reads_prewarm),
                evictions: self.shared.table.evictions(),
                io_errors: r(&c.io_errors),
                checksum_errors: r(&c.checksum_errors),
                resident: u64::from(self.shared.table.resident()),
                ring_slots: u64::from(self.shared.table.slots()),
                slot_bytes: self.shared.slot_bytes,
                workers: u64::from(self.workers),
                direct_io: u64::from(self.direct_all),
                freq_ignored: self.shared.histogram.freq_ignored(),
                prewarm_slots: u64::from(self.shared.prewarm.budget),
                trace_events: trace.map_or(0, TraceRecorder::recorded),
                trace_dropped: trace.map_or(0, TraceRecorder::dropped),
                policy: self.shared.table.policy() as u64,
                slots_active: u64::from(self.shared.elastic.active.load(Ordering::Relaxed)),
                shrinks: self.shared.elastic.shrinks.load(Ordering::Relaxed),
                grows: self.shared.elastic.grows.load(Ordering::Relaxed),
                slots_held: u64::from(self.shared.table.occupancy().held),
                evicted_unclaimed: self.shared.table.evicted_unclaimed(),
                bytes_moved: r(&c.bytes_moved),
                bytes_speculative: r(&c.bytes_speculative),
                bytes_speculative_unclaimed: r(&c.bytes_speculative)
                    .saturating_sub(self.shared.table.speculative_claimed_bytes()),
                prediction_routed: r(&c.prediction_routed),
                prediction_hits: r(&c.prediction_hits),
                speculative_dropped: r(&c.speculative_dropped),
                busy_ns: drive.busy_ns,
                drive_idle_ns: drive.idle_ns,
            }
        }

        /// Tells the pre-warm thread the engine is busy (`true`: once this
        /// returns, at most the one read it already issued may start) or idle
        /// (`false`: it resumes, re-warming what was evicted meanwhile).
        pub fn prewarm_pause(&self, busy: bool) {
            self.shared.prewarm.pause(busy);
            self.shared.drive.set_busy(busy);
        }

        /// Passes the pre-warm thread has made over its targets: for tests.
        #[doc(hidden)]
        pub fn prewarm_passes(&self) -> u64 {
            self.shared.prewarm.passes()
        }

        /// Persists the claim histogram now (atomically: temporary file,
        /// fsync, rename, directory fsync). A no-op when persistence is off,
        /// including when open found a file at the path that is not this
        /// vault's histogram ([`crate::popularity::Persistence::Protected`]).
        /// Fails, writing nothing, when such a file was put there since open.
        pub fn flush_stats(&self) -> Result<()> {
            self.check_alive()?;
            self.shared.histogram.persist()
        }

        /// Claim counts per dense id (`layer × n_experts + expert`),
        /// including earlier sessions'.
        pub fn histogram(&self) -> Vec<u64> {
            self.shared.histogram.snapshot()
        }

        /// The ring: base pointer, total bytes, bytes per slot.
        pub fn ring_region(&self) -> (*const u8, u64, u64) {
            (
                self.shared.ring.base(),
                self.shared.ring.bytes() as u64,
                self.shared.slot_bytes,
            )
        }

        /// The vault entry of (layer, expert).
        pub fn expert_info(&self, layer: u32, expert: u32) -> Result<Entry> {
            self.id_of(layer, expert).map(|(_, _, e)| *e)
        }

        /// Whether (layer, expert) is loaded in the ring right now.
        pub fn is_resident(&self, layer: u32, expert: u32) -> bool {
            self.shared
                .vault
                .dense_id(layer, expert)
                .is_some_and(|id| self.shared.table.resident_slot(id).is_some())
        }

        /// The slot index of each loaded expert, by LRU tick (oldest first):
        /// for tests and diagnostics.
        #[doc(hidden)]
        pub fn lru_order(&self) -> Vec<(u32, u32)> {
            let t = &self.shared.table;
            let n = self.shared.vault.n_experts();
            let mut v: Vec<(u64, u32)> = (0..t.slots())
                .filter(|&s| {
                    matches!(
                        t.word(s).state(),
                        super::slots::READY | super::slots::CONSUMED
                    )
                })
                .map(|s| (t.stamp(s), t.slot_id(s)))
                .collect();
            v.sort_unstable();
            v.into_iter().map(|(_, id)| (id / n, id % n)).collect()
        }
    }

    /// Everything a streamer is made of before any of its threads runs:
    /// decided (worker count, ring plan, pre-warm budget), allocated (the
    /// ring) and opened (one vault descriptor per worker, the histogram).
    struct Resolved {
        workers: u32,
        plan: RingPlan,
        ring: Ring,
        /// One per worker, each opened with the direct-I/O policy applied.
        files: Vec<Arc<[File]>>,
        /// Whether every descriptor in `files` does direct I/O.
        direct_all: bool,
        histogram: Histogram,
        prewarm_budget: u32,
        trace: Option<TraceRecorder>,
        /// The elastic ring's memory probe, when the ring is elastic.
        probe: Option<PressureProbe>,
        /// The ring's pages promised and not yet committed (a ring
        /// committed at open), settled by the populate loop.
        promise: crate::budget::Promise,
        /// The open-time warnings, for [`Streamer::warnings`].
        warnings: Vec<String>,
    }

    impl Resolved {
        /// Resolves `config` for `vault`, in this order: the worker count,
        /// the ring plan (docs/c-api.md, "Ring sizing") and its allocation, the workers'
        /// descriptors, the histogram, the pre-warm budget. Starts no
        /// thread.
        fn new(vault: &Vault, config: &Config) -> Result<Resolved> {
            let workers = worker_count(config.workers)?;
            let mut warnings: Vec<String> = Vec::new();
            // The pressure probe first: a ring that was to be elastic and
            // cannot read memory pressure is a fixed one, sized and (when
            // populated) checked as such.
            let budget = config.budget();
            let probe = if budget.is_elastic() {
                let probe = match &config.pressure_root {
                    Some(root) => PressureProbe::from_root(root),
                    None => PressureProbe::new(),
                };
                match probe {
                    Ok(probe) => Some(probe),
                    Err(e) => {
                        warnings.push(format!(
                            "the elastic ring is off: memory pressure cannot be read ({e})"
                        ));
                        None
                    }
                }
            } else {
                None
            };
            let budget = crate::budget::BudgetConfig {
                elastic: probe.is_some(),
                ..budget
            };
            // The sizing decides whether the ring is elastic (neither locked
            // nor pinned) and when its pages are committed, and checks that
            // it fits (budget::check_fits): the rules `smoe budget` applies.
            // A ring committed at open is promised until its pages are.
            let (plan, promise) = crate::budget::plan_to_open(vault, &budget)?;
            let ring_bytes = plan.ring_bytes;
            // Huge pages where blobs fill most of a huge page: slots of at
            // least 1 MiB that an override has not made much larger than the
            // blobs (a 100 KB blob in a huge page would commit 2 MiB; slots
            // are first used in index order, so a ring of 1 MiB slots commits
            // at most one huge page past its last used slot). With 1.2 MiB
            // slots a cold llama.cpp prefill took 0.92-0.96x the time of
            // 4 KiB pages (docs/performance.md).
            let huge = crate::sys::HUGE_PAGE_BYTES as u64;
            let huge_pages = config.huge_pages
                && plan.slot_bytes >= huge / 2
                && vault.max_padded_size().saturating_mul(2) >= plan.slot_bytes;
            let ring = Ring::new(plan.slots, plan.slot_bytes, huge_pages)?;
            if config.lock {
                ring.reservation().lock().map_err(|e| {
                    let kind = if e.raw_os_error() == Some(libc::EPERM) {
                        ErrorKind::Unsupported
                    } else {
                        ErrorKind::NoMemory
                    };
                    Error::new(
                        kind,
                        format!(
                            "lock: the OS refused to lock the ring of {ring_bytes} bytes in memory \
                             (mlock: {e}); raise the locked-memory limit (ulimit -l, \
                             RLIMIT_MEMLOCK) or open with lock off"
                        ),
                    )
                    .with_os_error(e.raw_os_error())
                })?;
                // mlock committed every page.
                promise.settle(ring_bytes);
            }
            warnings.extend(plan.warning());
            if config.verify && vault.model().is_some() {
                warnings.push(format!(
                    "verify is on, but {} is a model read in place, which carries no \
                     checksums: nothing is verified (smoe pack writes checksummed blobs)",
                    vault.path().display()
                ));
            }
            let (files, direct_all) = open_worker_files(vault, workers, config.direct_io)?;
            if !direct_all && config.direct_io == DirectIo::Auto {
                warnings.push(format!(
                    "direct I/O is not available for {}: reading through the page cache",
                    vault.path().display()
                ));
            }
            let (histogram, histogram_warnings) =
                Histogram::open_for_vault(vault, config.freq_path.as_deref());
            warnings.extend(histogram_warnings);
            let (trace, trace_warning) = TraceRecorder::open(
                vault,
                config.trace_path.as_deref(),
                histogram.persistence().path(),
                config.trace_capacity,
            );
            warnings.extend(trace_warning);
            Ok(Resolved {
                workers,
                prewarm_budget: prewarm_budget(config, plan.slots),
                plan,
                ring,
                files,
                direct_all,
                histogram,
                trace,
                probe,
                promise,
                // Paths and names in them are escaped: one warning stays
                // one line (`smoe_warnings` joins them with newlines), and
                // no byte of a name reaches a terminal raw.
                warnings: warnings
                    .iter()
                    .map(|w| crate::printable::escape(w).into_owned())
                    .collect(),
            })
        }
    }

    /// The worker count `requested` stands for: 0 is the default.
    fn worker_count(requested: u32) -> Result<u32> {
        match requested {
            0 => Ok(DEFAULT_WORKERS),
            n if n <= MAX_WORKERS => Ok(n),
            n => Err(Error::argument(format!(
                "workers is {n}, expected 1..={MAX_WORKERS} (or 0 for {DEFAULT_WORKERS})"
            ))),
        }
    }

    /// The slots the pre-warm thread may fill in a ring of `slots`: 0 when
    /// it is off, else the configured count (at most `slots`), else
    /// `slots − max(128, slots / 4)` (docs/c-api.md).
    fn prewarm_budget(config: &Config, slots: u32) -> u32 {
        if !config.prewarm {
            0
        } else if config.prewarm_slots > 0 {
            config.prewarm_slots.min(slots)
        } else {
            slots.saturating_sub(slots.div_ceil(4).max(128))
        }
    }

    /// The descriptors each I/O worker reads through, and whether all do
    /// direct I/O: for a vault, one descriptor of `experts.smoe` per
    /// worker; for a model, one descriptor of each of its files, shared by
    /// every worker (`pread` takes no file position; a model of 163 shards
    /// and 64 workers would otherwise need 10,432 descriptors).
    fn open_worker_files(
        vault: &Vault,
        workers: u32,
        policy: DirectIo,
    ) -> Result<(Vec<Arc<[File]>>, bool)> {
        match vault.model() {
            None => {
                let files = open_vault_files(vault, workers, policy)?;
                let direct = files.iter().all(|f| f.direct);
                Ok((
                    files.into_iter().map(|o| Arc::from([o.file])).collect(),
                    direct,
                ))
            }
            Some(model) => {
                let (files, direct) = open_model_files(model.files(), policy)?;
                let shared: Arc<[File]> = files.into();
                Ok(((0..workers).map(|_| shared.clone()).collect(), direct))
            }
        }
    }

    /// Opens each of a model's files once, as the files it was opened from:
    /// never waiting on a FIFO put at a path, and refusing a file that is
    /// no longer the one whose headers were read (replaced by a rename, or
    /// changed). A direct descriptor of each is probed with one read; if
    /// one is refused, all are opened again buffered (or, under `Require`,
    /// it is an error).
    fn open_model_files(files: &[ModelFile], policy: DirectIo) -> Result<(Vec<File>, bool)> {
        let open_all = |policy: DirectIo| -> Result<Vec<OpenedFile>> {
            let mut opened = Vec::with_capacity(files.len());
            for known in files {
                let (file, meta) = crate::sys::open_regular_for_streaming(&known.path, policy)
                    .map_err(|e| match e {
                        OpenRegularError::Os(e) => {
                            let kind = if e.kind() == std::io::ErrorKind::Unsupported {
                                ErrorKind::Unsupported
                            } else {
                                ErrorKind::Io
                            };
                            Error::io("cannot open for streaming", &known.path, &e).with_kind(kind)
                        }
                        OpenRegularError::NotRegular(kind) => Error::path_is(
                            ErrorKind::Io,
                            &known.path,
                            format!("is {kind} now, not the model file that was opened"),
                        ),
                    })?;
                known
                    .check_metadata(&meta)
                    .map_err(|why| Error::path_is(ErrorKind::Io, &known.path, why))?;
                opened.push(file);
            }
            Ok(opened)
        };
        let opened = open_all(policy)?;
        for (o, known) in opened.iter().zip(files) {
            if !o.direct {
                continue;
            }
            if let Err(e) = crate::sys::probe_direct_read(&o.file, IO_ALIGN as usize) {
                if policy == DirectIo::Require {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!(
                            "direct I/O required but {} refuses direct reads: {e}",
                            known.path.display()
                        ),
                    )
                    .with_os_error(e.raw_os_error()));
                }
                let opened = open_all(DirectIo::Off)?;
                return Ok((opened.into_iter().map(|o| o.file).collect(), false));
            }
        }
        let direct = opened.iter().all(|o| o.direct);
        Ok((opened.into_iter().map(|o| o.file).collect(), direct))
    }

    /// Opens one descriptor of the vault per worker with the `policy`. Some
    /// filesystems accept `O_DIRECT` at open and refuse the reads, so a
    /// direct descriptor is probed with one read; if it is refused, all are
    /// reopened buffered (or, under `Require`, it is an error).
    fn open_vault_files(vault: &Vault, workers: u32, policy: DirectIo) -> Result<Vec<OpenedFile>> {
        let mut files = Vec::with_capacity(workers as usize);
        for _ in 0..workers {
            let opened = crate::sys::open_for_streaming(vault.path(), policy).map_err(|e| {
                let kind = if e.kind() == std::io::ErrorKind::Unsupported {
                    ErrorKind::Unsupported
                } else {
                    ErrorKind::Io
                };
                Error::io("cannot open for streaming", vault.path(), &e).with_kind(kind)
            })?;
            files.push(opened);
        }
        if files.iter().any(|f| f.direct) {
            let probe = crate::sys::probe_direct_read(&files[0].file, DEFAULT_ALIGNMENT as usize);
            if let Err(e) = probe {
                if policy == DirectIo::Require {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!(
                            "direct I/O required but {} refuses direct reads: {e}",
                            vault.path().display()
                        ),
                    )
                    .with_os_error(e.raw_os_error()));
                }
                files.clear();
                for _ in 0..workers {
                    let f = crate::sys::open_for_streaming(vault.path(), DirectIo::Off)
                        .map_err(|e| Error::io("cannot open", vault.path(), &e))?;
                    files.push(f);
                }
            }
        }
        Ok(files)
    }

    /// Starts one I/O worker per set of descriptors, then tells the wake-up
    /// logic their threads. If one cannot start, stops those that did.
    fn start_workers(shared: &Arc<Shared>, files: Vec<Arc<[File]>>) -> Result<Vec<JoinHandle<()>>> {
        let mut threads = Vec::with_capacity(files.len());
        for (i, mine) in files.into_iter().enumerate() {
            let shared2 = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("smoe-io-{i}"))
                .spawn(move || worker::run(shared2, i as u32, mine));
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => {
                    shared
                        .wake
                        .set_threads(threads.iter().map(|h| h.thread().clone()).collect());
                    stop(shared, &mut threads, &mut None);
                    return Err(Error::new(
                        ErrorKind::Internal,
                        format!("could not start I/O worker {i}: {e}"),
                    ));
                }
            }
        }
        shared
            .wake
            .set_threads(threads.iter().map(|h| h.thread().clone()).collect());
        Ok(threads)
    }

    /// Starts the pre-warm thread, which catches its own panics and marks
    /// the streamer broken.
    fn start_prewarm(shared: &Arc<Shared>) -> Result<JoinHandle<()>> {
        let shared2 = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("smoe-prewarm".into())
            .spawn(move || {
                let s = shared2.clone();
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prewarm::run(s)));
                if r.is_err() {
                    // Release: later calls that Acquire `broken` fail cleanly.
                    shared2.broken.store(true, Ordering::Release);
                    shared2.landed.notify();
                }
            });
        match spawned {
            Ok(h) => {
                shared.prewarm.set_thread(h.thread().clone());
                Ok(h)
            }
            Err(e) => Err(Error::new(
                ErrorKind::Internal,
                format!("could not start the pre-warm thread: {e}"),
            )),
        }
    }

    /// Starts the memory thread (populate, elastic monitor), which catches
    /// its own panics and marks the streamer broken.
    fn start_memory(
        shared: &Arc<Shared>,
        populate: bool,
        probe: Option<PressureProbe>,
    ) -> Result<JoinHandle<()>> {
        let shared2 = shared.clone();
        std::thread::Builder::new()
            .name("smoe-memory".into())
            .spawn(move || {
                let s = shared2.clone();
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    elastic::run(s, populate, probe)
                }));
                if r.is_err() {
                    // Release: later calls that Acquire `broken` fail cleanly.
                    shared2.broken.store(true, Ordering::Release);
                    shared2.landed.notify();
                }
            })
            .map_err(|e| {
                Error::new(
                    ErrorKind::Internal,
                    format!("could not start the memory thread: {e}"),
                )
            })
    }

    /// The members of one working set as a [`Spare`]: a bitmap on the stack
    /// for layers of up to 4096 experts (every model known), else the list.
    struct SetBits {
        base: u32,
        /// `None` for a layer too wide for the bitmap: the list is used.
        bits: Option<[u64; 64]>,
    }

    impl SetBits {
        /// The set `experts` of the layer whose first dense id is `base`,
        /// every member checked against the vault (`e < n_experts`).
        fn new(base: u32, n_experts: u32, experts: &[u32]) -> SetBits {
            let bits = (n_experts <= 64 * 64).then(|| {
                let mut bits = [0u64; 64];
                for &e in experts {
                    bits[e as usize / 64] |= 1 << (e % 64);
                }
                bits
            });
            SetBits { base, bits }
        }

        /// The set as a [`Spare`]; `experts` is the list it was built from.
        fn spare<'a>(&'a self, experts: &'a [u32]) -> Spare<'a> {
            match &self.bits {
                Some(bits) => Spare::Bits {
                    base: self.base,
                    bits,
                },
                None => Spare::Experts {
                    base: self.base,
                    experts,
                },
            }
        }
    }

    /// A take found the ring full and dropped its expert's reservation
    /// with no read queued. A `claim_wait` that saw the reservation sleeps
    /// until a read lands, and must look again: a read that is loading
    /// wakes every waiter when it lands or fails, so the waiters are woken
    /// here only when none is. Waking them always made a waiting
    /// `claim_any`, whose every pass over a set larger than the ring found
    /// it full, wake itself and never sleep (issue 33: 59-75% of a core).
    /// A slot being retired by the elastic ring also counts as loading;
    /// the retirement wakes the waiters. Should the scan miss a load that
    /// lands as it runs, the cap on one sleep
    /// ([`worker::Landed::wait_for`]) bounds the wait.
    fn dropped_reservation(shared: &Shared) {
        // SeqCst: the reservation's drop (a Release store) is not reordered
        // after the scan's loads, so a load the scan counts as in flight
        // lands after the drop and its notify wakes the waiter.
        std::sync::atomic::fence(Ordering::SeqCst);
        if shared.table.occupancy().loading == 0 {
            shared.landed.notify();
        }
    }

    fn ring_full(shared: &Shared, layer: u32, expert: u32) -> Error {
        let slots = shared.table.slots();
        let active = shared.elastic.active.load(Ordering::Relaxed);
        let which = if active < slots {
            format!(
                "{active} active slots ({} of the ring's {slots} are offline: the elastic ring gave them back under memory pressure)",
                slots - active
            )
        } else {
            format!("{slots} slots")
        };
        Error::new(
            ErrorKind::RingFull,
            format!("every one of the {which} is claimed or loading; release a claim and retry"),
        )
        .with_expert(layer, expert)
    }

    fn stop(
        shared: &Shared,
        threads: &mut Vec<JoinHandle<()>>,
        prewarm_thread: &mut Option<JoinHandle<()>>,
    ) {
        // Release: the threads Acquire it and return.
        shared.shutdown.store(true, Ordering::Release);
        shared.prewarm.wake();
        shared.wake.all();
        // Panics were already caught inside the threads.
        if let Some(t) = prewarm_thread.take() {
            let _ = t.join();
        }
        for t in threads.drain(..) {
            let _ = t.join();
        }
    }

    impl Drop for Streamer {
        fn drop(&mut self) {
            stop(&self.shared, &mut self.threads, &mut self.prewarm_thread);
            // `stop` set `shutdown`; the unpark ends the monitor's sleep.
            if let Some(t) = self.memory_thread.take() {
                t.thread().unpark();
                let _ = t.join();
            }
            // Nobody is left to report a failure to; `flush_stats` is the
            // call that reports one.
            let _ = self.shared.histogram.persist();
            // Every claim has returned (`&mut self`; `smoe_close`'s
            // contract), so the trace is complete. As above, a failure has
            // no one to go to; `trace_events`/`trace_dropped` tell the host
            // what it will hold.
            if let Some(trace) = &self.shared.trace {
                let _ = trace.save();
            }
        }
    }

    impl std::fmt::Debug for Streamer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Streamer")
                .field("vault", &self.shared.vault.path())
                .field("slots", &self.shared.table.slots())
                .field("slot_bytes", &self.shared.slot_bytes)
                .finish()
        }
    }
}
