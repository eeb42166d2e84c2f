//! `smoe verify`: reads every blob once, in file order, and checks its xxh3
//! (when the vault carries checksums) and that its padding is zero. Blobs
//! stream through one bounded buffer and the hash is computed as they go, so
//! a blob larger than memory is verified like any other.

use std::path::Path;
use std::time::Instant;

use smoe::vault::{Entry, Vault};
use xxhash_rust::xxh3::Xxh3;

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

/// The checks of one blob, fed its bytes in order, piece by piece: the xxh3
/// of the payload (streamed, so no blob-sized buffer) and the first nonzero
/// padding byte.
pub struct BlobCheck<'a> {
    entry: &'a Entry,
    hasher: Option<Xxh3>,
    /// Blob offset and value of the first nonzero padding byte.
    bad_padding: Option<(u64, u8)>,
}

impl<'a> BlobCheck<'a> {
    /// Checks for `entry`; the payload is hashed only when `checksums`.
    pub fn new(entry: &'a Entry, checksums: bool) -> Self {
        BlobCheck {
            entry,
            hasher: checksums.then(Xxh3::new),
            bad_padding: None,
        }
    }

    /// The blob's bytes from blob offset `at`, following those fed before.
    pub fn update(&mut self, at: u64, data: &[u8]) {
        let size = self.entry.size;
        // Bytes of `data` that are payload: those before blob offset `size`.
        let payload = size.saturating_sub(at).min(data.len() as u64) as usize;
        if let Some(h) = &mut self.hasher {
            h.update(&data[..payload]);
        }
        if self.bad_padding.is_none() {
            if let Some(i) = data[payload..].iter().position(|&b| b != 0) {
                self.bad_padding = Some((at + (payload + i) as u64, data[payload + i]));
            }
        }
    }

    /// The problems found: a checksum mismatch and the first nonzero padding
    /// byte, each naming the blob.
    pub fn finish(self) -> Vec<String> {
        let e = self.entry;
        let mut problems = Vec::new();
        if let Some(h) = self.hasher {
            let actual = h.digest();
            if actual != e.xxh3 {
                problems.push(format!(
                    "layer {} expert {}: xxh3 is {actual:016x}, expected {:016x}",
                    e.layer, e.expert, e.xxh3
                ));
            }
        }
        if let Some((at, byte)) = self.bad_padding {
            problems.push(format!(
                "layer {} expert {}: padding byte at blob offset {at} is nonzero ({byte:#04x})",
                e.layer, e.expert
            ));
        }
        problems
    }
}

/// Reads every blob of `vault` once, in file order, and checks it; each
/// problem is printed on stderr as it is found. An I/O error on one blob is
/// a problem of that blob, not the end of the pass. Memory stays at one read
/// chunk whatever the blobs' sizes.
pub fn pass(vault: &Vault, label: &str, checksums: bool) -> Result<PassStats, Failure> {
    let mut reader = BlobReader::open(vault.path())?;
    let entries = in_file_order(vault);
    // Blobs do not overlap and end inside the file, so this cannot overflow.
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
        let mut check = BlobCheck::new(entry, checksums);
        let read = reader.read_blob(entry, &mut |at, data| {
            check.update(at, data);
            bar.inc(data.len() as u64);
        });
        let problems = match read {
            Ok(()) => check.finish(),
            Err(e) => vec![e.message()],
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
    }
    bar.finish_and_clear();
    stats.seconds = start.elapsed().as_secs_f64();
    stats.read_seconds = reader.read_seconds();
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
    let stats = pass(&vault, "verify", checksums)?;
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
