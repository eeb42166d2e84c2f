//! One expert at a time: [`Streamer::prefetch`] (and its [`Priority`]), the
//! claims ([`Streamer::claim`], [`Streamer::claim_wait`] and their ticket
//! forms), [`Streamer::release_ticket`]; the [`Claim`] guard and the
//! [`SlotInfo`] it holds. Also what a working set's claims (`sets`) share
//! with these: how the slot table's answer becomes a slot or an error
//! (`finish_claim`), the wait (`wait_for_claim`: spin, poll, then sleep
//! until a read lands), and what a claim that found the ring full does
//! (`dropped_reservation`, `ring_full`).

use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::handle::{Shared, Streamer};
use super::slots::{Claimed, Origin, Prefetched};
use crate::error::{Error, ErrorKind, Result};
use crate::vault::Entry;

/// `claim_wait`'s short spin before it sleeps: rounds of 2, 4, ... 64
/// spin hints, a few microseconds in all.
const SPIN_ROUNDS: u32 = 12;

/// Then `claim_wait` polls, yielding its core between tries, until this
/// long after the call, and only then sleeps: a read that lands by then
/// costs no wake-up, which on a virtual machine (an idle vCPU woken by
/// the host) took 20–50 µs more than a busy poll (`cargo bench --bench
/// claim_wait`). Longer waits burn at most this much CPU.
const POLL_FOR: Duration = Duration::from_micros(500);

/// How urgently an expert is wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// The engine needs it for the layer it is on.
    Demand,
    /// A bet on a deeper gate rank or the next token.
    Speculative,
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

// SAFETY: `data` points into the streamer's ring, which outlives every
// claim; the pointer is only read through while the claim is held.
unsafe impl Send for SlotInfo {}
// SAFETY: as above.
unsafe impl Sync for SlotInfo {}

/// How often a wait asks its host whether to go on, and the question.
pub(super) struct Wake<'a> {
    pub(super) every: Duration,
    pub(super) keep_waiting: Option<&'a mut dyn FnMut() -> bool>,
}

impl Wake<'static> {
    /// A wait nobody stops.
    pub(super) fn never() -> Wake<'static> {
        Wake {
            every: Duration::MAX,
            keep_waiting: None,
        }
    }
}

/// A claimed expert: derefs to its payload bytes and releases on drop.
pub struct Claim<'s> {
    pub(super) streamer: &'s Streamer,
    pub(super) info: SlotInfo,
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

impl Streamer {
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
    pub(super) fn finish_claim(
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
    pub(super) fn wait_for_claim(
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
/// ([`worker::Landed::wait_for`](super::worker::Landed::wait_for)) bounds
/// the wait.
pub(super) fn dropped_reservation(shared: &Shared) {
    // SeqCst: the reservation's drop (a Release store) is not reordered
    // after the scan's loads, so a load the scan counts as in flight
    // lands after the drop and its notify wakes the waiter.
    std::sync::atomic::fence(Ordering::SeqCst);
    if shared.table.occupancy().loading == 0 {
        shared.landed.notify();
    }
}

pub(super) fn ring_full(shared: &Shared, layer: u32, expert: u32) -> Error {
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
