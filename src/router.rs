//! Expert routing for demos and benchmarks: a synthetic router with the
//! statistics real MoE routers show. Routing traces, the recorded kind, are
//! [`crate::trace`]'s: read and written there (docs/format.md §5).
//!
//! The synthetic router keeps each of the previous token's experts with
//! probability `keep` (per layer) and fills the rest of the top-k from a Zipf
//! popularity over a per-layer shuffle of the experts. With `keep ≈ 0.45` and
//! exponent 1 it gives what published measurements of 128-expert, top-8
//! models report: about 40% adjacent-token reuse, and about 12% of experts
//! carrying well over half of the traffic.

use crate::error::{Error, Result};

/// A small, fast, seedable generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A uniform float in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A uniform integer in 0..n (n > 0).
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * u64::from(n)) >> 32) as u32
    }
}

/// Settings of [`SyntheticRouter`].
#[derive(Clone, Debug, PartialEq)]
pub struct RouterConfig {
    /// Layers routed (MoE layers only).
    pub layers: Vec<u32>,
    /// Experts per layer.
    pub n_experts: u32,
    /// Active experts per layer per token.
    pub top_k: u32,
    /// Probability that each of the previous token's experts is kept.
    pub keep: f64,
    /// Zipf exponent of expert popularity.
    pub zipf: f64,
    /// Seed.
    pub seed: u64,
}

/// Generates top-k expert choices per layer, token after token.
#[derive(Clone, Debug)]
pub struct SyntheticRouter {
    config: RouterConfig,
    rng: Rng,
    /// Zipf cumulative weights over popularity ranks.
    cdf: Vec<f64>,
    /// Per layer: popularity rank → expert id.
    order: Vec<Vec<u32>>,
    /// Per layer: the previous token's experts.
    previous: Vec<Vec<u32>>,
}

impl SyntheticRouter {
    /// A router; errors when top_k is 0 or exceeds n_experts, or `keep` is
    /// not a probability.
    pub fn new(config: RouterConfig) -> Result<SyntheticRouter> {
        if config.top_k == 0 || config.top_k > config.n_experts {
            return Err(Error::argument(format!(
                "top_k is {}, expected 1..={} (n_experts)",
                config.top_k, config.n_experts
            )));
        }
        if !(0.0..=1.0).contains(&config.keep) {
            return Err(Error::argument(format!(
                "keep probability is {}, expected 0..=1",
                config.keep
            )));
        }
        let mut rng = Rng::new(config.seed);
        let mut cdf = Vec::with_capacity(config.n_experts as usize);
        let mut total = 0.0;
        for rank in 0..config.n_experts {
            total += 1.0 / f64::from(rank + 1).powf(config.zipf);
            cdf.push(total);
        }
        let order = config
            .layers
            .iter()
            .map(|_| {
                let mut ids: Vec<u32> = (0..config.n_experts).collect();
                for i in (1..ids.len()).rev() {
                    let j = rng.below(i as u32 + 1) as usize;
                    ids.swap(i, j);
                }
                ids
            })
            .collect();
        Ok(SyntheticRouter {
            previous: vec![Vec::new(); config.layers.len()],
            config,
            rng,
            cdf,
            order,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    fn zipf_draw(&mut self, layer_index: usize) -> u32 {
        let total = *self.cdf.last().unwrap_or(&1.0);
        let x = self.rng.unit() * total;
        let rank = self
            .cdf
            .partition_point(|&c| c <= x)
            .min(self.cdf.len() - 1);
        self.order[layer_index][rank]
    }

    /// The next token's experts: one `(layer, experts)` per configured layer,
    /// in layer order, `top_k` distinct experts each.
    pub fn next_token(&mut self) -> Vec<(u32, Vec<u32>)> {
        let k = self.config.top_k as usize;
        let mut token = Vec::with_capacity(self.config.layers.len());
        for li in 0..self.config.layers.len() {
            let mut chosen: Vec<u32> = Vec::with_capacity(k);
            let previous = std::mem::take(&mut self.previous[li]);
            for &e in &previous {
                if self.rng.unit() < self.config.keep {
                    chosen.push(e);
                }
            }
            while chosen.len() < k {
                let e = self.zipf_draw(li);
                if !chosen.contains(&e) {
                    chosen.push(e);
                }
            }
            self.previous[li] = chosen.clone();
            token.push((self.config.layers[li], chosen));
        }
        token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(keep: f64) -> SyntheticRouter {
        SyntheticRouter::new(RouterConfig {
            layers: (0..8).collect(),
            n_experts: 128,
            top_k: 8,
            keep,
            zipf: 1.0,
            seed: 3,
        })
        .unwrap()
    }

    #[test]
    fn top_k_distinct_experts_per_layer() {
        let mut r = router(0.45);
        for _ in 0..100 {
            let t = r.next_token();
            assert_eq!(t.len(), 8);
            for (_, experts) in t {
                let mut e = experts.clone();
                e.sort_unstable();
                e.dedup();
                assert_eq!(e.len(), 8);
                assert!(e.iter().all(|&x| x < 128));
            }
        }
    }

    #[test]
    fn statistics_look_like_a_real_router() {
        let mut r = router(0.45);
        let mut prev: Option<Vec<(u32, Vec<u32>)>> = None;
        let (mut kept, mut total) = (0usize, 0usize);
        let mut counts = vec![0u64; 8 * 128];
        for _ in 0..4000 {
            let t = r.next_token();
            for (l, experts) in &t {
                for &e in experts {
                    counts[*l as usize * 128 + e as usize] += 1;
                }
            }
            if let Some(p) = prev {
                for ((_, a), (_, b)) in p.iter().zip(&t) {
                    kept += b.iter().filter(|e| a.contains(e)).count();
                    total += b.len();
                }
            }
            prev = Some(t);
        }
        let overlap = kept as f64 / total as f64;
        assert!(
            (0.40..0.60).contains(&overlap),
            "adjacent overlap {overlap}"
        );
        // The hottest 12% of each layer's experts carry over half the traffic.
        let mut hot = 0u64;
        for l in 0..8 {
            let mut c: Vec<u64> = counts[l * 128..(l + 1) * 128].to_vec();
            c.sort_unstable_by(|a, b| b.cmp(a));
            hot += c[..15].iter().sum::<u64>();
        }
        let share = hot as f64 / counts.iter().sum::<u64>() as f64;
        assert!((0.5..0.75).contains(&share), "top-12% share {share}");
    }
}
