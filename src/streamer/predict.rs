//! Predictions: the experts an engine bet a layer would route to (its
//! speculative prefetches of that layer), kept until the layer's real set
//! arrives (its next demand `prefetch_set`). Then the bet is settled: each
//! routed member that was predicted counts as a hit of the prediction, and
//! a predicted read that still waits in the speculative queue is dropped
//! (`SlotTable::drop_speculative`), so that a stale bet never takes the
//! drive from the reads the engine now needs.
//!
//! One bit per dense expert id, set by a bet and cleared by the settlement:
//! no lock and no allocation. Every access is Relaxed: the bits are
//! statistics and hints; whether a read may be dropped is decided by the
//! slot table's compare-exchange on its state word.

use crate::sync::{AtomicU64, Ordering};

/// The outstanding bets, by dense id.
pub(crate) struct Predictions {
    bits: Box<[AtomicU64]>,
}

/// What settling one layer's bet found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Settled {
    /// Members of the routed set (as given, duplicates counted), when the
    /// layer had a bet outstanding; 0 when it had none.
    pub(crate) routed: u64,
    /// Of those, the members the bet named.
    pub(crate) predicted: u64,
    /// Predicted experts the set does not name, whose reads had not
    /// started and were dropped.
    pub(crate) dropped: u64,
}

impl Predictions {
    /// No bets, for `ids` dense ids.
    pub(crate) fn new(ids: u32) -> Predictions {
        Predictions {
            bits: (0..ids.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Bets that `id` will be routed to.
    #[inline]
    pub(crate) fn bet(&self, id: u32) {
        if let Some(word) = self.bits.get(id as usize / 64) {
            word.fetch_or(1 << (id % 64), Ordering::Relaxed);
        }
    }

    /// Whether a bet on `id` is outstanding.
    #[cfg(test)]
    pub(crate) fn is_bet(&self, id: u32) -> bool {
        self.bits
            .get(id as usize / 64)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (id % 64)) != 0)
    }

    /// The masks of the words that hold ids `base..base + n`: (word index,
    /// mask) pairs.
    fn words(base: u32, n: u32) -> impl Iterator<Item = (usize, u64)> {
        let (start, end) = (u64::from(base), u64::from(base) + u64::from(n));
        let first = (start / 64) as usize;
        let last = end.div_ceil(64) as usize;
        (first..last).map(move |i| {
            let lo = (i as u64 * 64).max(start) - i as u64 * 64;
            let hi = ((i as u64 + 1) * 64).min(end) - i as u64 * 64;
            let mask = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            (i, mask)
        })
    }

    /// Settles the bet on the layer whose dense ids are `base..base + n`
    /// against its routed set (`routed`: experts of the layer, each below
    /// `n`): counts the hits, clears every bit of the layer, and calls
    /// `drop` with each predicted id the set does not name (which answers
    /// whether its read was dropped). A layer with no bet outstanding
    /// settles to nothing, at the cost of one load a word.
    pub(crate) fn settle(
        &self,
        base: u32,
        n: u32,
        routed: &[u32],
        mut drop: impl FnMut(u32) -> bool,
    ) -> Settled {
        let any = Self::words(base, n).any(|(i, mask)| {
            self.bits
                .get(i)
                .is_some_and(|w| w.load(Ordering::Relaxed) & mask != 0)
        });
        if !any {
            return Settled::default();
        }
        let mut settled = Settled {
            routed: routed.len() as u64,
            ..Settled::default()
        };
        for &expert in routed {
            let id = base + expert;
            let bit = 1 << (id % 64);
            if let Some(word) = self.bits.get(id as usize / 64) {
                if word.fetch_and(!bit, Ordering::Relaxed) & bit != 0 {
                    settled.predicted += 1;
                }
            }
        }
        for (i, mask) in Self::words(base, n) {
            let Some(word) = self.bits.get(i) else {
                continue;
            };
            let mut left = word.fetch_and(!mask, Ordering::Relaxed) & mask;
            while left != 0 {
                let id = i as u32 * 64 + left.trailing_zeros();
                left &= left - 1;
                if drop(id) {
                    settled.dropped += 1;
                }
            }
        }
        settled
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A bet settles once: hits counted, the rest handed to `drop`, the
    /// layer's bits cleared and its neighbours' kept, even where the two
    /// share a word.
    #[test]
    fn a_bet_settles_once_against_the_routed_set() {
        // Layers of 40 experts: layer 1 is ids 40..80, across two words.
        let p = Predictions::new(120);
        for e in [1, 5, 30, 39] {
            p.bet(40 + e);
        }
        p.bet(39); // layer 0's last expert
        p.bet(80); // layer 2's first
        let mut dropped = Vec::new();
        let s = p.settle(40, 40, &[5, 30, 7, 5], |id| {
            dropped.push(id);
            id != 41
        });
        assert_eq!(
            s,
            Settled {
                routed: 4,
                predicted: 2,
                dropped: 1
            }
        );
        assert_eq!(dropped, vec![41, 79]);
        for e in 0..40 {
            assert!(!p.is_bet(40 + e), "layer 1's bits are cleared");
        }
        assert!(p.is_bet(39) && p.is_bet(80), "the neighbours' bets stay");
        // Nothing outstanding: nothing counted.
        assert_eq!(p.settle(40, 40, &[5], |_| true), Settled::default());
    }

    #[test]
    fn layers_of_whole_words_and_single_ids() {
        let p = Predictions::new(256);
        p.bet(128);
        p.bet(191);
        let s = p.settle(128, 64, &[0, 63], |_| unreachable!("all routed"));
        assert_eq!((s.routed, s.predicted, s.dropped), (2, 2, 0));
        p.bet(255);
        let s = p.settle(255, 1, &[], |id| id == 255);
        assert_eq!((s.routed, s.predicted, s.dropped), (0, 0, 1));
        // An id past the table is ignored, never a panic.
        p.bet(10_000);
    }
}
