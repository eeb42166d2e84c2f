//! A model of many shards costs one descriptor per shard, whatever the
//! number of I/O workers (a review found 16 workers × 120 shards hitting
//! the usual limit of 1024 descriptors: Qwen3-235B has 118 shards,
//! DeepSeek-V3 163).
//!
//! In the `alone` binary: it counts the process's open descriptors.

use std::path::Path;

use smoe::{Config, Streamer};

const SHARDS: u32 = 120;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A safetensors checkpoint of `SHARDS` shards, one expert tensor each
/// (layer 0: 40 experts × gate, up, down), with its index.
fn write_sharded(dir: &Path) {
    let mut map = Vec::new();
    for i in 0..SHARDS {
        let (expert, proj) = (
            i / 3,
            ["gate_proj", "up_proj", "down_proj"][(i % 3) as usize],
        );
        let name = format!("model.layers.0.mlp.experts.{expert}.{proj}.weight");
        let file = format!("model-{:05}-of-{SHARDS:05}.safetensors", i + 1);
        let header =
            format!(r#"{{"{name}":{{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}}}}"#);
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend((0..64u8).map(|b| b.wrapping_add(i as u8)));
        std::fs::write(dir.join(&file), bytes).unwrap();
        map.push(format!(r#""{name}":"{file}""#));
    }
    let index = format!(r#"{{"metadata":{{}},"weight_map":{{{}}}}}"#, map.join(","));
    std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
}

#[test]
fn a_model_of_many_shards_takes_one_descriptor_a_shard() {
    let _alone = crate::alone();
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path());
    let before = open_fds();
    let s = Streamer::open(
        dir.path(),
        Config {
            workers: 16,
            ring_slots: 4,
            prewarm: false,
            freq_path: Some("".into()),
            ..Config::default()
        },
    )
    .unwrap();
    let during = open_fds();
    assert_eq!(s.vault().data_files().len(), SHARDS as usize);
    // The shards, and a few of the streamer's own (none per worker).
    assert!(
        during - before <= SHARDS as usize + 8,
        "{} descriptors opened for {SHARDS} shards and 16 workers",
        during - before
    );
    let c = s
        .claim_wait(0, 39, std::time::Duration::from_secs(10))
        .unwrap()
        .unwrap();
    assert_eq!(
        c.len(),
        3 * 64 + 2 * 4032 /* each slice in its own block */
    );
    drop(c);
    drop(s);
    assert_eq!(
        open_fds(),
        before,
        "every descriptor is closed with the streamer"
    );
}
