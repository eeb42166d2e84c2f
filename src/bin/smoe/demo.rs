//! `smoe demo`: writes a synthetic vault of about 1 GB, shaped like a
//! scaled-down Qwen3 MoE (24 layers × 64 experts, first layer dense), reads
//! it back, checks every payload byte and every checksum, and reports what it
//! measured.
//!
//! The read-back is one function, [`read_back`], so that it can be swapped
//! for the streamer (ring + workers) without touching the rest.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use smoe::vault::synth::{first_mismatch, SynthSpec};
use smoe::vault::Vault;

use crate::output::{gb_per_s, human_bytes, out, Failure};
use crate::synth::write_with_progress;
use crate::verify::{blob_problems, pass, PassStats};

/// Layers of the demo vault.
const LAYERS: u32 = 24;
/// Experts per layer of the demo vault.
const EXPERTS: u32 = 64;
/// Active experts per token (Qwen3's top-k).
const TOP_K: u32 = 8;
/// Payload seed.
const SEED: u64 = 0x5eed_0001;

/// Arguments of `smoe demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where to create the demo's temporary directory (default: the system's
    /// temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the vault afterwards instead of deleting it.
    #[arg(long)]
    pub keep: bool,
    /// Target payload size in MB (10^6 bytes); for tests.
    #[arg(long, default_value_t = 1000, hide = true,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub size_mb: u64,
}

/// Removes the demo directory when dropped, unless it is to be kept; so an
/// error halfway still cleans up.
struct TempVaultDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for TempVaultDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A fresh directory under `parent` with a name no other run uses.
fn make_temp_dir(parent: &Path, keep: bool) -> Result<TempVaultDir, Failure> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path = parent.join(format!("smoe-demo-{}-{nanos:09}", std::process::id()));
    std::fs::create_dir(&path)
        .map_err(|e| smoe::Error::io("cannot create directory", &path, &e))?;
    Ok(TempVaultDir { path, keep })
}

/// The demo's shape for a payload of about `target_bytes`: a fixed
/// 24 × 64 layout, blob size chosen to hit the target (the synth generator
/// trims 0..4095 bytes, 2048 on average, off each nominal size).
fn demo_spec(target_bytes: u64) -> SynthSpec {
    let blobs = u64::from((LAYERS - 1) * EXPERTS);
    SynthSpec {
        n_layers: LAYERS,
        n_experts: EXPERTS,
        blob_bytes: (target_bytes / blobs + 2048).max(1),
        dense_layers: vec![0],
        seed: SEED,
        top_k: TOP_K,
    }
}

/// Reads every blob of `vault` back and checks each payload byte against the
/// generator and each checksum and padding byte against the table.
pub fn read_back(vault: &Vault, seed: u64) -> Result<PassStats, Failure> {
    let checksums = vault.header().has_checksums();
    pass(vault, "read", &mut |entry, data| {
        let mut problems = blob_problems(entry, data, checksums);
        if let Some(at) = first_mismatch(
            seed,
            entry.layer,
            entry.expert,
            &data[..entry.size as usize],
        ) {
            problems.push(format!(
                "layer {} expert {}: payload byte at blob offset {at} differs from what was written",
                entry.layer, entry.expert
            ));
        }
        problems
    })
}

/// Runs `smoe demo`.
pub fn run(args: &DemoArgs) -> Result<(), Failure> {
    let spec = demo_spec(args.size_mb * 1_000_000);
    let blobs = (LAYERS - 1) * EXPERTS;
    let parent = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = make_temp_dir(&parent, args.keep)?;
    out(&format!(
        "demo vault: {LAYERS} layers × {EXPERTS} experts (layer 0 dense, like Qwen3's shape scaled down), \
         {blobs} blobs of ~{} each, ~{:.2} GB of payload, top_k {TOP_K}\n\
         writing to {}\n",
        human_bytes(spec.blob_bytes - 2048),
        spec.total_bytes() as f64 / 1e9,
        dir.path.display()
    ))?;

    let (path, write_seconds) = write_with_progress(&spec, &dir.path, "write")?;
    let payload = spec.total_bytes();
    out(&format!(
        "write: {payload} bytes of payload ({}) in {write_seconds:.2} s: {} (synced)\n",
        human_bytes(payload),
        gb_per_s(payload, write_seconds)
    ))?;

    let vault = Vault::open(&path)?;
    let stats = read_back(&vault, spec.seed)?;
    out(&format!(
        "read:  {} bytes ({}) in {:.2} s: {} with {} ({} in reads alone); {} blobs, every payload byte and xxh3 checked\n",
        stats.bytes,
        human_bytes(stats.bytes),
        stats.seconds,
        gb_per_s(stats.bytes, stats.seconds),
        stats.mode.describe(),
        gb_per_s(stats.bytes, stats.read_seconds),
        stats.blobs
    ))?;
    if args.keep {
        out(&format!("kept {}\n", path.display()))?;
    } else {
        out(&format!("removed {}\n", dir.path.display()))?;
    }
    if stats.bad_blobs == 0 {
        out("demo OK\n")
    } else {
        Err(Failure::Message(format!(
            "{} of {} blobs read back wrong",
            stats.bad_blobs, stats.blobs
        )))
    }
}
