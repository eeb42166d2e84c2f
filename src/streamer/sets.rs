//! A layer's working set (docs/c-api.md, "Working sets"):
//! [`Streamer::prefetch_set`], which first settles the bets outstanding on
//! the layer (`settle`, against `predict`'s predictions), and
//! [`Streamer::claim_any`] and its ticket forms, which claim whichever
//! member is ready first; a set's checks (`check_set`) and its members as
//! the slot table's [`Spare`] ([`SetBits`]). The answer of one claim and
//! the wait are `claims`'.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::claims::{dropped_reservation, ring_full, Claim, Priority, SlotInfo, Wake};
use super::handle::Streamer;
use super::slots::{Origin, Prefetched, SetClaim, Spare};
use crate::error::{Error, ErrorKind, Result};

impl Streamer {
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
        let settled = shared.predictions.settle(base, n, routed, |id| {
            // A stale bet: dropped before its read, or, read, the
            // first to go from the ring.
            let dropped = shared.table.drop_speculative(id);
            if !dropped {
                shared.table.demote_speculative(id);
            }
            dropped
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

    /// One pass of [`Streamer::claim_any`]
    /// ([`SlotTable::claim_set`](super::slots::SlotTable::claim_set))
    /// over a set [`Streamer::check_set`] accepted, whose layer's first
    /// dense id is `base`: `None` while a member (or another expert,
    /// whose slot a member can take once it lands) is loading.
    fn try_claim_any(&self, layer: u32, base: u32, experts: &[u32]) -> Result<Option<SlotInfo>> {
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
