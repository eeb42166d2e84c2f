//! Opening a streamer: [`Streamer::open`] and its seams (`with_vault`,
//! `with_reader`); the config resolved, before any thread runs, into
//! [`Resolved`] (the worker count, the ring plan and its ring, the workers'
//! descriptors, the histogram, the pre-warm budget, the trace); starting the
//! I/O workers, the pre-warm thread and the memory thread; and the other
//! end, stopping and joining them when the streamer drops.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::drive::DriveClock;
use super::elastic::{self, ElasticState};
use super::handle::{Counters, Shared, Streamer};
use super::predict::Predictions;
use super::prewarm;
use super::ring::Ring;
use super::slots::{Shape, SlotTable};
use super::worker;
use super::Config;
use crate::budget::RingPlan;
use crate::error::{Error, ErrorKind, Result};
use crate::model::window::IO_ALIGN;
use crate::popularity::Histogram;
use crate::sys::{DirectIo, OpenRegularError, OpenedFile, PressureProbe};
use crate::trace::TraceRecorder;
use crate::vault::ModelFile;
use crate::vault::{Vault, DEFAULT_ALIGNMENT};
use std::fs::File;

// A ring has at most one slot per vault entry, so the slot table's
// ticket field (20 bits) holds every slot index.
const _: () = assert!(super::slots::MAX_SLOTS >= crate::vault::MAX_EXPERT_IDS);

/// Default number of I/O workers.
pub const DEFAULT_WORKERS: u32 = 16;
/// Most I/O workers a streamer runs.
pub const MAX_WORKERS: u32 = 64;

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
