//! `smoe synth`: writes a synthetic vault whose payloads are a pure function
//! of (seed, layer, expert, offset) — see `smoe::vault::synth`.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use smoe::vault::synth::SynthSpec;

use crate::output::{gb_per_s, human_bytes, out, Failure};
use crate::progress::bytes_bar;

/// Arguments of `smoe synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Directory to write experts.smoe into (created if missing).
    pub dir: PathBuf,
    /// Number of layers.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub layers: u32,
    /// Experts per layer.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub experts: u32,
    /// Nominal blob size in KiB (each blob is up to 4095 bytes shorter).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    pub blob_kib: u64,
    /// Dense layers (no experts), comma-separated, e.g. 0,1.
    #[arg(long, value_delimiter = ',')]
    pub dense: Vec<u32>,
    /// Seed of the payload generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Active experts per token per layer, recorded in the metadata.
    #[arg(long, default_value_t = 8)]
    pub top_k: u32,
}

/// Runs `smoe synth`.
pub fn run(args: &SynthArgs) -> Result<(), Failure> {
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
        top_k: args.top_k,
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
pub fn write_with_progress(
    spec: &SynthSpec,
    dir: &std::path::Path,
    label: &str,
) -> Result<(PathBuf, f64), Failure> {
    let bar = bytes_bar(spec.total_bytes(), label);
    let start = Instant::now();
    let result = spec.write(dir, &mut |done| bar.set_position(done));
    bar.finish_and_clear();
    let path = result?;
    Ok((path, start.elapsed().as_secs_f64()))
}
