//! The streamer handle: [`Streamer`], what its threads share ([`Shared`],
//! with the [`Counters`] they update), and what a host asks of an open
//! streamer without claiming anything: the vault, the ring plan, the
//! open-time warnings, the stats, the histogram, the ring's region,
//! residency. Opening and dropping a streamer is `open`'s; claiming through
//! it is `claims`' (one expert) and `sets`' (a layer's working set).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_utils::CachePadded;

use super::drive::DriveClock;
use super::elastic::ElasticState;
use super::predict::Predictions;
use super::prewarm;
use super::ring::Ring;
use super::slots::SlotTable;
use super::worker;
use super::Stats;
use crate::budget::RingPlan;
use crate::error::{Error, ErrorKind, Result};
use crate::popularity::Histogram;
use crate::trace::TraceRecorder;
use crate::vault::{Entry, Vault};

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

/// Streams expert blobs from a vault into a ring of slots. See the
/// [`streamer`](super) module doc and docs/c-api.md.
pub struct Streamer {
    pub(super) shared: Arc<Shared>,
    pub(super) threads: Vec<JoinHandle<()>>,
    pub(super) prewarm_thread: Option<JoinHandle<()>>,
    /// The memory thread (populate, elastic monitor), when either is on.
    pub(super) memory_thread: Option<JoinHandle<()>>,
    pub(super) workers: u32,
    pub(super) direct_all: bool,
    pub(super) warnings: Vec<String>,
    pub(super) plan: RingPlan,
}

impl Streamer {
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

    pub(super) fn check_alive(&self) -> Result<()> {
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
    pub(super) fn id_of(&self, layer: u32, expert: u32) -> Result<(u32, u32, &Entry)> {
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

impl std::fmt::Debug for Streamer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streamer")
            .field("vault", &self.shared.vault.path())
            .field("slots", &self.shared.table.slots())
            .field("slot_bytes", &self.shared.slot_bytes)
            .finish()
    }
}
