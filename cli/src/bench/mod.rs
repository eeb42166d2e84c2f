//! `smoe bench VAULT`: streams an existing vault, or a model opened in
//! place, through the library and prints what it measured, as text or one
//! JSON object (`--json`), for the scripts under `scripts/`.
//!
//! - `args`: the command line;
//! - `check`: the checks of the command line, and the top-k to use;
//! - `report`: the typed results, their JSON and their text;
//! - `trace`: `--trace` (the sweep, the replay and its comparison);
//! - this file: the scan and the synthetic decode.

mod args;
mod check;
mod report;
mod trace;

pub use args::BenchArgs;
pub use report::TraceResult;

use smoe::internals::trace::read_trace_file;
use smoe::vault::Vault;

use self::args::Mode;
use self::check::{check_against, check_flags, check_outputs, check_ring_slots, top_k_for_trace};
use self::report::{DecodeResult, RunMode, ScanResult, SmoeSide, TopK};
use crate::output::{out, warning_line, Failure};
use crate::plot::PlotTarget;
use crate::progress::{self, Unit};
use crate::replay::{moe_layers, WorkingSet};
use crate::stream::{decode, scan};

/// Prints `value` as one JSON object, or `text`.
fn print(
    json: bool,
    value: &impl serde::Serialize,
    text: impl FnOnce() -> String,
) -> Result<(), Failure> {
    if json {
        let line = serde_json::to_string(value)
            .map_err(|e| Failure::Message(format!("cannot encode the result as JSON: {e}")))?;
        out(&(line + "\n"))
    } else {
        out(&text())
    }
}

/// Runs `smoe bench`.
pub fn run(args: &BenchArgs) -> Result<(), Failure> {
    check_flags(args)?;
    if let Some(dir) = &args.cgroup {
        // A side of a capped run: into the cap before anything is read.
        crate::baseline::enter(dir)?;
    }
    let vault = Vault::open(&args.vault)?;
    if vault.model().is_some() && args.check_seed.is_some() {
        return Err(Failure::Usage(format!(
            "--check-seed checks the bytes of a synthetic vault; {} is a model opened in place",
            args.vault.display()
        )));
    }
    let top_k = check_against(args, &vault)?;
    check_outputs(args, &vault)?;
    // The plot's file is judged now, before the run: a file that is not a
    // plot smoe wrote is refused before any work is done.
    let plot = match &args.plot {
        Some(given) => Some(PlotTarget::judge(given, vault.path())?),
        None => None,
    };
    match (args.mode, &args.trace) {
        (Mode::Scan, _) => {
            check_ring_slots(args, &vault, top_k)?;
            run_scan(args, vault)
        }
        (Mode::Decode, Some(path)) => {
            let max_tokens = args.max_tokens.map(|n| n as usize);
            let tokens = read_trace_file(path, top_k.value as usize, max_tokens)?;
            let top_k = top_k_for_trace(args, top_k, path, &tokens)?;
            check_ring_slots(args, &vault, top_k)?;
            trace::run_trace(args, vault, top_k, tokens, plot.as_ref())
        }
        (Mode::Decode, None) => {
            check_ring_slots(args, &vault, top_k)?;
            run_decode(args, vault, top_k)
        }
    }
}

/// `--mode scan`: every blob once, in file order.
fn run_scan(args: &BenchArgs, vault: Vault) -> Result<(), Failure> {
    let total: u64 = vault.entries().iter().map(|e| e.size).sum();
    let bar = progress::bar(total, "scan", Unit::Bytes, args.json);
    let r = scan(
        vault,
        args.ring_slots,
        args.workers,
        args.direct.direct_io(),
        &mut warning_line,
        &mut |n| bar.inc(n),
    );
    bar.finish_and_clear();
    let r = r?;
    let result = ScanResult {
        mode: RunMode::Scan,
        experts: r.stats.claims,
        bytes_read: r.bytes_read,
        bytes_moved: r.stats.bytes_moved,
        seconds: r.seconds,
        gb_per_s: r.bytes_read as f64 / r.seconds.max(1e-9) / 1e9,
        workers: r.stats.workers,
        ring_slots: r.stats.ring_slots,
        slot_bytes: r.stats.slot_bytes,
        direct_io: r.stats.direct_io,
    };
    print(args.json, &result, || result.text())
}

/// A synthetic decode: `--tokens` tokens of the synthetic router.
fn run_decode(args: &BenchArgs, vault: Vault, top_k: TopK) -> Result<(), Failure> {
    let experts = vault.entries().len() as u64;
    let working_set = WorkingSet {
        layers: moe_layers(&vault).len() as u32,
        top_k: top_k.value,
    };
    let opts = args.decode_options(args.tokens, args.ring_slots, top_k.value, None, true);
    let bar = progress::count_bar(u64::from(args.tokens), "decode", args.json);
    let r = decode(vault, &opts, &mut warning_line, &mut |_| bar.inc(1));
    bar.finish_and_clear();
    let r = r?;
    let result = DecodeResult::of_side(
        &SmoeSide::of_decode(&r),
        experts,
        args.policy.name(),
        top_k,
        working_set,
    );
    print(args.json, &result, || result.text())
}
