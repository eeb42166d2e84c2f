//! `smoe verify`: reads every blob once, in file order, and checks its xxh3
//! (when the vault carries checksums) and that its padding is zero.

use std::path::Path;
use std::time::Instant;

use smoe::vault::{Entry, Vault};
use xxhash_rust::xxh3::xxh3_64;

use crate::output::{error_line, gb_per_s, human_bytes, out, Failure};
use crate::progress::bytes_bar;
use crate::reader::{BlobReader, IoMode};

/// What a pass over every blob measured.
#[derive(Debug)]
pub struct PassStats {
    /// Blobs read.
    pub blobs: usize,
    /// Bytes read (padded sizes).
    pub bytes: u64,
    /// Wall-clock seconds of the whole pass (reads and checks).
    pub seconds: f64,
    /// Seconds spent inside reads only.
    pub read_seconds: f64,
    /// Direct or buffered, as it turned out.
    pub mode: IoMode,
    /// Blobs with at least one problem.
    pub bad_blobs: usize,
}

/// The vault's entries in file order, so the pass reads sequentially.
pub fn in_file_order(vault: &Vault) -> Vec<Entry> {
    let mut entries = vault.entries().to_vec();
    entries.sort_unstable_by_key(|e| e.offset);
    entries
}

/// Problems of one blob whose `padded_size` bytes are `data`: a checksum
/// mismatch (when `checksums`) and the first nonzero padding byte.
pub fn blob_problems(entry: &Entry, data: &[u8], checksums: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let size = entry.size as usize;
    if checksums {
        let actual = xxh3_64(&data[..size]);
        if actual != entry.xxh3 {
            problems.push(format!(
                "layer {} expert {}: xxh3 is {actual:016x}, expected {:016x}",
                entry.layer, entry.expert, entry.xxh3
            ));
        }
    }
    if let Some(i) = data[size..].iter().position(|&b| b != 0) {
        problems.push(format!(
            "layer {} expert {}: padding byte at blob offset {} is nonzero ({:#04x})",
            entry.layer,
            entry.expert,
            size + i,
            data[size + i]
        ));
    }
    problems
}

/// Reads every blob of `vault` with `reader` and hands each to `check`,
/// which returns its problems; each problem is printed on stderr as it is
/// found. An I/O error on one blob is a problem of that blob, not the end of
/// the pass.
pub fn pass(
    vault: &Vault,
    label: &str,
    check: &mut dyn FnMut(&Entry, &[u8]) -> Vec<String>,
) -> Result<PassStats, Failure> {
    let mut reader = BlobReader::open(vault.path(), vault.max_padded_size())?;
    let entries = in_file_order(vault);
    let total: u64 = entries.iter().map(|e| e.padded_size).sum();
    let bar = bytes_bar(total, label);
    let mut stats = PassStats {
        blobs: 0,
        bytes: 0,
        seconds: 0.0,
        read_seconds: 0.0,
        mode: reader.mode(),
        bad_blobs: 0,
    };
    let start = Instant::now();
    for entry in &entries {
        let read_start = Instant::now();
        let problems = match reader.read_blob(entry) {
            Ok(data) => {
                stats.read_seconds += read_start.elapsed().as_secs_f64();
                check(entry, data)
            }
            Err(e) => vec![e.message().to_owned()],
        };
        if !problems.is_empty() {
            stats.bad_blobs += 1;
            let file = vault.path().display().to_string();
            bar.suspend(|| {
                problems
                    .iter()
                    .for_each(|p| error_line(&format!("{file}: {p}")))
            });
        }
        stats.blobs += 1;
        stats.bytes += entry.padded_size;
        bar.inc(entry.padded_size);
    }
    bar.finish_and_clear();
    stats.seconds = start.elapsed().as_secs_f64();
    stats.mode = reader.mode();
    Ok(stats)
}

/// Runs `smoe verify`.
pub fn run(path: &Path) -> Result<(), Failure> {
    let vault = Vault::open(path)?;
    let checksums = vault.header().has_checksums();
    if !checksums {
        out("this vault carries no checksums: checking only that padding bytes are zero\n")?;
    }
    let stats = pass(&vault, "verify", &mut |entry, data| {
        blob_problems(entry, data, checksums)
    })?;
    out(&format!(
        "checked {} blobs, {} bytes ({}) in {:.2} s: {} with {}; {}\n",
        stats.blobs,
        stats.bytes,
        human_bytes(stats.bytes),
        stats.seconds,
        gb_per_s(stats.bytes, stats.seconds),
        stats.mode.describe(),
        if stats.bad_blobs == 0 {
            "every blob is intact".to_owned()
        } else {
            format!("{} of {} blobs bad", stats.bad_blobs, stats.blobs)
        }
    ))?;
    if stats.bad_blobs == 0 {
        Ok(())
    } else {
        // Each bad blob already has its stderr line; the count is on stdout.
        Err(Failure::Reported)
    }
}
