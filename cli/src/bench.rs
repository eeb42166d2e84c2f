//! `smoe bench VAULT`: streams an existing vault through the library and
//! prints what it measured, as text or one JSON object (`--json`), for the
//! scripts under `scripts/`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use smoe::internals::router::{parse_trace, trace_tokens};
use smoe::streamer::MAX_WORKERS;
use smoe::vault::Vault;
use smoe::DirectIo;

use crate::flags;
use crate::output::{gb_per_s, human_bytes, out, Failure};
use crate::stream::{decode, scan, DecodeOptions};

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
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
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

/// Runs `smoe bench`.
pub fn run(args: &BenchArgs) -> Result<(), Failure> {
    let vault = Vault::open(&args.vault)?;
    let top_k = check_against(args, &vault)?;
    let direct_io = match args.direct {
        Direct::Auto => DirectIo::Auto,
        Direct::Require => DirectIo::Require,
        Direct::Off => DirectIo::Off,
    };
    match args.mode {
        Mode::Scan => {
            let r = scan(vault, args.ring_slots, args.workers, direct_io)?;
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
            let trace = match &args.trace {
                None => None,
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .map_err(|e| smoe::Error::io("cannot read trace", path, &e))?;
                    let rows = parse_trace(&text).map_err(|e| e.context(path.display()))?;
                    Some(trace_tokens(&rows, top_k as usize))
                }
            };
            let opts = DecodeOptions {
                tokens: args.tokens,
                ring_slots: args.ring_slots,
                workers: args.workers,
                direct_io,
                top_k,
                keep: args.keep,
                router_seed: 42,
                speculate: args.speculate,
                payload_seed: args.check_seed,
                trace,
            };
            let r = decode(vault, &opts, &mut |_| {})?;
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
