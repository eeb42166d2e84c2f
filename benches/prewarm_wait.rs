//! Does pre-warm delay demand? (run: `cargo bench --bench prewarm_wait`)
//!
//! A vault of 4 layers × 64 experts of ~1 MiB. Layers 0–2 have claim history,
//! so the pre-warm thread has 192 experts to warm (about 1 s of work at its
//! 4 ms pace); layer 3 has none. With pre-warm running, and then with it
//! paused from the start, the engine demand-claims layer-3 experts one at a
//! time (each a cold direct read) and we record how long each claim waits.
//! The claim: the median wait with pre-warm running is within one in-flight
//! read (the paused median) of the wait with it paused.

use std::time::{Duration, Instant};

use smoe::vault::synth::SynthSpec;
use smoe::{Config, Streamer};

const WAIT: Duration = Duration::from_secs(30);

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn drop_cache(vault: &std::path::Path) {
    if let Ok(f) = std::fs::File::open(vault.join("experts.smoe")) {
        let _ = smoe::internals::sys::drop_file_cache(&f);
    }
}

/// Demand-claims 48 layer-3 experts, one at a time; returns each wait.
fn demand_waits(dir: &std::path::Path, paused: bool) -> (Vec<Duration>, u64) {
    drop_cache(dir);
    let s = Streamer::open(
        dir,
        Config {
            ring_slots: 256,
            prewarm_slots: 192,
            ..Config::default()
        },
    )
    .unwrap();
    if paused {
        s.prewarm_pause(true);
    }
    let mut waits = Vec::new();
    for e in 0..48 {
        let t = Instant::now();
        let c = s.claim_wait(3, e, WAIT).unwrap().expect("read within 30 s");
        waits.push(t.elapsed());
        drop(c);
        std::thread::sleep(Duration::from_millis(5));
    }
    (waits, s.stats().reads_prewarm)
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    SynthSpec {
        n_layers: 4,
        n_experts: 64,
        blob_bytes: 1 << 20,
        dense_layers: vec![],
        seed: 3,
        top_k: 8,
    }
    .write(dir.path(), &mut |_| {})
    .unwrap();
    {
        // History: layers 0–2 claimed, so they are the pre-warm targets.
        let s = Streamer::open(
            dir.path(),
            Config {
                prewarm: false,
                ..Config::default()
            },
        )
        .unwrap();
        for l in 0..3 {
            for e in 0..64 {
                drop(s.claim_wait(l, e, WAIT).unwrap().unwrap());
            }
        }
    }
    let mut running = Vec::new();
    let mut paused = Vec::new();
    let mut prewarm_reads = 0;
    for _ in 0..3 {
        let (w, r) = demand_waits(dir.path(), false);
        running.extend(w);
        prewarm_reads += r;
        paused.extend(demand_waits(dir.path(), true).0);
    }
    let (mr, mp) = (median(running), median(paused));
    println!("demand claim wait, median of 144 cold claims each:");
    println!("  pre-warm running: {mr:?} ({prewarm_reads} pre-warm reads during the runs)");
    println!("  pre-warm paused:  {mp:?} (= one in-flight read)");
    println!(
        "  difference: {:?} = {:.2} in-flight reads (the claim: at most 1)",
        mr.saturating_sub(mp),
        mr.saturating_sub(mp).as_secs_f64() / mp.as_secs_f64()
    );
}
