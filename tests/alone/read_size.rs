//! Does reading a run of consecutive experts of one stacked tensor in one
//! request read faster than one request per expert (issue 34 point 2)?
//! Cold direct-I/O reads of a whole file with 16 threads, in requests of
//! one expert's slice (835,584 bytes: a Q8_0 768 × 1024 slice, the 3.9 GB
//! test model's) against runs of 4 and 16 such slices, alternating,
//! the file's cached pages dropped before each pass. A measurement, not a
//! check: `#[ignore]`d, run by name on a quiet machine:
//!
//! `SMOE_READ_SIZE_FILE=/path/to/big.gguf cargo test --release --test alone -- --ignored read_size --nocapture`

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use smoe::internals::sys::{drop_file_cache, open_for_streaming, read_at_exact, AlignedBuffer};
use smoe::DirectIo;

const SLICE: u64 = 835_584;
const THREADS: u64 = 16;

fn pass(path: &std::path::Path, request: u64) -> f64 {
    let probe = std::fs::File::open(path).unwrap();
    let len = probe.metadata().unwrap().len() / request * request;
    drop_file_cache(&probe).unwrap();
    let next = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let f = open_for_streaming(path, DirectIo::Require).unwrap().file;
                let mut buf = AlignedBuffer::zeroed(request as usize, 4096).unwrap();
                loop {
                    let at = next.fetch_add(request, Ordering::Relaxed);
                    if at >= len {
                        return;
                    }
                    read_at_exact(&f, buf.as_mut_slice(), at).unwrap();
                }
            });
        }
    });
    len as f64 / start.elapsed().as_secs_f64() / 1e9
}

#[test]
#[ignore = "a measurement: run by name with SMOE_READ_SIZE_FILE set, on a quiet machine"]
fn read_size() {
    let _alone = crate::alone();
    let Some(path) = std::env::var_os("SMOE_READ_SIZE_FILE") else {
        panic!("set SMOE_READ_SIZE_FILE to a large file (a few GB) on the drive to measure");
    };
    let path = std::path::PathBuf::from(path);
    let sizes = [SLICE.next_multiple_of(4096), 4 * SLICE, 16 * SLICE];
    let mut results = vec![Vec::new(); sizes.len()];
    for _round in 0..3 {
        for (i, &size) in sizes.iter().enumerate() {
            results[i].push(pass(&path, size));
        }
    }
    for (size, r) in sizes.iter().zip(&results) {
        let mut r = r.clone();
        r.sort_by(f64::total_cmp);
        eprintln!(
            "requests of {size} bytes ({:.1} slices), {THREADS} threads, direct I/O: median {:.2} GB/s (min {:.2}, max {:.2})",
            *size as f64 / SLICE as f64,
            r[1],
            r[0],
            r[2]
        );
    }
}
