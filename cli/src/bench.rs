//! `smoe bench VAULT`: streams an existing vault through the library and
//! prints what it measured, as text or one JSON object (`--json`), for the
//! scripts under `scripts/`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use smoe::internals::files::same_file;
use smoe::internals::trace::{read_trace_file, TraceTokens};
use smoe::streamer::MAX_WORKERS;
use smoe::vault::Vault;
use smoe::DirectIo;

use crate::baseline::{drop_page_cache, find_parent, mmap_replay, Cgroup, CgroupParent};
use crate::flags;
use crate::output::{gb_per_s, human_bytes, out, warning_line, Failure};
use crate::plot::PlotTarget;
use crate::sim;
use crate::stream::{decode_noting, scan, DecodeOptions};

/// What to stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Synthetic decode: top-k experts per layer per token.
    Decode,
    /// Every blob once, in file order (cold throughput).
    Scan,
}

/// The direct-I/O policy, as on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Direct {
    /// Direct I/O where the filesystem allows, else buffered with a warning.
    Auto,
    /// Direct I/O or fail.
    Require,
    /// Buffered I/O.
    Off,
}

/// The eviction policy, as on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Least recently used first (the library's default).
    Lru,
    /// Layer-aware: the expert whose layer the decode loop reaches last first.
    Adaptive,
}

impl PolicyArg {
    /// The library's setting.
    pub fn policy(self) -> smoe::Policy {
        match self {
            PolicyArg::Lru => smoe::Policy::Lru,
            PolicyArg::Adaptive => smoe::Policy::Adaptive,
        }
    }
    /// The name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        policy_name(self.policy())
    }
}

/// A policy's name on the command line and in JSON.
pub fn policy_name(policy: smoe::Policy) -> &'static str {
    match policy {
        smoe::Policy::Lru => "lru",
        smoe::Policy::Adaptive => "adaptive",
    }
}

/// The decode a `smoe bench` run asks for: the streamer's settings from the
/// command line, the router's from `--keep`, the payload check from
/// `--check-seed`.
fn decode_options(
    args: &BenchArgs,
    tokens: u32,
    ring_slots: u32,
    direct_io: DirectIo,
    top_k: u32,
    trace: Option<TraceTokens>,
    elastic: bool,
) -> DecodeOptions {
    DecodeOptions {
        tokens,
        ring_slots,
        workers: args.workers,
        direct_io,
        top_k,
        keep: args.keep,
        router_seed: 42,
        speculate: args.speculate,
        payload_seed: args.check_seed,
        trace,
        read_all: true,
        policy: args.policy.policy(),
        capture: args.capture.clone(),
        elastic,
    }
}

/// Arguments of `smoe bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The vault directory or its experts.smoe.
    pub vault: PathBuf,
    /// Decode or scan.
    #[arg(long, value_enum, default_value_t = Mode::Decode)]
    pub mode: Mode,
    /// Tokens to decode (1..=4294967295).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub tokens: u32,
    /// Ring slots: 0 = the library's choice, else at most the vault's
    /// entries, and (decode) at least --top-k, the experts a layer holds at once.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32))]
    pub ring_slots: u32,
    /// I/O workers: 0 = 16, else 1..=64.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_WORKERS)))]
    pub workers: u32,
    /// Direct-I/O policy.
    #[arg(long, value_enum, default_value_t = Direct::Auto)]
    pub direct: Direct,
    /// Active experts per layer per token: 1..=the vault's n_experts
    /// [default: 8, or n_experts when fewer].
    #[arg(long, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub top_k: Option<u32>,
    /// Probability of keeping each of the previous token's experts, 0..=1.
    #[arg(long, default_value_t = 0.45, allow_negative_numbers = true,
          value_parser = flags::probability)]
    pub keep: f64,
    /// Payload seed of a synthetic vault: check every streamed byte.
    #[arg(long, allow_negative_numbers = true, value_parser = flags::whole_u64)]
    pub check_seed: Option<u64>,
    /// Also bet on the next layer: speculatively prefetch the experts the
    /// previous token used there.
    #[arg(long)]
    pub speculate: bool,
    /// Replay a routing trace (CSV, docs/format.md §5) instead of the synthetic router
    /// (decode mode): the first --top-k ranks of each row are demanded.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// With --trace: replay only its first N tokens.
    #[arg(long, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,
    /// Eviction policy of the streamer.
    #[arg(long, value_enum, default_value_t = PolicyArg::Lru)]
    pub policy: PolicyArg,
    /// Decode mode: record every claim and write it to FILE as a routing
    /// trace (docs/format.md §5.3) when the run ends, for `--trace` replays;
    /// replaces only a missing file or an earlier trace (anything else is a
    /// warning on stderr, and nothing is recorded).
    #[arg(long, value_name = "FILE")]
    pub capture: Option<PathBuf>,
    /// With --trace: only simulate exact LRU and Belady over ring sizes (5%
    /// to 100% of the experts, and --ring-slots) and print their hit rates;
    /// streams nothing.
    #[arg(long)]
    pub sweep: bool,
    /// With --trace: replay the trace a second way, on a read-only mmap of
    /// the vault reading every byte of each routed expert, and compare.
    #[arg(long, value_enum)]
    pub baseline: Option<Baseline>,
    /// With --trace: run each side in its own memory cgroup limited to BYTES,
    /// page cache dropped before each (root only); the ring (--ring-slots, or
    /// if 0 the largest that fits the cap with 10% headroom) must fit.
    #[arg(long, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub mem_cap: Option<u64>,
    /// With --mem-cap but no rights to isolate: run uncapped and warm instead
    /// of refusing.
    #[arg(long)]
    pub no_isolation: bool,
    /// With --trace: draw hit rate against ring size (and, with --baseline,
    /// per-token waits) into this SVG file; replaces only a missing file, an
    /// empty one or an SVG, anything else is refused before the run.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Internal: run only one side (a child process of a capped run) and
    /// print its measurements as JSON.
    #[arg(long, value_enum, hide = true)]
    pub side: Option<Side>,
    /// Internal: the cgroup directory the side enters before it reads.
    #[arg(long, hide = true)]
    pub cgroup: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The baseline to compare with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Baseline {
    /// mmap the vault and let the page cache work.
    Mmap,
}

/// One side of a comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Side {
    /// The streamer.
    Smoe,
    /// The mmap baseline.
    Mmap,
}

/// `--top-k` when not given (Qwen3's), lowered to the vault's n_experts
/// when fewer.
const DEFAULT_TOP_K: u32 = 8;

/// Checks the flags whose range depends on the vault, `--top-k` (its experts
/// per layer) and `--ring-slots` (its entries; a decode holds a layer's
/// top-k at once), and returns the top-k to use. Out of range is exit 1 with
/// one line naming the flag, the value and the range.
fn check_against(args: &BenchArgs, vault: &Vault) -> Result<u32, Failure> {
    let file = vault.path().display();
    let n_experts = vault.n_experts();
    let top_k = match args.top_k {
        None => DEFAULT_TOP_K.min(n_experts),
        Some(k) if k <= n_experts => k,
        Some(k) => {
            return Err(Failure::Message(format!(
                "--top-k {k} is out of range for {file}: expected 1..={n_experts} (the vault's n_experts)"
            )))
        }
    };
    let n_entries = vault.entries().len() as u32;
    let least = match args.mode {
        Mode::Decode => top_k.min(n_entries),
        Mode::Scan => 1,
    };
    if args.ring_slots != 0 && !(least..=n_entries).contains(&args.ring_slots) {
        let why = match args.mode {
            Mode::Decode => format!("at least --top-k {top_k}, "),
            Mode::Scan => String::new(),
        };
        return Err(Failure::Message(format!(
            "--ring-slots {} is out of range for {file}: expected 0 (auto) or {least}..={n_entries} ({why}at most the vault's {n_entries} entries)",
            args.ring_slots
        )));
    }
    Ok(top_k)
}

/// Refuses flags that the rest of the command line leaves without effect
/// (a usage error, exit 2), before anything is opened.
fn check_flags(args: &BenchArgs) -> Result<(), Failure> {
    let usage = |message: &str| Err(Failure::Usage(message.to_owned()));
    if args.trace.is_none() {
        for (set, flag) in [
            (args.sweep, "--sweep"),
            (args.baseline.is_some(), "--baseline"),
            (args.mem_cap.is_some(), "--mem-cap"),
            (args.plot.is_some(), "--plot"),
            (args.max_tokens.is_some(), "--max-tokens"),
            (args.side.is_some(), "--side"),
        ] {
            if set {
                return usage(&format!("{flag} needs --trace"));
            }
        }
    }
    if args.mode == Mode::Scan {
        for (set, flag) in [
            (args.trace.is_some(), "--trace"),
            (args.capture.is_some(), "--capture"),
        ] {
            if set {
                return usage(&format!(
                    "{flag} is for a decode: --mode scan reads every blob once and claims no token"
                ));
            }
        }
    }
    if args.sweep && args.capture.is_some() {
        return usage("--capture records the claims of a run: --sweep only simulates");
    }
    Ok(())
}

/// Runs `smoe bench`.
pub fn run(args: &BenchArgs) -> Result<(), Failure> {
    check_flags(args)?;
    if let Some(dir) = &args.cgroup {
        // A side of a capped run: into the cap before anything is read.
        crate::baseline::enter(dir)?;
    }
    let vault = Vault::open(&args.vault)?;
    let top_k = check_against(args, &vault)?;
    // The plot's file is judged now, before the run: a file that is not an
    // SVG is refused before any work is done.
    let plot = match &args.plot {
        Some(given) => Some(PlotTarget::judge(given, vault.path())?),
        None => None,
    };
    if let (Some(plot), Some(capture)) = (&plot, &args.capture) {
        if same_file(plot.path(), capture) {
            return Err(Failure::Usage(format!(
                "--plot {} and --capture {} name the same file",
                plot.path().display(),
                capture.display()
            )));
        }
    }
    let direct_io = match args.direct {
        Direct::Auto => DirectIo::Auto,
        Direct::Require => DirectIo::Require,
        Direct::Off => DirectIo::Off,
    };
    match args.mode {
        Mode::Scan => {
            let r = scan(
                vault,
                args.ring_slots,
                args.workers,
                direct_io,
                &mut warning_line,
            )?;
            if args.json {
                out(&format!(
                    "{{\"mode\":\"scan\",\"bytes_read\":{},\"seconds\":{:.6},\"gb_per_s\":{:.4},\"workers\":{},\"ring_slots\":{},\"slot_bytes\":{},\"direct_io\":{}}}\n",
                    r.bytes_read,
                    r.seconds,
                    r.bytes_read as f64 / r.seconds / 1e9,
                    r.stats.workers,
                    r.stats.ring_slots,
                    r.stats.slot_bytes,
                    r.stats.direct_io
                ))
            } else {
                out(&format!(
                    "scan: {} in {:.2} s = {} with {} workers, {} ({} slots of {})\n",
                    human_bytes(r.bytes_read),
                    r.seconds,
                    gb_per_s(r.bytes_read, r.seconds),
                    r.stats.workers,
                    if r.stats.direct_io == 1 {
                        "direct I/O"
                    } else {
                        "buffered I/O"
                    },
                    r.stats.ring_slots,
                    human_bytes(r.stats.slot_bytes)
                ))
            }
        }
        Mode::Decode => {
            if let Some(path) = &args.trace {
                let max_tokens = args.max_tokens.map(|n| n as usize);
                let tokens = read_trace_file(path, top_k as usize, max_tokens)?;
                return run_trace(args, vault, top_k, direct_io, tokens, plot.as_ref());
            }
            let opts = decode_options(
                args,
                args.tokens,
                args.ring_slots,
                direct_io,
                top_k,
                None,
                true,
            );
            let r = decode_noting(vault, &opts, &mut warning_line, &mut |_| {})?;
            let st = &r.stats;
            let (mean, p99) = r.wait_mean_p99();
            let coverage = st.hits as f64 / st.claims.max(1) as f64;
            if args.json {
                out(&format!(
                    "{{\"mode\":\"decode\",\"tokens\":{},\"claims\":{},\"hits\":{},\"coverage\":{coverage:.4},\"bytes_read\":{},\"seconds\":{:.6},\"gb_per_s\":{:.4},\"wait_mean_ms\":{:.3},\"wait_p99_ms\":{:.3},\"ring_slots\":{},\"direct_io\":{}}}\n",
                    r.tokens,
                    st.claims,
                    st.hits,
                    st.bytes_read,
                    r.seconds,
                    st.bytes_read as f64 / r.seconds / 1e9,
                    mean.as_secs_f64() * 1e3,
                    p99.as_secs_f64() * 1e3,
                    st.ring_slots,
                    st.direct_io
                ))
            } else {
                out(&format!(
                    "decode: {} tokens, coverage {:.1}%, read {} in {:.2} s = {}, wait per token mean {:.2} ms p99 {:.2} ms ({} slots)\n",
                    r.tokens,
                    coverage * 100.0,
                    human_bytes(st.bytes_read),
                    r.seconds,
                    gb_per_s(st.bytes_read, r.seconds),
                    mean.as_secs_f64() * 1e3,
                    p99.as_secs_f64() * 1e3,
                    st.ring_slots
                ))
            }
        }
    }
}

/// Mean and 99th percentile of per-token waits in ms.
fn mean_p99(waits_ms: &[f64]) -> (f64, f64) {
    if waits_ms.is_empty() {
        return (0.0, 0.0);
    }
    let mut w = waits_ms.to_vec();
    w.sort_unstable_by(f64::total_cmp);
    let mean = w.iter().sum::<f64>() / w.len() as f64;
    let p99 = w[((w.len() * 99).div_ceil(100)).saturating_sub(1)];
    (mean, p99)
}

/// The trace names only experts the vault holds.
pub(crate) fn check_trace(vault: &Vault, tokens: &TraceTokens) -> Result<(), Failure> {
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

/// Per ring size of a sweep: (slots, LRU rate, Belady rate).
fn sweep_rows(seq: &[u32], entries: u32, extra: u32) -> Vec<(u32, f64, f64)> {
    sim::sweep_sizes(entries, extra)
        .into_iter()
        .map(|n| {
            (
                n,
                sim::lru(seq, n as usize).rate(),
                sim::belady(seq, n as usize).rate(),
            )
        })
        .collect()
}

fn direct_name(d: Direct) -> &'static str {
    match d {
        Direct::Auto => "auto",
        Direct::Require => "require",
        Direct::Off => "off",
    }
}

/// Runs one side in this process; its measurements as JSON.
fn side_here(
    side: Side,
    args: &BenchArgs,
    vault_path: &std::path::Path,
    top_k: u32,
    direct_io: DirectIo,
    ring_slots: u32,
    tokens: &TraceTokens,
) -> Result<Value, Failure> {
    let vault = Vault::open(vault_path)?;
    match side {
        Side::Smoe => {
            // A capped side's ring fills 90% of the cap on purpose: a fixed
            // ring, or the elastic one would shrink it and the comparison
            // with mmap would measure a smaller ring.
            let opts = decode_options(
                args,
                tokens.len() as u32,
                ring_slots,
                direct_io,
                top_k,
                Some(tokens.clone()),
                args.cgroup.is_none(),
            );
            let r = decode_noting(vault, &opts, &mut warning_line, &mut |_| {})?;
            let st = &r.stats;
            Ok(json!({
                "side": "smoe",
                "tokens": r.tokens,
                "claims": st.claims,
                "hits": st.hits,
                "bytes_read": st.bytes_read,
                "seconds": r.seconds,
                "ring_slots": st.ring_slots,
                "slot_bytes": st.slot_bytes,
                "direct_io": st.direct_io,
                "waits_ms": r.waits.iter().map(|w| w.as_secs_f64() * 1e3).collect::<Vec<f64>>(),
            }))
        }
        Side::Mmap => {
            let r = mmap_replay(&vault, tokens)?;
            Ok(json!({
                "side": "mmap",
                "seconds": r.seconds,
                "waits_ms": r.waits.iter().map(|w| w.as_secs_f64() * 1e3).collect::<Vec<f64>>(),
            }))
        }
    }
}

/// Runs one side as a child process inside a fresh memory cgroup of `cap`
/// bytes, the page cache dropped first; its measurements as JSON.
#[allow(clippy::too_many_arguments)]
fn side_capped(
    side: Side,
    args: &BenchArgs,
    trace: &std::path::Path,
    top_k: u32,
    ring_slots: u32,
    parent: &CgroupParent,
    cap: u64,
) -> Result<Value, Failure> {
    let name = format!(
        "smoe-bench-{}-{}",
        std::process::id(),
        if side == Side::Smoe { "smoe" } else { "mmap" }
    );
    let cg = Cgroup::create(parent, &name, cap)?;
    drop_page_cache().map_err(Failure::Message)?;
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Message(format!("cannot find this program to run a side: {e}")))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("bench")
        .arg(&args.vault)
        .arg("--trace")
        .arg(trace)
        .args(["--top-k", &top_k.to_string()])
        .args(["--ring-slots", &ring_slots.to_string()])
        .args(["--workers", &args.workers.to_string()])
        .args(["--direct", direct_name(args.direct)])
        .args(["--keep", &args.keep.to_string()])
        .args(["--policy", args.policy.name()])
        .args(["--side", if side == Side::Smoe { "smoe" } else { "mmap" }])
        .arg("--cgroup")
        .arg(&cg.path);
    if let Some(n) = args.max_tokens {
        cmd.args(["--max-tokens", &n.to_string()]);
    }
    if args.speculate {
        cmd.arg("--speculate");
    }
    if let (Side::Smoe, Some(capture)) = (side, &args.capture) {
        cmd.arg("--capture").arg(capture);
    }
    if let Some(seed) = args.check_seed {
        cmd.args(["--check-seed", &seed.to_string()]);
    }
    let output = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Failure::Message(format!("cannot run a side of the comparison: {e}")))?;
    drop(cg);
    if !output.status.success() {
        return Err(Failure::Message(format!(
            "the capped {} side failed ({})",
            if side == Side::Smoe { "smoe" } else { "mmap" },
            output.status
        )));
    }
    serde_json::from_slice(&output.stdout)
        .map_err(|e| Failure::Message(format!("a side of the comparison printed no JSON: {e}")))
}

fn f64_of(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

fn waits_of(v: &Value) -> Vec<f64> {
    v.get("waits_ms")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// `smoe bench --trace`: the sweep, one side (a child of a capped run), or
/// the replay with its simulation, baseline and plot.
fn run_trace(
    args: &BenchArgs,
    vault: Vault,
    top_k: u32,
    direct_io: DirectIo,
    tokens: TraceTokens,
    plot: Option<&PlotTarget>,
) -> Result<(), Failure> {
    check_trace(&vault, &tokens)?;
    let trace_path = args.trace.clone().unwrap_or_default();
    let entries = vault.entries().len() as u32;
    let seq = sim::claims(&tokens);
    if args.sweep {
        let rows = sweep_rows(&seq, entries, args.ring_slots);
        if let Some(plot) = plot {
            crate::plot::write(
                plot,
                &crate::plot::PlotData {
                    entries,
                    sweep: &rows,
                    policy: args.policy.name(),
                    measured: None,
                    waits: None,
                },
            )?;
        }
        if args.json {
            let rows: Vec<Value> = rows
                .iter()
                .map(|&(n, l, b)| json!({"ring_slots": n, "lru": round4(l), "belady": round4(b), }))
                .collect();
            return out(&format!(
                "{}\n",
                json!({"mode": "sweep", "tokens": tokens.len(), "claims": seq.len(), "experts": entries, "policy": args.policy.name(), "rows": rows})
            ));
        }
        let mut text = format!(
            "sweep: {} tokens, {} demand claims (top-{top_k}) over {entries} experts, simulated\n{:>8} {:>9} {:>8} {:>8}\n",
            tokens.len(),
            seq.len(),
            "slots",
            "% experts",
            "LRU",
            "Belady"
        );
        for (n, l, b) in rows {
            text.push_str(&format!(
                "{n:>8} {:>8.1}% {:>7.1}% {:>7.1}%\n",
                100.0 * f64::from(n) / f64::from(entries.max(1)),
                l * 100.0,
                b * 100.0
            ));
        }
        return out(&text);
    }
    let vault_path = vault.path().to_path_buf();
    if let Some(side) = args.side {
        drop(vault);
        let v = side_here(
            side,
            args,
            &vault_path,
            top_k,
            direct_io,
            args.ring_slots,
            &tokens,
        )?;
        return out(&format!("{v}\n"));
    }
    // Capped: the ring must fit the cap with 10% headroom.
    let mut ring_slots = args.ring_slots;
    if let Some(cap) = args.mem_cap {
        let slot = vault
            .entries()
            .iter()
            .map(|e| e.padded_size)
            .max()
            .unwrap_or(1)
            // The streamer's slot: the largest padded blob rounded up to
            // the default alignment (docs/c-api.md, "Ring sizing").
            .next_multiple_of(u64::from(smoe::vault::DEFAULT_ALIGNMENT))
            .max(u64::from(smoe::vault::DEFAULT_ALIGNMENT));
        let room = cap / 10 * 9;
        if ring_slots == 0 {
            ring_slots = (room / slot).min(u64::from(entries)) as u32;
            if ring_slots < top_k {
                return Err(Failure::Message(format!(
                    "--mem-cap {cap}: with 10% headroom it holds {ring_slots} slots of {slot} bytes, fewer than --top-k {top_k}"
                )));
            }
        } else if u64::from(ring_slots) * slot > room {
            return Err(Failure::Message(format!(
                "--ring-slots {ring_slots} × {slot} bytes does not fit --mem-cap {cap} with 10% headroom ({room} bytes)"
            )));
        }
    }
    drop(vault);
    let isolation: Option<CgroupParent> = match args.mem_cap {
        None => None,
        Some(_) => {
            match find_parent() {
                Ok(p) => Some(p),
                Err(why) if args.no_isolation => {
                    if !args.json {
                        out(&format!("note: {why}; running uncapped with a warm page cache (--no-isolation)\n"))?;
                    }
                    None
                }
                Err(why) => {
                    return Err(Failure::Message(format!(
                        "cannot cap memory: {why} (--no-isolation runs uncapped and warm)"
                    )))
                }
            }
        }
    };
    let run_side = |side: Side, ring: u32| -> Result<Value, Failure> {
        match (&isolation, args.mem_cap) {
            (Some(parent), Some(cap)) => {
                side_capped(side, args, &trace_path, top_k, ring, parent, cap)
            }
            _ => side_here(side, args, &vault_path, top_k, direct_io, ring, &tokens),
        }
    };
    let smoe_side = run_side(Side::Smoe, ring_slots)?;
    let ring = u64_of(&smoe_side, "ring_slots") as u32;
    let mmap_side = match args.baseline {
        Some(Baseline::Mmap) => Some(run_side(Side::Mmap, ring)?),
        None => None,
    };
    let lru = sim::lru(&seq, ring as usize).rate();
    let belady = sim::belady(&seq, ring as usize).rate();
    let claims = u64_of(&smoe_side, "claims");
    let hits = u64_of(&smoe_side, "hits");
    let bytes_read = u64_of(&smoe_side, "bytes_read");
    let seconds = f64_of(&smoe_side, "seconds");
    let coverage = hits as f64 / claims.max(1) as f64;
    let smoe_waits = waits_of(&smoe_side);
    let (mean, p99) = mean_p99(&smoe_waits);
    let mmap_waits = mmap_side.as_ref().map(waits_of);
    let isolation_name = match (&isolation, args.mem_cap) {
        (Some(p), Some(_)) => p.name(),
        _ => "none",
    };
    if let Some(plot) = plot {
        let rows = sweep_rows(&seq, entries, ring);
        crate::plot::write(
            plot,
            &crate::plot::PlotData {
                entries,
                sweep: &rows,
                policy: args.policy.name(),
                measured: Some((ring, coverage)),
                waits: mmap_waits.as_deref().map(|m| (&smoe_waits[..], m)),
            },
        )?;
    }
    if args.json {
        let mut o = json!({
            "mode": "decode",
            "tokens": u64_of(&smoe_side, "tokens"),
            "claims": claims,
            "hits": hits,
            "coverage": round4(coverage),
            "bytes_read": bytes_read,
            "seconds": seconds,
            "gb_per_s": round4(bytes_read as f64 / seconds.max(1e-9) / 1e9),
            "wait_mean_ms": round3(mean),
            "wait_p99_ms": round3(p99),
            "ring_slots": ring,
            "direct_io": u64_of(&smoe_side, "direct_io"),
            "policy": args.policy.name(),
            "mem_cap_bytes": args.mem_cap,
            "isolation": isolation_name,
            "sim": {"lru": round4(lru), "belady": round4(belady)},
        });
        if let (Some(m), Some(w)) = (&mmap_side, &mmap_waits) {
            let (mm, mp) = mean_p99(w);
            o["baseline"] = json!({
                "kind": "mmap",
                "wait_mean_ms": round3(mm),
                "wait_p99_ms": round3(mp),
                "seconds": f64_of(m, "seconds"),
            });
            o["ratio"] = json!(round4(mean / mm.max(1e-9)));
        }
        return out(&format!("{o}\n"));
    }
    let mut text = format!(
        "decode: {} tokens, coverage {:.1}%, read {} in {:.2} s = {}, wait per token mean {:.2} ms p99 {:.2} ms ({} slots)\n",
        u64_of(&smoe_side, "tokens"),
        coverage * 100.0,
        human_bytes(bytes_read),
        seconds,
        gb_per_s(bytes_read, seconds),
        mean,
        p99,
        ring
    );
    text.push_str(&format!(
        "{:<8} {:>16} {:>12} {:>10}\n{:<8} {:>13.2} ms {:>9.2} ms {:>9.1}%\n",
        "",
        "wait/token mean",
        "p99",
        "hit rate",
        "smoe",
        mean,
        p99,
        coverage * 100.0
    ));
    if let Some(w) = &mmap_waits {
        let (mm, mp) = mean_p99(w);
        text.push_str(&format!(
            "{:<8} {:>13.2} ms {:>9.2} ms {:>10}\n",
            "mmap", mm, mp, "-"
        ));
        text.push_str(&format!(
            "{:<8} {:>16} {:>12} {:>9.1}%  (simulated; exact LRU {:.1}%)\nsmoe/mmap wait ratio {:.2}\n",
            "Belady",
            "-",
            "-",
            belady * 100.0,
            lru * 100.0,
            mean / mm.max(1e-9)
        ));
    } else {
        text.push_str(&format!(
            "{:<8} {:>16} {:>12} {:>9.1}%  (simulated; exact LRU {:.1}%)\n",
            "Belady",
            "-",
            "-",
            belady * 100.0,
            lru * 100.0
        ));
    }
    text.push_str(&match (args.mem_cap, isolation_name) {
        (Some(cap), "none") => format!("memory: uncapped, warm page cache (--mem-cap {cap} not enforced)\n"),
        (Some(cap), name) => format!(
            "memory: each side in a memory cgroup of its own ({name}) capped at {}, page cache dropped before each\n",
            human_bytes(cap)
        ),
        (None, _) => "memory: uncapped\n".to_string(),
    });
    out(&text)
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}
