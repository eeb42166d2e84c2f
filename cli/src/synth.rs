//! `smoe synth`: writes a synthetic vault whose payloads are a pure function
//! of (seed, layer, expert, offset) — see `smoe::vault::synth`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use smoe::vault::synth::SynthSpec;
use smoe::vault::MAX_EXPERT_IDS;

use crate::flags;
use crate::output::{gb_per_s, human_bytes, out, Failure};
use crate::progress::bytes_bar;

/// `--top-k` when not given (Qwen3's), lowered to `--experts` when fewer.
const DEFAULT_TOP_K: u32 = 8;

/// Arguments of `smoe synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Directory to write experts.smoe into (created if missing).
    pub dir: PathBuf,
    /// Number of layers; layers × experts is at most 1048576.
    #[arg(long, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..=MAX_EXPERT_IDS as i64))]
    pub layers: u32,
    /// Experts per layer; layers × experts is at most 1048576.
    #[arg(long, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..=MAX_EXPERT_IDS as i64))]
    pub experts: u32,
    /// Nominal blob size in KiB, or a size with a unit that is a whole
    /// number of KiB (4M); 1 KiB to 1 TiB. Each blob is up to 4095 bytes
    /// shorter.
    #[arg(long, value_name = "KIB", allow_negative_numbers = true,
          value_parser = flags::kibibytes)]
    pub blob_kib: u64,
    /// Dense layers (no experts), comma-separated, e.g. 0,1; each below --layers.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32))]
    pub dense: Vec<u32>,
    /// Seed of the payload generator.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true,
          value_parser = flags::whole_u64)]
    pub seed: u64,
    /// Active experts per token per layer, recorded in the metadata (where
    /// `smoe bench` takes its top-k from),
    /// from 1 to --experts [default: 8, or --experts when fewer].
    #[arg(long, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub top_k: Option<u32>,
}

/// Runs `smoe synth`.
pub fn run(args: &SynthArgs) -> Result<(), Failure> {
    let ids = u64::from(args.layers) * u64::from(args.experts);
    if ids > MAX_EXPERT_IDS {
        return Err(Failure::Usage(format!(
            "--layers {} × --experts {} is {ids} expert ids, expected at most {MAX_EXPERT_IDS} (a reader's limit)",
            args.layers, args.experts
        )));
    }
    let top_k = match args.top_k {
        None => DEFAULT_TOP_K.min(args.experts),
        Some(k) if k <= args.experts => k,
        Some(k) => {
            return Err(Failure::Usage(format!(
                "--top-k {k} is outside 1..={} (--experts {})",
                args.experts, args.experts
            )))
        }
    };
    if let Some(bad) = args.dense.iter().find(|&&l| l >= args.layers) {
        return Err(Failure::Usage(format!(
            "--dense layer {bad} is outside 0..{} (--layers {})",
            args.layers, args.layers
        )));
    }
    let spec = SynthSpec {
        n_layers: args.layers,
        n_experts: args.experts,
        blob_bytes: args.blob_kib * 1024,
        dense_layers: args.dense.clone(),
        seed: args.seed,
        top_k,
    };
    let (path, seconds) = write_with_progress(&spec, &args.dir, "write")?;
    let file_bytes = std::fs::metadata(&path)
        .map_err(|e| smoe::Error::io("cannot stat", &path, &e))?
        .len();
    let payload = spec.total_bytes();
    out(&format!(
        "wrote {}: {} bytes ({}), {} bytes of payload, in {:.2} s ({})\n",
        path.display(),
        file_bytes,
        human_bytes(file_bytes),
        payload,
        seconds,
        gb_per_s(payload, seconds)
    ))
}

/// Writes `spec` into `dir` with a progress bar on a terminal; returns the
/// path of `experts.smoe` and the seconds it took (including the final sync).
/// A vault larger than the free space is refused before a byte is written
/// (`SynthSpec::write`).
pub fn write_with_progress(
    spec: &SynthSpec,
    dir: &Path,
    label: &str,
) -> Result<(PathBuf, f64), Failure> {
    let bar = bytes_bar(spec.total_bytes(), label);
    let start = Instant::now();
    let result = spec.write(dir, &mut |done| bar.set_position(done));
    bar.finish_and_clear();
    let path = result?;
    Ok((path, start.elapsed().as_secs_f64()))
}
