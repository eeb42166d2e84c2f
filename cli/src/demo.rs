//! `smoe demo`: writes a synthetic vault of about 1 GB, shaped like a
//! scaled-down Qwen3 MoE (24 layers × 64 experts, first layer dense), then
//! decodes synthetic tokens through the streamer with a ring that holds 40% of
//! the experts, checks every streamed byte, and reports what it measured:
//! coverage, bytes read, GB/s and the time each token waited for experts.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use smoe::internals::router::{RouterConfig, SyntheticRouter};
use smoe::vault::synth::SynthSpec;
use smoe::vault::Vault;

use crate::bench::TraceResult;
use crate::flags::{policy_name, PolicyArg};
use crate::output::{gb_per_s, human_bytes, out, warning_line, Failure};
use crate::progress;
use crate::replay::moe_layers;
use crate::stream::{decode, DecodeOptions};
use crate::synth::write_with_progress;

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
    #[arg(long, default_value_t = 1000, hide = true, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub size_mb: u64,
    /// Tokens to decode through the streamer, at least 1.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub tokens: u32,
    /// Eviction policy of the streamer.
    #[arg(long, value_enum, default_value_t = PolicyArg::Lru)]
    pub policy: PolicyArg,
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

    // Start cold: the writer's pages may still be cached.
    if let Ok(f) = std::fs::File::open(&path) {
        let _ = smoe::internals::sys::drop_file_cache(&f);
    }
    let vault = Vault::open(&path)?;
    let ring_slots = (vault.entries().len() as u32 * 2 / 5).max(1);
    let opts = DecodeOptions {
        tokens: args.tokens,
        ring_slots,
        workers: 0,
        direct_io: smoe::DirectIo::Auto,
        top_k: TOP_K,
        keep: 0.45,
        router_seed: 42,
        speculate: true,
        payload_seed: Some(spec.seed),
        trace: None,
        read_all: true,
        policy: args.policy.policy(),
        capture: None,
        elastic: true,
    };
    let bar = progress::count_bar(u64::from(args.tokens), "decode", false);
    // The streamer's warnings go to stderr as they are said, as in every
    // subcommand.
    let report = decode(vault, &opts, &mut warning_line, &mut |_| bar.inc(1));
    bar.finish_and_clear();
    let report = report?;
    let st = &report.stats;
    let (mean, p99) = report.wait_mean_p99();
    out(&format!(
        "stream: {} tokens × {} MoE layers × top-{TOP_K} through a ring of {} slots × {} \
         (40% of the experts), {} workers, {}\n\
         coverage: {:.1}% of claims were hits ({} of {}); keep probability 0.45, Zipf popularity\n\
         read: {} in {:.2} s = {} ({} demand, {} speculative, {} pre-warm reads; {} evictions)\n\
         wait for experts per token: mean {:.2} ms, p99 {:.2} ms\n\
         checked: every streamed byte ({}) against the generator\n",
        report.tokens,
        report.layers,
        st.ring_slots,
        human_bytes(st.slot_bytes),
        st.workers,
        if st.direct_io == 1 {
            "direct I/O"
        } else {
            "buffered I/O"
        },
        100.0 * st.hits as f64 / st.claims.max(1) as f64,
        st.hits,
        st.claims,
        human_bytes(st.bytes_read),
        report.seconds,
        gb_per_s(st.bytes_read, report.seconds),
        st.reads_demand,
        st.reads_speculative,
        st.reads_prewarm,
        st.evictions,
        mean.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        human_bytes(report.bytes_checked),
    ))?;
    out(&format!(
        "{}\n",
        compare_with_mmap(&path, &dir.path, &opts, &report)?
    ))?;
    if args.keep {
        out(&format!("kept {}\n", path.display()))?;
    } else {
        out(&format!("removed {}\n", dir.path.display()))?;
    }
    out("demo OK\n")
}

/// Replays the demo's tokens through `smoe bench --baseline mmap` on the
/// demo vault: each side in a memory cgroup capped a little above the ring
/// when this process may make one, else uncapped and warm; one line saying
/// which.
fn compare_with_mmap(
    vault_path: &Path,
    dir: &Path,
    opts: &DecodeOptions,
    report: &crate::stream::DecodeReport,
) -> Result<String, Failure> {
    let vault = Vault::open(vault_path)?;
    let layers = moe_layers(&vault);
    let mut router = SyntheticRouter::new(RouterConfig {
        layers,
        n_experts: vault.n_experts(),
        top_k: opts.top_k,
        keep: opts.keep,
        zipf: 1.0,
        seed: opts.router_seed,
    })?;
    // The demo's own tokens, as a trace (docs/format.md §5).
    let mut csv = String::from("token,layer");
    for r in 0..opts.top_k {
        csv.push_str(&format!(",r{r}"));
    }
    csv.push('\n');
    for t in 0..report.tokens {
        for (layer, experts) in router.next_token() {
            csv.push_str(&format!("{t},{layer}"));
            for e in experts {
                csv.push_str(&format!(",{e}"));
            }
            csv.push('\n');
        }
    }
    let trace = dir.join("demo-trace.csv");
    std::fs::write(&trace, csv).map_err(|e| smoe::Error::io("cannot write", &trace, &e))?;
    let ring = report.stats.ring_slots;
    let ring_bytes = report.stats.ring_slots * report.stats.slot_bytes;
    // The ring plus 10% headroom and 32 MiB for the rest of the process.
    let cap = (ring_bytes + (32 << 20)) / 9 * 10 + 4096;
    let (isolated, why) = match crate::baseline::find_parent() {
        Ok(p) => (true, p.name().to_string()),
        Err(why) => (false, why),
    };
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Message(format!("cannot find this program: {e}")))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("bench")
        .arg(vault_path)
        .arg("--trace")
        .arg(&trace)
        .args(["--top-k", &opts.top_k.to_string()])
        .args(["--ring-slots", &ring.to_string()])
        .args(["--mem-cap", &cap.to_string()])
        .args(["--baseline", "mmap", "--json"])
        .args(["--policy", policy_name(opts.policy)]);
    if !isolated {
        cmd.arg("--no-isolation");
    }
    if opts.speculate {
        cmd.arg("--speculate");
    }
    let o = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Failure::Message(format!("cannot run the mmap comparison: {e}")))?;
    let _ = std::fs::remove_file(&trace);
    if !o.status.success() {
        return Err(Failure::Message(format!(
            "the mmap comparison failed ({})",
            o.status
        )));
    }
    let result: TraceResult = serde_json::from_slice(&o.stdout)
        .map_err(|e| Failure::Message(format!("the mmap comparison printed no result: {e}")))?;
    let smoe_ms = result.decode.wait_mean_ms;
    let mmap_ms = result
        .baseline
        .map(|b| b.wait_mean_ms)
        .ok_or_else(|| Failure::Message("the mmap comparison printed no baseline".to_owned()))?;
    let how = if isolated {
        format!(
            "each side capped at {} in a memory cgroup ({why}), page cache dropped first",
            human_bytes(cap)
        )
    } else {
        format!("uncapped and warm, as it cannot isolate: {why}")
    };
    Ok(format!(
        "vs mmap: the same {} tokens, every byte of each expert read on both sides: smoe waits {smoe_ms:.2} ms per token, mmap {mmap_ms:.2} ms (smoe/mmap {:.2}; {how})",
        report.tokens,
        smoe_ms / mmap_ms.max(1e-9)
    ))
}
