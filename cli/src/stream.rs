//! Streaming through the library: the decode loop of the demo and of
//! `smoe bench` (the smoe side of a replay), and the cold sequential scan
//! that `scripts/bench-io.sh` compares with fio.

use std::time::{Duration, Instant};

use smoe::internals::router::{RouterConfig, SyntheticRouter};
use smoe::vault::synth::first_mismatch;
use smoe::vault::Vault;
use smoe::{Config, DirectIo, Priority, Stats, Streamer};

use crate::output::Failure;
use crate::replay::{check_trace, moe_layers, sum_bytes};

/// How to run a synthetic decode.
#[derive(Clone, Debug)]
pub struct DecodeOptions {
    /// Tokens to decode.
    pub tokens: u32,
    /// Ring slots (0 = the library's choice).
    pub ring_slots: u32,
    /// I/O workers (0 = the library's default).
    pub workers: u32,
    /// Direct-I/O policy.
    pub direct_io: DirectIo,
    /// Active experts per layer per token.
    pub top_k: u32,
    /// Probability that the router keeps each of the previous token's experts.
    pub keep: f64,
    /// Router seed.
    pub router_seed: u64,
    /// Speculatively prefetch the next layer's previous-token experts.
    pub speculate: bool,
    /// When the vault is synthetic: its payload seed, to check every byte.
    pub payload_seed: Option<u64>,
    /// Replay these tokens (from a routing trace) instead of the synthetic
    /// router: per token, `(layer, experts)` in execution order.
    pub trace: Option<smoe::internals::router::TraceTokens>,
    /// Read (sum) every byte of each claimed expert inside the timed wait:
    /// the same work per expert as the mmap baseline of `smoe bench`.
    pub read_all: bool,
    /// The streamer's eviction policy.
    pub policy: smoe::Policy,
    /// Record the claims into this routing-trace file (`trace_path`).
    pub capture: Option<std::path::PathBuf>,
    /// The library's elastic ring (its default). Off where the ring is
    /// sized to a memory cap on purpose and must stay that size for a
    /// comparison to mean anything (`smoe bench --mem-cap`).
    pub elastic: bool,
}

/// What a decode measured.
#[derive(Clone, Debug)]
pub struct DecodeReport {
    /// Tokens decoded.
    pub tokens: u32,
    /// MoE layers per token.
    pub layers: u32,
    /// Wall time of the decode loop.
    pub seconds: f64,
    /// Per token: time spent inside `claim_wait` (and reading each expert's
    /// bytes, with `read_all`).
    pub waits: Vec<Duration>,
    /// The streamer's counters at the end.
    pub stats: Stats,
    /// Bytes whose payload was checked against the generator.
    pub bytes_checked: u64,
}

impl DecodeReport {
    /// Mean and 99th-percentile wait per token.
    pub fn wait_mean_p99(&self) -> (Duration, Duration) {
        if self.waits.is_empty() {
            return (Duration::ZERO, Duration::ZERO);
        }
        let mut w = self.waits.clone();
        w.sort_unstable();
        let mean = w.iter().sum::<Duration>() / w.len() as u32;
        let p99 = w[((w.len() * 99).div_ceil(100)).saturating_sub(1)];
        (mean, p99)
    }
}

/// Decodes `opts.tokens` tokens (or the trace's) through a streamer on
/// `vault`: per layer, demand-prefetch the routed experts, optionally bet on
/// the next layer, claim each (waiting), check its bytes, release. Each of
/// the streamer's open-time warnings goes to `on_warning` as soon as it is
/// open: before the run, so that a run that fails later has still said
/// them. `on_token` is called after each token.
pub fn decode(
    vault: Vault,
    opts: &DecodeOptions,
    on_warning: &mut dyn FnMut(&str),
    on_token: &mut dyn FnMut(u32),
) -> Result<DecodeReport, Failure> {
    let s = Streamer::with_vault(
        vault,
        Config {
            ring_slots: opts.ring_slots,
            workers: opts.workers,
            direct_io: opts.direct_io,
            policy: opts.policy,
            trace_path: opts.capture.clone(),
            elastic: opts.elastic,
            ..Config::default()
        },
    )?;
    s.warnings().iter().for_each(|w| on_warning(w));
    let v = s.vault();
    let layers = moe_layers(v);
    let n_layers = layers.len() as u32;
    let mut router = SyntheticRouter::new(RouterConfig {
        layers,
        n_experts: v.n_experts(),
        top_k: opts.top_k,
        keep: opts.keep,
        zipf: 1.0,
        seed: opts.router_seed,
    })?;
    if let Some(trace) = &opts.trace {
        check_trace(v, trace)?;
    }
    let tokens = opts
        .trace
        .as_ref()
        .map_or(opts.tokens, |t| t.len().min(u32::MAX as usize) as u32);
    // The engine is busy from here on: no pre-warm reads compete with demand.
    s.prewarm_pause(true);
    let mut previous: Vec<(u32, Vec<u32>)> = Vec::new();
    // 16 bytes a token, for the p99: a count the machine cannot hold is an
    // error, not an abort.
    let mut waits: Vec<Duration> = Vec::new();
    waits.try_reserve_exact(tokens as usize).map_err(|_| {
        Failure::Message(format!(
            "cannot allocate {} bytes to record the wait of each of {tokens} tokens",
            tokens as u128 * std::mem::size_of::<Duration>() as u128
        ))
    })?;
    let mut bytes_checked = 0u64;
    let start = Instant::now();
    for t in 0..tokens {
        let token = match &opts.trace {
            Some(trace) => trace[t as usize].clone(),
            None => router.next_token(),
        };
        let mut wait = Duration::ZERO;
        for (i, (layer, experts)) in token.iter().enumerate() {
            for &e in experts {
                s.prefetch(*layer, e, Priority::Demand)?;
            }
            if opts.speculate {
                if let Some((next_layer, guess)) = previous.get(i + 1) {
                    for &e in guess {
                        // A full ring only costs the bet.
                        let _ = s.prefetch(*next_layer, e, Priority::Speculative);
                    }
                }
            }
            for &e in experts {
                let t0 = Instant::now();
                let claim = s
                    .claim_wait(*layer, e, Duration::from_secs(30))?
                    .ok_or_else(|| {
                        Failure::Message(format!("layer {layer} expert {e}: not read within 30 s"))
                    })?;
                if opts.read_all {
                    std::hint::black_box(sum_bytes(&claim));
                }
                wait += t0.elapsed();
                if let Some(seed) = opts.payload_seed {
                    if let Some(at) = first_mismatch(seed, *layer, e, &claim) {
                        return Err(Failure::Message(format!(
                            "layer {layer} expert {e}: streamed byte at offset {at} is wrong"
                        )));
                    }
                    bytes_checked += claim.len() as u64;
                }
            }
        }
        previous = token;
        waits.push(wait);
        on_token(t);
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(DecodeReport {
        tokens,
        layers: n_layers,
        seconds,
        waits,
        stats: s.stats(),
        bytes_checked,
    })
}

/// What a cold scan measured.
#[derive(Clone, Debug)]
pub struct ScanReport {
    /// Bytes the workers read.
    pub bytes_read: u64,
    /// Wall time from the first prefetch to the last release.
    pub seconds: f64,
    /// The streamer's counters at the end.
    pub stats: Stats,
}

/// Every expert of `vault` as (layer, expert), in file order: a vault's by
/// blob offset; a model's by its first window (file, then offset), the
/// windows the library's read path reads ([`smoe::vault::InPlace::reads`]).
fn scan_order(vault: &Vault) -> Vec<(u32, u32)> {
    let (mut reads, mut moves) = (Vec::new(), Vec::new());
    let mut order: Vec<(usize, u64, u32, u32)> = vault
        .entries()
        .iter()
        .map(|e| match vault.model() {
            None => (0, e.offset, e.layer, e.expert),
            Some(m) => {
                reads.clear();
                moves.clear();
                m.reads(e.layer, e.expert, &mut reads, &mut moves);
                let (file, offset) = reads.first().map_or((0, e.offset), |r| (r.file, r.offset));
                (file, offset, e.layer, e.expert)
            }
        })
        .collect();
    order.sort_unstable();
    order.into_iter().map(|(_, _, l, e)| (l, e)).collect()
}

/// Streams every blob once, in file order, keeping `2 × workers` reads in
/// flight: the library's cold-read throughput on this drive. Each of the
/// streamer's open-time warnings goes to `on_warning` once it is open;
/// `on_blob` gets each blob's size once it is claimed.
pub fn scan(
    vault: Vault,
    ring_slots: u32,
    workers: u32,
    direct_io: DirectIo,
    on_warning: &mut dyn FnMut(&str),
    on_blob: &mut dyn FnMut(u64),
) -> Result<ScanReport, Failure> {
    let s = Streamer::with_vault(
        vault,
        Config {
            ring_slots,
            workers,
            direct_io,
            ..Config::default()
        },
    )?;
    s.warnings().iter().for_each(|w| on_warning(w));
    let order = scan_order(s.vault());
    let window = (s.stats().workers as usize * 2)
        .min(s.stats().ring_slots as usize / 2)
        .max(1);
    let start = Instant::now();
    for (i, &(l, e)) in order.iter().enumerate() {
        if i == 0 {
            for &(l2, e2) in order.iter().take(window) {
                s.prefetch(l2, e2, Priority::Demand)?;
            }
        } else if let Some(&(l2, e2)) = order.get(i + window - 1) {
            s.prefetch(l2, e2, Priority::Demand)?;
        }
        let c = s
            .claim_wait(l, e, Duration::from_secs(30))?
            .ok_or_else(|| {
                Failure::Message(format!("layer {l} expert {e}: not read within 30 s"))
            })?;
        std::hint::black_box(c.first());
        on_blob(c.len() as u64);
    }
    let seconds = start.elapsed().as_secs_f64();
    let stats = s.stats();
    Ok(ScanReport {
        bytes_read: stats.bytes_read,
        seconds,
        stats,
    })
}
