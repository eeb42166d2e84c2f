//! What the two sides of a replay share: the trace's check against the
//! vault, the per-expert read both sides time, per-token wait statistics and
//! one token's working set. `stream` (the smoe side), `baseline` (the mmap
//! side) and `bench` import this module; it imports none of them.

use std::time::Duration;

use smoe::internals::router::TraceTokens;
use smoe::vault::Vault;

use crate::output::Failure;

/// The trace names only experts the vault holds.
pub fn check_trace(vault: &Vault, tokens: &TraceTokens) -> Result<(), Failure> {
    for (t, token) in tokens.iter().enumerate() {
        for (layer, experts) in token {
            if let Some(&e) = experts.iter().find(|&&e| vault.entry(*layer, e).is_none()) {
                return Err(Failure::Message(format!(
                    "trace token {t}: layer {layer} expert {e} is not in the vault ({} layers × {} experts)",
                    vault.n_layers(),
                    vault.n_experts()
                )));
            }
        }
    }
    Ok(())
}

/// Sums every byte of `bytes` (as little-endian u64 words, then the tail):
/// reading an expert once, so that neither side of a comparison is timed
/// without touching what it fetched.
pub fn sum_bytes(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut sum = 0u64;
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        sum = sum.wrapping_add(u64::from_le_bytes(a));
    }
    for &b in words.remainder() {
        sum = sum.wrapping_add(u64::from(b));
    }
    sum
}

/// The layers of `vault` that hold experts (a dense layer has none), in order.
pub fn moe_layers(vault: &Vault) -> Vec<u32> {
    (0..vault.n_layers())
        .filter(|&l| (0..vault.n_experts()).any(|e| vault.entry(l, e).is_some()))
        .collect()
}

/// Per-token waits in milliseconds.
pub fn waits_ms(waits: &[Duration]) -> Vec<f64> {
    waits.iter().map(|w| w.as_secs_f64() * 1e3).collect()
}

/// Mean and 99th percentile of per-token waits in ms (0 and 0 for none).
pub fn mean_p99(waits_ms: &[f64]) -> (f64, f64) {
    if waits_ms.is_empty() {
        return (0.0, 0.0);
    }
    let mut w = waits_ms.to_vec();
    w.sort_unstable_by(f64::total_cmp);
    let mean = w.iter().sum::<f64>() / w.len() as f64;
    let p99 = w[((w.len() * 99).div_ceil(100)).saturating_sub(1)];
    (mean, p99)
}

/// One token's working set: the experts a decode step claims, `layers ×
/// top_k`. A ring smaller than that is LRU's worst case: the layer loop
/// evicts each expert before the next token comes back to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkingSet {
    /// MoE layers a token runs through.
    pub layers: u32,
    /// Experts claimed per layer.
    pub top_k: u32,
}

impl WorkingSet {
    /// `layers × top_k`.
    pub fn experts(self) -> u64 {
        u64::from(self.layers) * u64::from(self.top_k)
    }

    /// A trace's: the most layers one token runs through, times the most
    /// experts one row keeps (at most the top-k the rows were cut to).
    pub fn of_trace(tokens: &TraceTokens) -> WorkingSet {
        let layers = tokens.iter().map(Vec::len).max().unwrap_or(0);
        let top_k = tokens
            .iter()
            .flatten()
            .map(|(_, experts)| experts.len())
            .max()
            .unwrap_or(0);
        WorkingSet {
            layers: layers.min(u32::MAX as usize) as u32,
            top_k: top_k.min(u32::MAX as usize) as u32,
        }
    }
}

impl std::fmt::Display for WorkingSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} layers × top-{} = {} experts",
            self.layers,
            self.top_k,
            self.experts()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_p99() {
        assert_eq!(mean_p99(&[]), (0.0, 0.0));
        let w: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(mean_p99(&w), (50.5, 99.0));
    }

    #[test]
    fn working_set_of_a_trace() {
        let t: TraceTokens = vec![
            vec![(0, vec![1, 2]), (1, vec![3])],
            vec![(0, vec![1]), (1, vec![2, 3]), (2, vec![0, 1])],
        ];
        let ws = WorkingSet::of_trace(&t);
        assert_eq!((ws.layers, ws.top_k, ws.experts()), (3, 2, 6));
        assert_eq!(ws.to_string(), "3 layers × top-2 = 6 experts");
        assert_eq!(WorkingSet::of_trace(&vec![]).experts(), 0);
    }

    #[test]
    fn sums_every_byte() {
        assert_eq!(sum_bytes(&[1; 11]), 0x0101_0101_0101_0101 + 3);
    }
}
