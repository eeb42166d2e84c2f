//! The I/O workers: each owns one descriptor of the vault, takes read jobs
//! from the slot table (demand before speculation), reads a blob's padded
//! bytes straight into its slot and publishes it READY.
//!
//! Idle workers park (a futex underneath) and are unparked by whoever queues
//! a read; they never spin when there is nothing to read. A panic inside a
//! worker is caught, marks the streamer broken, and ends only that thread.
//!
//! Every read goes through a [`BlobReader`], the seam where tests put a
//! faulty disk; the streamer's own is [`FileReader`].

use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::Thread;
use std::time::Instant;

use xxhash_rust::xxh3::xxh3_64;

use super::slots::{Origin, ReadJob};
use super::Shared;
use crate::error::{Error, ErrorKind};
use crate::sys::ReadError;
use crate::vault::{Entry, InPlace, Scratch};

/// How the I/O workers read a blob: the one seam between the streamer and
/// the disk, as [`crate::vault`]'s `Source` is for the vault's table. The
/// streamer reads through [`FileReader`]; a test passes
/// [`Streamer::with_reader`](super::Streamer::with_reader) a reader that
/// fails or panics where it wants, so no test hook sits on the read path.
///
/// Not part of the API: for tests (hidden from the docs).
#[doc(hidden)]
pub trait BlobReader: Send + Sync + 'static {
    /// Fills `buf` with the bytes at `offset` of the vault file, through
    /// `file`, the calling worker's own descriptor of it (opened for direct
    /// I/O when possible: `buf`, `offset` and `buf.len()` are aligned for
    /// it). An error says how far the read got ([`ReadError::done`]).
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> Result<(), ReadError>;
}

/// The streamer's reader: [`crate::sys::read_at_exact`] (`pread`, retrying
/// on `EINTR` and after short reads). A test's reader may delegate to it.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FileReader;

impl BlobReader for FileReader {
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> Result<(), ReadError> {
        crate::sys::read_at_exact(file, buf, offset)
    }
}

/// Which workers are parked, and how to wake them.
pub(crate) struct Wake {
    /// Bit `i` set: worker `i` is parked or about to park.
    sleeping: AtomicU64,
    threads: OnceLock<Vec<Thread>>,
}

impl Wake {
    pub(crate) fn new(workers: u32) -> Wake {
        debug_assert!(workers <= 64);
        Wake {
            sleeping: AtomicU64::new(0),
            threads: OnceLock::new(),
        }
    }

    pub(crate) fn set_threads(&self, threads: Vec<Thread>) {
        let _ = self.threads.set(threads);
    }

    /// Wakes one parked worker, if any. Called after queueing a read.
    pub(crate) fn one(&self) {
        // SeqCst fence: orders the queue push before the load of `sleeping`,
        // pairing with the fence in `park`, so either this thread sees the
        // worker's bit or the worker sees the pushed item (no lost wake-up).
        fence(Ordering::SeqCst);
        let mut mask = self.sleeping.load(Ordering::Relaxed);
        while mask != 0 {
            let i = mask.trailing_zeros();
            let bit = 1u64 << i;
            // AcqRel: exactly one waker clears a given bit and unparks it.
            let before = self.sleeping.fetch_and(!bit, Ordering::AcqRel);
            if before & bit != 0 {
                if let Some(t) = self.threads.get().and_then(|t| t.get(i as usize)) {
                    t.unpark();
                }
                return;
            }
            mask = before & !bit;
        }
    }

    /// Wakes every worker (shutdown).
    pub(crate) fn all(&self) {
        self.sleeping.store(0, Ordering::Release);
        if let Some(threads) = self.threads.get() {
            for t in threads {
                t.unpark();
            }
        }
    }

    /// Parks worker `me` unless `has_work` says there is something to do.
    fn park(&self, me: u32, has_work: impl Fn() -> bool) {
        let bit = 1u64 << me;
        self.sleeping.fetch_or(bit, Ordering::Relaxed);
        // SeqCst fence: the bit is visible before we look at the queues
        // (pairs with the fence in `one`).
        fence(Ordering::SeqCst);
        if !has_work() {
            std::thread::park();
        }
        self.sleeping.fetch_and(!bit, Ordering::Relaxed);
    }
}

/// Longest single sleep of a waiting claim.
const MAX_SLEEP: std::time::Duration = std::time::Duration::from_millis(100);

/// Where `claim_wait` callers sleep until a read lands: an eventcount.
///
/// A waiter counts itself in `waiters`, reads `epoch`, tries its claim, and
/// parks on the condition variable only if `epoch` has not moved since (the
/// check is made holding the mutex). A worker that finished a read (ok or
/// failed) bumps `epoch` and, only when someone waits, takes the mutex and
/// wakes every waiter. So a claim path with no waiter pays one atomic add
/// per read and takes no lock, and a waiter never sleeps through the read
/// it waits for: either the worker's bump comes before the waiter's check
/// (the waiter sees it and retries) or the worker sees the waiter counted
/// and wakes it under the mutex, after the waiter is in `wait`.
pub(crate) struct Landed {
    epoch: AtomicU64,
    waiters: AtomicU64,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Landed {
    pub(crate) fn new() -> Landed {
        Landed {
            epoch: AtomicU64::new(0),
            waiters: AtomicU64::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// A read finished (its slot is READY, or its failure is recorded).
    pub(crate) fn notify(&self) {
        // SeqCst: the slot's transition (program-ordered before) and this
        // bump come before the load of `waiters` in the single total order
        // that the waiter's SeqCst increment and epoch load are also in.
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.cv.notify_all();
        }
    }

    /// Calls `attempt` until it returns `Some`, an error, or `deadline`
    /// passes (`Ok(None)`), sleeping between attempts until a read lands.
    pub(crate) fn wait_for<T, E>(
        &self,
        deadline: Instant,
        mut attempt: impl FnMut() -> Result<Option<T>, E>,
    ) -> Result<Option<T>, E> {
        // SeqCst: see `notify`.
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let result = (|| loop {
            // SeqCst: see `notify`; an epoch read after a worker's bump also
            // acquires that worker's slot transition.
            let seen = self.epoch.load(Ordering::SeqCst);
            if let Some(v) = attempt()? {
                return Ok(Some(v));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            if self.epoch.load(Ordering::SeqCst) != seen {
                continue;
            }
            // A spurious wake-up or the timeout only costs another attempt.
            // Every path that ends a wait without a read landing (a failed
            // read, a slot taken offline, a panicked worker, a reservation
            // dropped for a full ring while nothing loads, whose landing
            // would) notifies; the cap on one sleep bounds the rare wait a
            // scan misses (a load that lands as the dropped reservation's
            // scan runs), at ten wake-ups a second.
            let _ = self
                .cv
                .wait_timeout(guard, (deadline - now).min(MAX_SLEEP))
                .unwrap_or_else(|p| p.into_inner());
        })();
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

/// A worker's life: take jobs until shutdown. Catches panics. `files` are
/// the worker's own descriptors of the vault's data files
/// ([`Vault::data_files`](crate::vault::Vault::data_files)), in order.
pub(crate) fn run(shared: Arc<Shared>, me: u32, files: Arc<[File]>) {
    let result = catch_unwind(AssertUnwindSafe(|| work(&shared, me, &files)));
    if result.is_err() {
        // Release: later API calls that Acquire `broken` fail cleanly.
        shared.broken.store(true, Ordering::Release);
        // Waiters find the streamer broken on their next attempt.
        shared.landed.notify();
    }
}

fn work(shared: &Shared, me: u32, files: &[File]) {
    let mut scratch = Scratch::default();
    loop {
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        match shared.table.next_job() {
            Some(job) => {
                // Bets begin only while no demand read is in progress: once
                // one may, every worker that can take one is woken, one by
                // one, each waking the next while bets wait.
                if job.origin != Origin::Demand && shared.table.has_speculative() {
                    shared.wake.one();
                }
                read_job(shared, files, job, &mut scratch);
            }
            None => shared.wake.park(me, || {
                shared.table.has_work() || shared.shutdown.load(Ordering::Acquire)
            }),
        }
    }
}

fn read_job(shared: &Shared, files: &[File], job: ReadJob, scratch: &mut Scratch) {
    let Some(&entry) = shared.vault.entry_by_id(job.id) else {
        // Every caller checks ids against the vault before queueing; should
        // one slip through, fail its read rather than the worker.
        let (layer, expert) = (
            job.id / shared.vault.n_experts(),
            job.id % shared.vault.n_experts(),
        );
        let err = Error::expert_is(ErrorKind::NotFound, layer, expert, "is not in the vault");
        fail(shared, job, err);
        return;
    };
    let len = entry.padded_size as usize;
    // SAFETY: the job puts the slot in READING, which gives this worker the
    // slot's bytes exclusively until `finish_*`; `padded_size ≤ slot_bytes`
    // was checked when the streamer chose the slot size.
    let buf = unsafe { std::slice::from_raw_parts_mut(shared.ring.slot_ptr(job.slot), len) };
    let c = &shared.counters;
    let path = shared.vault.path();

    shared.drive.read_began();
    let read = match shared.vault.model() {
        None => shared
            .reader
            .read_exact_at(&files[0], buf, entry.offset)
            .map(|()| len as u64)
            .map_err(|e| Error::read(path, &e)),
        Some(model) => read_model(shared, model, files, &entry, buf, scratch),
    };
    shared.drive.read_ended();
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(e) => {
            c.io_errors.fetch_add(1, Ordering::Relaxed);
            fail(shared, job, e.with_expert(entry.layer, entry.expert));
            return;
        }
    };
    c.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    if shared.verify && shared.vault.header().has_checksums() {
        let sum = xxh3_64(&buf[..entry.size as usize]);
        if sum != entry.xxh3 {
            c.checksum_errors.fetch_add(1, Ordering::Relaxed);
            let err = Error::checksum(path, entry.offset, entry.xxh3, sum)
                .with_expert(entry.layer, entry.expert)
                .with_length(entry.size);
            fail(shared, job, err);
            return;
        }
    }
    // Counted by who the load was for in the end: a claim that waited for
    // a bet while it was read made it demand.
    let (origin, bets_may_begin) = shared.table.finish_loaded(job, bytes);
    if bets_may_begin && shared.table.has_speculative() {
        shared.wake.one();
    }
    match origin {
        Origin::Demand => &c.reads_demand,
        Origin::Speculative => {
            c.bytes_speculative.fetch_add(bytes, Ordering::Relaxed);
            &c.reads_speculative
        }
        Origin::Prewarm => &c.reads_prewarm,
    }
    .fetch_add(1, Ordering::Relaxed);
    shared.landed.notify();
}

/// Loads an expert of a model opened in place into its slot `buf`
/// ([`InPlace::load`], through the streamer's reader) and counts the bytes
/// moved. Returns the bytes read.
fn read_model(
    shared: &Shared,
    model: &InPlace,
    files: &[File],
    entry: &Entry,
    buf: &mut [u8],
    scratch: &mut Scratch,
) -> Result<u64, Error> {
    let loaded = model.load(files, entry, buf, scratch, |file, window, offset| {
        shared.reader.read_exact_at(file, window, offset)
    })?;
    if loaded.bytes_moved > 0 {
        shared
            .counters
            .bytes_moved
            .fetch_add(loaded.bytes_moved, Ordering::Relaxed);
    }
    Ok(loaded.bytes_read)
}

fn fail(shared: &Shared, job: ReadJob, err: Error) {
    shared
        .errors
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(job.id, err);
    if shared.table.finish_failed(job) && shared.table.has_speculative() {
        shared.wake.one();
    }
    shared.landed.notify();
}
