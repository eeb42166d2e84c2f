//! Cache simulators for `smoe bench`: exact LRU and Belady's optimal (MIN)
//! over the demand claims of a routing trace, for one shared ring of N slots
//! over every (layer, expert) pair, the whole trace as one sequence.
//!
//! The claims are the top-k ranks of each row, in order; an expert repeated
//! within a row counts once for that row. A claim is a hit when the expert is
//! resident; otherwise it is loaded, evicting (when the ring is full) the
//! least recently used expert (LRU) or the resident expert whose next use is
//! furthest in the future (Belady). Both run in O(n log n). A third replays
//! the device tier's rule ([`tier`]), O(n × slots) at worst.

use std::collections::{BTreeSet, HashMap};

use smoe::internals::router::TraceTokens;
use smoe::internals::tier::DeviceTier;

/// The claim sequence of a trace as dense ids (0..distinct), in order.
pub fn claims(tokens: &TraceTokens) -> Vec<u32> {
    let mut ids: HashMap<(u32, u32), u32> = HashMap::new();
    let mut out = Vec::new();
    for token in tokens {
        for (layer, experts) in token {
            for (i, &e) in experts.iter().enumerate() {
                if experts[..i].contains(&e) {
                    continue;
                }
                let next = ids.len() as u32;
                out.push(*ids.entry((*layer, e)).or_insert(next));
            }
        }
    }
    out
}

/// Hits of a simulated cache over a claim sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimResult {
    /// Claims simulated.
    pub claims: u64,
    /// Claims that found the expert resident.
    pub hits: u64,
}

impl SimResult {
    /// Hits / claims (0 when there are no claims).
    pub fn rate(&self) -> f64 {
        self.hits as f64 / self.claims.max(1) as f64
    }
}

fn n_ids(seq: &[u32]) -> usize {
    seq.iter().map(|&x| x as usize + 1).max().unwrap_or(0)
}

/// Exact LRU with `slots` slots over `seq` (dense ids).
pub fn lru(seq: &[u32], slots: usize) -> SimResult {
    let mut last: Vec<Option<usize>> = vec![None; n_ids(seq)];
    // (last use, id) of the resident experts: the first is the LRU one.
    let mut order: BTreeSet<(usize, u32)> = BTreeSet::new();
    let mut hits = 0u64;
    for (t, &x) in seq.iter().enumerate() {
        match last[x as usize] {
            Some(when) if order.remove(&(when, x)) => hits += 1,
            _ => {
                if slots == 0 {
                    continue;
                }
                if order.len() >= slots {
                    if let Some((when, y)) = order.pop_first() {
                        debug_assert_eq!(last[y as usize], Some(when));
                    }
                }
            }
        }
        last[x as usize] = Some(t);
        order.insert((t, x));
    }
    SimResult {
        claims: seq.len() as u64,
        hits,
    }
}

/// Belady's MIN with `slots` slots over `seq` (dense ids): on a miss with a
/// full ring, evict the resident expert whose next use is furthest away
/// (never used again counts as furthest).
pub fn belady(seq: &[u32], slots: usize) -> SimResult {
    let n = seq.len();
    // next[t]: the next position claiming seq[t], or n + t (never again,
    // distinct so that the set's keys stay unique).
    let mut next = vec![0usize; n];
    let mut seen: Vec<usize> = vec![usize::MAX; n_ids(seq)];
    for t in (0..n).rev() {
        let x = seq[t] as usize;
        next[t] = if seen[x] == usize::MAX {
            n + t
        } else {
            seen[x]
        };
        seen[x] = t;
    }
    // Resident experts keyed by their next use.
    let mut resident: BTreeSet<(usize, u32)> = BTreeSet::new();
    let mut key: Vec<Option<usize>> = vec![None; seen.len()];
    let mut hits = 0u64;
    for t in 0..n {
        let x = seq[t];
        if let Some(k) = key[x as usize] {
            resident.remove(&(k, x));
            hits += 1;
        } else {
            if slots == 0 {
                continue;
            }
            if resident.len() >= slots {
                if let Some((_, y)) = resident.pop_last() {
                    key[y as usize] = None;
                }
            }
        }
        key[x as usize] = Some(next[t]);
        resident.insert((next[t], x));
    }
    SimResult {
        claims: n as u64,
        hits,
    }
}

/// The device tier's rule (the library's, `src/tier/`) with `slots` slots
/// over the trace, one decode step a token: each claim looked up, each
/// miss offered for admission, and the copies completing between tokens.
pub fn tier(tokens: &TraceTokens, slots: usize) -> SimResult {
    let mut ids: HashMap<(u32, u32), u32> = HashMap::new();
    let mut t = DeviceTier::new(u32::try_from(slots).unwrap_or(u32::MAX));
    let mut copies = Vec::new();
    for token in tokens {
        let mut missed = Vec::new();
        for (layer, experts) in token {
            for (i, &e) in experts.iter().enumerate() {
                if experts[..i].contains(&e) {
                    continue;
                }
                let next = ids.len() as u32;
                let id = *ids.entry((*layer, e)).or_insert(next);
                if t.lookup(id).is_none() {
                    missed.push(id);
                }
            }
        }
        copies.extend(missed.into_iter().filter_map(|id| t.admit(id)));
        t.step_done();
        for p in copies.drain(..) {
            t.loaded(p.slot, 0).expect("a promotion's slot is loading");
        }
    }
    let s = t.stats();
    SimResult {
        claims: s.lookups,
        hits: s.hits,
    }
}

/// Ring sizes of a sweep over `entries` experts: 5% to 100% in steps of 5%
/// (at least 1 slot), plus `extra` when non-zero; sorted, distinct.
pub fn sweep_sizes(entries: u32, extra: u32) -> Vec<u32> {
    let mut sizes: Vec<u32> = (1..=20u64)
        .map(|i| ((u64::from(entries) * i * 5 + 50) / 100).max(1) as u32)
        .collect();
    if extra != 0 {
        sizes.push(extra);
    }
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoe::internals::router::{parse_trace, trace_tokens, Rng};

    /// A deliberately simple exact LRU: a Vec, most recent last.
    fn vec_lru(seq: &[u32], slots: usize) -> u64 {
        let mut cache: Vec<u32> = Vec::new();
        let mut hits = 0;
        for &x in seq {
            if let Some(i) = cache.iter().position(|&y| y == x) {
                hits += 1;
                cache.remove(i);
            } else if slots == 0 {
                continue;
            } else if cache.len() == slots {
                cache.remove(0);
            }
            cache.push(x);
        }
        hits
    }

    /// Textbook Belady, O(n·N): on a miss with a full cache, scan forward for
    /// each resident's next use and evict the furthest.
    fn textbook_belady(seq: &[u32], slots: usize) -> u64 {
        let mut cache: Vec<u32> = Vec::new();
        let mut hits = 0;
        for (t, &x) in seq.iter().enumerate() {
            if cache.contains(&x) {
                hits += 1;
                continue;
            }
            if slots == 0 {
                continue;
            }
            if cache.len() == slots {
                let next_use = |y: u32| {
                    seq[t + 1..]
                        .iter()
                        .position(|&z| z == y)
                        .unwrap_or(usize::MAX)
                };
                let (i, _) = cache
                    .iter()
                    .enumerate()
                    .max_by_key(|&(_, &y)| next_use(y))
                    .unwrap();
                cache.remove(i);
            }
            cache.push(x);
        }
        hits
    }

    fn random_trace(seed: u64, tokens: usize, layers: u32, experts: u32, k: u32) -> TraceTokens {
        let mut rng = Rng::new(seed);
        (0..tokens)
            .map(|_| {
                (0..layers)
                    .map(|l| {
                        let mut row = Vec::new();
                        while row.len() < k as usize {
                            // Skewed: low ids more often.
                            let m = rng.below(experts) + 1;
                            let e = rng.below(m);
                            if !row.contains(&e) {
                                row.push(e);
                            }
                        }
                        (l, row)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn lru_and_belady_equal_simple_models_on_random_traces() {
        for seed in 0..12u64 {
            let (layers, experts, k) = (
                1 + seed as u32 % 4,
                3 + seed as u32 % 6,
                1 + seed as u32 % 3,
            );
            let t = random_trace(seed, 60, layers, experts, k.min(experts));
            let seq = claims(&t);
            for slots in 0..=(layers * experts + 1) as usize {
                let l = lru(&seq, slots);
                let b = belady(&seq, slots);
                assert_eq!(
                    l.hits,
                    vec_lru(&seq, slots),
                    "lru seed {seed} slots {slots}"
                );
                assert_eq!(
                    b.hits,
                    textbook_belady(&seq, slots),
                    "belady seed {seed} slots {slots}"
                );
                assert!(
                    b.hits >= l.hits,
                    "belady < lru at seed {seed} slots {slots}"
                );
            }
        }
    }

    #[test]
    fn a_repeated_expert_counts_once_per_row() {
        let t: TraceTokens = vec![vec![(0, vec![1, 1, 2])], vec![(0, vec![1, 2])]];
        let seq = claims(&t);
        assert_eq!(seq, vec![0, 1, 0, 1]);
        assert_eq!(lru(&seq, 2).hits, 2);
    }

    #[test]
    fn the_tier_keeps_a_hot_set_that_one_off_experts_would_flush_from_an_lru() {
        // four hot experts, two of them a token in turn, and in another
        // layer an expert never seen again: the tier of 4 keeps the hot four
        // (each token's other two unheld, so only the rule keeps a newcomer,
        // used once, from evicting them), where an LRU of 4 loses every one
        // to the newcomers between two uses
        let t: TraceTokens = (0..100u32)
            .map(|i| vec![(0, vec![(i % 2) * 2, (i % 2) * 2 + 1]), (1, vec![i])])
            .collect();
        let tier = tier(&t, 4);
        assert_eq!(tier.claims, 300);
        // tokens 0 and 1 fill the empty slots (0, 1, the first newcomer, 2);
        // 3 evicts that newcomer once used twice (token 3); from token 4 on
        // every hot use hits: 2 + 1 + 96 × 2
        assert_eq!(tier.hits, 195, "{tier:?}");
        let lru = lru(&claims(&t), 4);
        assert_eq!(lru.hits, 0);
        assert_eq!(super::tier(&t, 0).hits, 0);
    }

    #[test]
    fn sweep_sizes_cover_5_to_100_percent() {
        let s = sweep_sizes(256, 100);
        assert_eq!(s.first(), Some(&13));
        assert_eq!(s.last(), Some(&256));
        assert!(s.contains(&100) && s.contains(&64) && s.contains(&128));
        assert_eq!(sweep_sizes(4, 0), vec![1, 2, 3, 4]);
    }

    /// The shared Mixtral trace, from ../shared/traces relative to the
    /// workspace (never copied into the repository).
    pub(crate) fn shared_trace() -> Option<String> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/traces/mixtral-8x7b-decode.csv");
        match std::fs::read_to_string(&p) {
            Ok(t) => Some(t),
            Err(_) => {
                println!("note: {} is absent; skipping", p.display());
                None
            }
        }
    }

    #[test]
    fn shared_mixtral_trace_gives_the_reference_figures() {
        let Some(text) = shared_trace() else { return };
        let t = trace_tokens(&parse_trace(&text).unwrap(), 2);
        let seq = claims(&t);
        let want = [
            (25, 0.0, 32.7),
            (64, 32.0, 60.4),
            (100, 40.8, 74.2),
            (128, 55.7, 81.8),
        ];
        for (slots, l_want, b_want) in want {
            let l = lru(&seq, slots);
            let b = belady(&seq, slots);
            assert_eq!(l.hits, vec_lru(&seq, slots), "lru at {slots}");
            assert!(
                (l.rate() * 100.0 - l_want).abs() <= 0.1,
                "lru {slots}: {}",
                l.rate()
            );
            assert!(
                (b.rate() * 100.0 - b_want).abs() <= 0.1,
                "belady {slots}: {}",
                b.rate()
            );
            assert!(b.hits >= l.hits);
            let d = tier(&t, slots);
            println!(
                "{slots} slots: lru {:.1}%, device tier {:.1}%, belady {:.1}%",
                l.rate() * 100.0,
                d.rate() * 100.0,
                b.rate() * 100.0
            );
            assert_eq!(d.claims, l.claims);
            // (Belady keeps every miss: a tier that lets some pass is not bound by it)
        }
    }
}
