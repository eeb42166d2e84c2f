//! Synthetic vaults with deterministic payloads, for tests, benchmarks and
//! the demo.
//!
//! Every byte of every blob is a pure function of (seed, layer, expert,
//! offset), so a reader anywhere can check any bytes it was handed without
//! keeping a copy: [`fill_payload`] makes them, [`first_mismatch`] checks them.
//!
//! Public API: `smoe synth` is built on it, and a host can use it the same
//! way, to test its integration on a vault of any shape before it has a
//! converted model, checking every byte a claim hands it.

use std::path::{Path, PathBuf};

use super::format::{DEFAULT_ALIGNMENT, ENTRY_BYTES};
use super::writer::{VaultWriter, WriterOptions};
use crate::error::{Error, Result};
use crate::fs_safe;
use crate::model::{interrupted, Cancel};

/// The shape and content of a synthetic vault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthSpec {
    /// Number of layers.
    pub n_layers: u32,
    /// Experts per layer.
    pub n_experts: u32,
    /// Nominal blob size; each blob is this minus a deterministic 0..4095
    /// bytes (so blobs end short of their padding, as real ones do).
    pub blob_bytes: u64,
    /// Layers with no experts (dense layers, e.g. the first ones).
    pub dense_layers: Vec<u32>,
    /// Seed of the payload generator.
    pub seed: u64,
    /// Active experts per token per layer, recorded in the metadata.
    pub top_k: u32,
}

impl SynthSpec {
    /// Whether `layer` has experts in this vault.
    pub fn has_layer(&self, layer: u32) -> bool {
        layer < self.n_layers && !self.dense_layers.contains(&layer)
    }

    /// Payload bytes of the blob of (layer, expert).
    pub fn blob_size(&self, layer: u32, expert: u32) -> u64 {
        let jitter = splitmix64(self.seed ^ key(layer, expert) ^ 0x5151_5151) % 4096;
        if self.blob_bytes > 8192 {
            self.blob_bytes - jitter
        } else {
            self.blob_bytes.max(1)
        }
    }

    /// The metadata JSON this spec writes.
    pub fn meta_json(&self) -> String {
        format!(
            concat!(
                "{{\"format\":\"smoe-vault\",\"writer\":\"smoe {}\",",
                "\"source\":{{\"kind\":\"synthetic\",\"file\":\"\"}},",
                "\"arch\":\"synthetic-moe\",\"quant\":\"none\",\"top_k\":{},",
                "\"synth\":{{\"seed\":{},\"blob_bytes\":{},\"n_layers\":{},\"n_experts\":{}}}}}"
            ),
            env!("CARGO_PKG_VERSION"),
            self.top_k,
            self.seed,
            self.blob_bytes,
            self.n_layers,
            self.n_experts
        )
    }

    /// The layers that have experts, ascending. Takes O(n_layers × log
    /// dense_layers), however many dense layers are listed.
    pub fn expert_layers(&self) -> impl Iterator<Item = u32> + '_ {
        let mut dense = self.dense_layers.clone();
        dense.sort_unstable();
        (0..self.n_layers).filter(move |l| dense.binary_search(l).is_err())
    }

    /// Total payload bytes the vault will hold (saturating: a shape too big
    /// for a u64 of bytes is too big for any disk).
    pub fn total_bytes(&self) -> u64 {
        self.expert_layers()
            .flat_map(|l| (0..self.n_experts).map(move |e| (l, e)))
            .fold(0u64, |sum, (l, e)| sum.saturating_add(self.blob_size(l, e)))
    }

    /// The most bytes the vault's `experts.smoe` can take: page 0, the
    /// table's region and the metadata, then every blob padded to the page
    /// (a u128: 2^20 blobs of 1 TiB do not fit a u64).
    pub fn file_bytes(&self) -> u128 {
        let a = u64::from(DEFAULT_ALIGNMENT);
        let ids = u64::from(self.n_layers) * u64::from(self.n_experts);
        let head = u128::from(a)
            + u128::from(
                (ids * ENTRY_BYTES as u64 + self.meta_json().len() as u64).next_multiple_of(a),
            );
        head + self
            .expert_layers()
            .map(|l| {
                (0..self.n_experts)
                    .map(|e| u128::from(self.blob_size(l, e).next_multiple_of(a)))
                    .sum::<u128>()
            })
            .sum::<u128>()
    }

    /// Writes the vault into `dir` (created if missing) and returns the path
    /// of its `experts.smoe`. `progress` is called with the payload bytes
    /// written so far after each blob. Payloads are generated as they are
    /// written, so memory does not grow with the blob size. A vault larger
    /// than the free space of `dir`'s filesystem is refused before
    /// anything is created. The file is written under a temporary name and
    /// renamed into place at the end; on an error, what was written and
    /// the directories made for it are removed (an `experts.smoe` already
    /// there stays as it was).
    pub fn write(&self, dir: impl AsRef<Path>, progress: &mut dyn FnMut(u64)) -> Result<PathBuf> {
        self.write_cancellable(dir, progress, &|| false)
    }

    /// [`write`](SynthSpec::write), asking `cancel` before each blob and
    /// every 64 KiB of one: once it answers true, the write stops, removes
    /// what it made and returns an I/O error saying it was interrupted.
    pub fn write_cancellable(
        &self,
        dir: impl AsRef<Path>,
        progress: &mut dyn FnMut(u64),
        cancel: Cancel<'_>,
    ) -> Result<PathBuf> {
        let dir = dir.as_ref();
        if self.expert_layers().next().is_none() {
            return Err(Error::argument(
                "every layer is dense: a vault needs at least one layer with experts",
            ));
        }
        fs_safe::check_free_space(dir, self.file_bytes())?;
        // The directories this write makes, innermost first: removed again
        // if it fails (each only while empty).
        let made: Vec<&Path> = dir
            .ancestors()
            .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
            .collect();
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create directory", dir, &e))?;
        let written = self.write_into(dir, progress, cancel);
        if written.is_err() {
            for d in &made {
                let _ = std::fs::remove_dir(d);
            }
        }
        written.map_err(|e| if cancel() { interrupted() } else { e })
    }

    fn write_into(
        &self,
        dir: &Path,
        progress: &mut dyn FnMut(u64),
        cancel: Cancel<'_>,
    ) -> Result<PathBuf> {
        let opts = WriterOptions {
            meta: Some(self.meta_json()),
            ..WriterOptions::default()
        };
        let mut w = VaultWriter::create(dir, self.n_layers, self.n_experts, opts)?;
        let mut done = 0u64;
        for layer in self.expert_layers() {
            for expert in 0..self.n_experts {
                if cancel() {
                    return Err(interrupted());
                }
                let size = self.blob_size(layer, expert);
                let mut payload = Payload {
                    stream: stream(self.seed, layer, expert),
                    at: 0,
                    cancel,
                };
                w.add_blob_from(layer, expert, size, &mut payload)?;
                done += size;
                progress(done);
            }
        }
        w.finish()
    }
}

fn key(layer: u32, expert: u32) -> u64 {
    (u64::from(layer) << 32) | u64::from(expert)
}

/// SplitMix64's output function: a fast, well-mixed bijection on u64.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 8 payload bytes at blob offset `8 × word` of (layer, expert).
fn word_at(stream: u64, word: u64) -> [u8; 8] {
    splitmix64(stream ^ word.wrapping_mul(0xd6e8_feb8_6659_fd93)).to_le_bytes()
}

fn stream(seed: u64, layer: u32, expert: u32) -> u64 {
    splitmix64(seed ^ splitmix64(key(layer, expert)))
}

/// The payload of one blob as an endless reader, from blob offset 0, that
/// fails once `cancel` answers true (asked at every read: the writer reads
/// 64 KiB at a time, and a blob may be gigabytes).
struct Payload<'a> {
    stream: u64,
    at: u64,
    cancel: Cancel<'a>,
}

impl std::io::Read for Payload<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if (self.cancel)() {
            return Err(std::io::Error::other("interrupted"));
        }
        let mut done = 0;
        if self.at % 8 == 0 {
            // Whole words, as `fill_payload` writes them.
            for c in buf.chunks_exact_mut(8) {
                c.copy_from_slice(&word_at(self.stream, self.at / 8));
                self.at += 8;
            }
            done = buf.len() / 8 * 8;
        }
        while done < buf.len() {
            let word = word_at(self.stream, self.at / 8);
            let skip = (self.at % 8) as usize;
            let n = (8 - skip).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&word[skip..skip + n]);
            done += n;
            self.at += n as u64;
        }
        Ok(done)
    }
}

/// Fills `buf` with the first `buf.len()` payload bytes of (layer, expert).
pub fn fill_payload(seed: u64, layer: u32, expert: u32, buf: &mut [u8]) {
    let s = stream(seed, layer, expert);
    let mut chunks = buf.chunks_exact_mut(8);
    let mut w = 0u64;
    for c in &mut chunks {
        c.copy_from_slice(&word_at(s, w));
        w += 1;
    }
    let tail = chunks.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&word_at(s, w)[..n]);
}

/// Checks `data` against the payload of (layer, expert) from blob offset 0.
/// Returns the offset of the first wrong byte, or None when all are right.
pub fn first_mismatch(seed: u64, layer: u32, expert: u32, data: &[u8]) -> Option<usize> {
    let s = stream(seed, layer, expert);
    let mut chunks = data.chunks_exact(8);
    let mut w = 0u64;
    for c in &mut chunks {
        let want = word_at(s, w);
        if c != want {
            let i = c.iter().zip(want).position(|(a, b)| *a != b).unwrap_or(0);
            return Some(w as usize * 8 + i);
        }
        w += 1;
    }
    let tail = chunks.remainder();
    let want = word_at(s, w);
    tail.iter()
        .zip(want)
        .position(|(a, b)| *a != b)
        .map(|i| w as usize * 8 + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_payload_matches_fill_payload_at_any_split() {
        use std::io::Read;
        let mut want = vec![0u8; 1001];
        fill_payload(9, 4, 5, &mut want);
        for split in [1, 3, 8, 13, 64, 1000] {
            let mut r = Payload {
                stream: stream(9, 4, 5),
                at: 0,
                cancel: &|| false,
            };
            let mut got = vec![0u8; 1001];
            for piece in got.chunks_mut(split) {
                r.read_exact(piece).unwrap();
            }
            assert_eq!(got, want, "split {split}");
        }
    }

    fn spec(blob_bytes: u64) -> SynthSpec {
        SynthSpec {
            n_layers: 2,
            n_experts: 4,
            blob_bytes,
            dense_layers: vec![],
            seed: 1,
            top_k: 2,
        }
    }

    /// Everything under `dir`, sorted.
    fn listing(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    todo.push(path.clone());
                }
                found.push(path);
            }
        }
        found.sort();
        found
    }

    #[test]
    fn a_cancelled_write_leaves_what_was_there_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let kept = root.path().join("kept");
        std::fs::create_dir(&kept).unwrap();
        std::fs::write(kept.join("notes.txt"), "the user's").unwrap();
        let before = listing(root.path());
        // Cancelled in the middle of the third blob (64 KiB a read), and
        // before the first.
        for after in [40, 0] {
            for dir in [root.path().join("new/vault"), kept.clone()] {
                let asked = std::cell::Cell::new(0);
                let cancel = || {
                    asked.set(asked.get() + 1);
                    asked.get() > after
                };
                let err = spec(1 << 20)
                    .write_cancellable(&dir, &mut |_| {}, &cancel)
                    .unwrap_err();
                assert_eq!(err.message(), interrupted().message());
                assert_eq!(listing(root.path()), before, "{}", dir.display());
            }
        }
        // Not cancelled: the vault, in the directories it made.
        let dir = root.path().join("new/vault");
        let path = spec(1 << 20).write(&dir, &mut |_| {}).unwrap();
        assert_eq!(path, dir.join("experts.smoe"));
    }

    #[test]
    fn a_vault_larger_than_the_disk_is_refused_before_anything_is_made() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("new/vault");
        let huge = SynthSpec {
            n_layers: 4,
            n_experts: 1024,
            blob_bytes: 1 << 50,
            ..spec(0)
        };
        assert!(huge.file_bytes() > 4 << 60);
        let err = huge.write(&dir, &mut |_| {}).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Io);
        assert_eq!(err.path(), Some(dir.as_path()));
        assert!(
            err.message().contains(": the vault needs ")
                && err.message().contains(" but its filesystem has "),
            "{}",
            err.message()
        );
        assert!(listing(root.path()).is_empty());
    }

    #[test]
    fn file_bytes_is_the_file_s_size_at_most() {
        let root = tempfile::tempdir().unwrap();
        let spec = spec(100_000);
        let path = spec.write(root.path(), &mut |_| {}).unwrap();
        let size = std::fs::metadata(path).unwrap().len();
        assert!(u128::from(size) <= spec.file_bytes());
        assert!(spec.file_bytes() - u128::from(size) < 16384);
    }

    #[test]
    fn payload_is_deterministic_and_distinct_per_expert() {
        let mut a = vec![0u8; 1001];
        let mut b = vec![0u8; 1001];
        fill_payload(7, 1, 2, &mut a);
        fill_payload(7, 1, 2, &mut b);
        assert_eq!(a, b);
        assert_eq!(first_mismatch(7, 1, 2, &a), None);
        fill_payload(7, 1, 3, &mut b);
        assert_ne!(a, b);
        assert!(first_mismatch(7, 1, 3, &a).is_some());
        a[999] ^= 1;
        assert_eq!(first_mismatch(7, 1, 2, &a), Some(999));
    }
}
