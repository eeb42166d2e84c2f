//! `smoe verify`: reads every blob once, in file order, and checks its xxh3
//! (when the vault carries checksums) and that its padding is zero. Blobs
//! stream through one bounded buffer and the hash is computed as they go, so
//! a blob larger than memory is verified like any other.
//!
//! A model opened in place (SPEC §6) carries no checksums and has no
//! padding of its own: verify loads every expert once through the
//! library's read path ([`ModelReader`], [`smoe::vault::InPlace::load`]),
//! and checks that each load read every window it needed (a failed or
//! short read, or a file changed since open, is an error of that expert)
//! and that every item of its layer's layout lies inside the bytes a claim
//! spans and inside the slot. It writes nothing, beside the model or
//! anywhere else.

use std::path::Path;
use std::time::Instant;

use smoe::internals::model::window::IO_ALIGN;
use smoe::vault::{Entry, Vault};
use smoe_pack::layout::{BlobLayouts, LayoutItem};
use xxhash_rust::xxh3::Xxh3;

use crate::output::{error_line, gb_per_s, human_bytes, out, Failure};
use crate::progress::{bytes_bar, count_bar};
use crate::reader::{BlobReader, IoMode, ModelReader};

/// What `smoe verify` says first about a model: why there is no checksum
/// to check, and where to get one.
pub const NO_CHECKSUMS: &str =
    "no checksums: a GGUF/safetensors model carries none; use `smoe pack` for checksummed blobs";

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
    if vault.model().is_some() {
        // A model has no blobs at aligned offsets: its experts are read
        // only through `InPlace::load` (`run_model`).
        return Err(Failure::Message(format!(
            "{}: a model opened in place has no blobs to read in file order",
            vault.path().display()
        )));
    }
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
    if vault.model().is_some() {
        return run_model(&vault);
    }
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

/// What a pass over every expert of a model measured.
#[derive(Debug)]
struct ModelPass {
    /// Experts loaded.
    experts: usize,
    /// Bytes read from the model's files (whole windows).
    bytes_read: u64,
    /// Payload bytes moved inside the slot after the reads.
    bytes_moved: u64,
    /// Bytes of the items, every expert's (what a host reads).
    payload: u64,
    /// Wall-clock seconds of the pass.
    seconds: f64,
    /// Seconds inside reads only.
    read_seconds: f64,
    mode: IoMode,
    /// Experts with at least one problem.
    bad: usize,
}

/// The problems of one loaded expert whose layer lays out `items`: a slot
/// that is not whole blocks of direct I/O, data that passes the slot, and
/// an item outside the bytes a claim spans.
fn slot_problems(entry: &Entry, items: Option<&[LayoutItem]>, slot_len: usize) -> Vec<String> {
    let mut problems = Vec::new();
    let (l, e) = (entry.layer, entry.expert);
    if entry.padded_size % IO_ALIGN != 0 || slot_len as u64 != entry.padded_size {
        problems.push(format!(
            "layer {l} expert {e}: slot of {} bytes is not a multiple of {IO_ALIGN} (loaded {slot_len})",
            entry.padded_size
        ));
    }
    if entry.size > entry.padded_size {
        problems.push(format!(
            "layer {l} expert {e}: its data spans {} bytes, more than its slot of {}",
            entry.size, entry.padded_size
        ));
    }
    let Some(items) = items else {
        problems.push(format!(
            "layer {l} expert {e}: layer {l} has no entry in layer_blob_layouts"
        ));
        return problems;
    };
    for item in items {
        if item.end() > entry.size || item.end() > entry.padded_size {
            problems.push(format!(
                "layer {l} expert {e}: item {} ({} bytes at {}) ends at {}, past its data ({} bytes) or its slot ({} bytes)",
                item.role,
                item.bytes,
                item.offset,
                item.end(),
                entry.size,
                entry.padded_size
            ));
        }
    }
    problems
}

/// `smoe verify MODEL`: every expert loaded once through the library's
/// read path (module doc); nothing is written.
fn run_model(vault: &Vault) -> Result<(), Failure> {
    let model = vault
        .model()
        .ok_or_else(|| Failure::Message(format!("{}: not a model", vault.path().display())))?;
    // The metadata is the library's own; a layout it cannot read back is
    // an error of the whole run, not of one expert.
    let layouts = BlobLayouts::from_metadata(vault.meta())
        .map_err(|e| e.with_path(vault.path()))?
        .unwrap_or_default();
    let mut reader = ModelReader::open(vault)?
        .ok_or_else(|| Failure::Message(format!("{}: not a model", vault.path().display())))?;
    out(&format!("{NO_CHECKSUMS}\n"))?;
    // In the order of their first window, so the files are read forward.
    let (mut reads, mut moves) = (Vec::new(), Vec::new());
    let mut entries: Vec<(usize, u64, Entry)> = vault
        .entries()
        .iter()
        .map(|e| {
            reads.clear();
            moves.clear();
            model.reads(e.layer, e.expert, &mut reads, &mut moves);
            let first = reads.first().map_or((0, 0), |r| (r.file, r.offset));
            (first.0, first.1, *e)
        })
        .collect();
    entries.sort_unstable_by_key(|&(file, offset, e)| (file, offset, e.layer, e.expert));
    let bar = count_bar(entries.len() as u64, "verify", false);
    let mut pass = ModelPass {
        experts: 0,
        bytes_read: 0,
        bytes_moved: 0,
        payload: 0,
        seconds: 0.0,
        read_seconds: 0.0,
        mode: reader.mode(),
        bad: 0,
    };
    let file = vault.path().display().to_string();
    let start = Instant::now();
    for (_, _, entry) in &entries {
        let items = layouts.layer(entry.layer);
        let problems = match reader.load(entry) {
            Ok((loaded, slot)) => {
                pass.bytes_read += loaded.bytes_read;
                pass.bytes_moved += loaded.bytes_moved;
                slot_problems(entry, items, slot.len())
            }
            Err(e) => vec![format!(
                "layer {} expert {}: {}",
                entry.layer,
                entry.expert,
                e.message()
            )],
        };
        pass.payload += items.map_or(0, |i| i.iter().map(|i| i.bytes).sum());
        if !problems.is_empty() {
            pass.bad += 1;
            bar.suspend(|| {
                problems
                    .iter()
                    .for_each(|p| error_line(&format!("{file}: {p}")))
            });
        }
        pass.experts += 1;
        bar.inc(1);
    }
    bar.finish_and_clear();
    pass.seconds = start.elapsed().as_secs_f64();
    pass.read_seconds = reader.read_seconds();
    let files = vault.data_files().len();
    let layers = layouts.layers.len();
    out(&format!(
        "read {} experts ({layers} layers × {} experts) of {} ({} model, {files} file{}) through the library's read path: \
         {} bytes read ({}), {} bytes moved in the slot, {} bytes of items, in {:.2} s ({:.2} s reading): {} with {}; {}\n",
        pass.experts,
        vault.n_experts(),
        file,
        model.kind().name(),
        if files == 1 { "" } else { "s" },
        pass.bytes_read,
        human_bytes(pass.bytes_read),
        pass.bytes_moved,
        pass.payload,
        pass.seconds,
        pass.read_seconds,
        gb_per_s(pass.bytes_read, pass.seconds),
        pass.mode.describe(),
        if pass.bad == 0 {
            "every read complete, every item inside its slot".to_owned()
        } else {
            format!("{} of {} experts bad", pass.bad, pass.experts)
        }
    ))?;
    if pass.bad == 0 {
        Ok(())
    } else {
        Err(Failure::Reported)
    }
}
