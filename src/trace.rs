//! Trace capture (`trace_path`): every OK claim recorded, written at close
//! as a routing trace (docs/format.md §5.3).
//!
//! This module owns:
//! - [`TraceRecorder`]: a fixed-capacity, append-only array of claim events
//!   (dense ids) and its write index, allocated once at open;
//! - the conversion of those events into trace rows ([`for_each_row`]) and
//!   text ([`write_trace`]): a new row when the layer changes, a new token when
//!   it goes down;
//! - where the file goes: a relative `trace_path` is resolved against the
//!   working directory at open, so a host's later `chdir` does not move it;
//! - the rule for which file it may replace: a missing file, or a regular
//!   file whose first line is a trace header. Anything else (another file, a
//!   device, FIFO, socket or directory, the vault file or a link to it, the
//!   histogram's file) turns capture off with a warning at open, and is
//!   checked again just before the rename at close. The judging, the atomic
//!   save and the cleanup of killed writers' temporary files are
//!   [`crate::popularity`]'s, shared.
//!
//! What it must never do:
//! - allocate, lock or wait on the claim path: [`TraceRecorder::record`] is
//!   one `Relaxed` `fetch_add` on the write index and one `Relaxed` store
//!   into the slot it got; when the array is full the claim is only counted
//!   (`trace_dropped`);
//! - fail `smoe_open` or `smoe_close`: an unusable path is a warning, a
//!   failed write at close is dropped like the histogram's.
//!
//! Why a fixed array and not a background flush: a writer thread draining a
//! ring would need per-slot publication and a policy for a slow disk (block
//! the claim, or drop anyway), in exchange for unlimited length. The array
//! is allocated zeroed (`calloc`, so the OS commits its pages only as claims
//! reach them): a trace costs 4 bytes per claim recorded, and the capacity,
//! [`DEFAULT_TRACE_CAPACITY`] claims, is reserved address space, not memory.

use std::alloc::Layout;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::error::{Error, ErrorKind, Result};
use crate::popularity::{
    examine_file, file_id, judge_target, remove_leftover_temp_files, save_checked, vault_file_key,
    FileId, Found, Target,
};
use crate::vault::Vault;

/// Claims a trace records before it stops recording (and only counts them):
/// 2^24, 64 MiB of address space, committed 4 bytes per claim as used. That
/// is 262,144 tokens of a 32-layer top-2 model, 22,310 of a 94-layer top-8
/// one.
pub const DEFAULT_TRACE_CAPACITY: usize = 1 << 24;

/// Bytes of an existing file read to judge its first line: a header of
/// more ranks than this shows is judged on the part it shows.
const HEAD_BYTES: usize = 1 << 16;

/// The claims of a session, in the order they took a slot of `events`.
pub(crate) struct TraceRecorder {
    /// Dense ids of OK claims. Entry `i` is written once, by the claim that
    /// got `i` from `next`, and read only at close, when no claim runs.
    events: Box<[AtomicU32]>,
    /// Claims recorded or dropped so far: the next free entry while below
    /// `events.len()`. On its own cache line: every traced claim adds to it.
    next: CachePadded<AtomicUsize>,
    n_experts: u32,
    /// The file written at close (a symbolic link at the configured path
    /// followed) and the identity of the file found there, if any.
    path: PathBuf,
    seen: Option<FileId>,
    /// What must never be replaced besides non-traces.
    vault_file: Option<(PathBuf, FileId)>,
    histogram_path: Option<PathBuf>,
}

impl TraceRecorder {
    /// A recorder for `trace_path` (`None` or empty: capture off, no
    /// warning), or `None` with a warning naming the path and why capture
    /// is off. `histogram_path` is the histogram's file, never taken.
    pub(crate) fn open(
        vault: &Vault,
        trace_path: Option<&Path>,
        histogram_path: Option<&Path>,
        capacity: usize,
    ) -> (Option<TraceRecorder>, Option<String>) {
        let Some(given) = trace_path.filter(|p| !p.as_os_str().is_empty()) else {
            return (None, None);
        };
        // A relative path is taken from the working directory now, at open:
        // a host may change directory before close.
        let requested = match std::path::absolute(given) {
            Ok(path) => path,
            Err(e) => {
                return (
                    None,
                    Some(format!(
                        "{}: a relative path needs the working directory, which cannot be \
                         read ({e}); no trace is recorded",
                        given.display()
                    )),
                )
            }
        };
        let requested = requested.as_path();
        let off = |what: &str| {
            Some(format!(
                "{}: {what}; the library replaces only a routing trace (first line \
                 \"token,layer,r0...\") or a missing file, so no trace is recorded",
                requested.display()
            ))
        };
        let vault_file = vault_file_key(vault.path());
        let histogram_path = histogram_path.map(Path::to_path_buf);
        if histogram_path
            .as_deref()
            .is_some_and(|h| same_file(h, requested))
        {
            return (None, off("is the histogram file (freq_path)"));
        }
        let examine = |path: &Path| examine_trace(path, vault_file.as_ref());
        let (path, seen) = match judge_target(requested, examine) {
            Target::Foreign(what) => return (None, off(&what)),
            Target::ReadOnly { path, error, .. } => {
                return (
                    None,
                    Some(format!(
                        "{}: directory is not writable ({error}); no trace is recorded",
                        path.display()
                    )),
                )
            }
            Target::Writable { path, seen } => (path, seen),
        };
        if histogram_path
            .as_deref()
            .is_some_and(|h| same_file(h, &path))
        {
            return (None, off("leads to the histogram file (freq_path)"));
        }
        let Some(events) = zeroed_events(capacity) else {
            return (
                None,
                Some(format!(
                    "{}: cannot allocate the trace's {capacity} entries; no trace is recorded",
                    requested.display()
                )),
            );
        };
        remove_leftover_temp_files(&path);
        let recorder = TraceRecorder {
            events,
            next: CachePadded::new(AtomicUsize::new(0)),
            n_experts: vault.n_experts().max(1),
            path,
            seen,
            vault_file,
            histogram_path,
        };
        (Some(recorder), None)
    }

    /// Records one OK claim of dense id `id`; when full, only counts it.
    #[inline]
    pub(crate) fn record(&self, id: u32) {
        // Relaxed: the index only hands out distinct entries; the entries
        // are read at close, after every claim has returned (the host's
        // `smoe_close` contract, `&mut Streamer` in Rust).
        let at = self.next.fetch_add(1, Ordering::Relaxed);
        if let Some(event) = self.events.get(at) {
            // Relaxed: published by whatever orders the close after the
            // claim (see above).
            event.store(id, Ordering::Relaxed);
        }
    }

    /// Claims recorded so far.
    pub(crate) fn recorded(&self) -> u64 {
        self.claims().min(self.events.len() as u64)
    }

    /// Claims not recorded because the array was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.claims().saturating_sub(self.events.len() as u64)
    }

    fn claims(&self) -> u64 {
        self.next.load(Ordering::Relaxed) as u64
    }

    /// The recorded claims as (layer, expert), in order. Call only when no
    /// claim runs (at close).
    fn events(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let n = self.n_experts;
        self.events[..self.recorded() as usize]
            .iter()
            .map(move |e| {
                let id = e.load(Ordering::Relaxed);
                (id / n, id % n)
            })
    }

    /// Writes the trace atomically (temporary file, fsync, rename, directory
    /// fsync), after checking once more that the file at the path may be
    /// replaced. Call only when no claim runs (at close).
    pub(crate) fn save(&self) -> Result<()> {
        let check = || {
            if let (Some(seen), Ok(m)) = (self.seen, std::fs::symlink_metadata(&self.path)) {
                if m.file_type().is_file() && file_id(&m) == seen {
                    return Ok(());
                }
            }
            let found = if self
                .histogram_path
                .as_deref()
                .is_some_and(|h| same_file(h, &self.path))
            {
                Found::Foreign("is the histogram file (freq_path)".into())
            } else {
                examine_trace(&self.path, self.vault_file.as_ref())
            };
            match found {
                Found::Nothing | Found::Ours(_) => Ok(()),
                Found::Foreign(what) => Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "{}: {what} (put there after open); the library replaces only a \
                         routing trace, so the trace was not written",
                        self.path.display()
                    ),
                )),
            }
        };
        save_checked(
            &self.path,
            |file: &mut File| {
                let mut out = BufWriter::new(file);
                write_trace(&mut out, || self.events(), self.n_experts)?;
                out.flush()
            },
            check,
        )
        .map(|_| ())
    }
}

/// A zeroed array of `capacity` events from `alloc_zeroed` (`calloc`: pages
/// are committed only when written), or `None` when the allocator refuses:
/// capture is then off, rather than the process aborted.
fn zeroed_events(capacity: usize) -> Option<Box<[AtomicU32]>> {
    let layout = Layout::array::<AtomicU32>(capacity).ok()?;
    if layout.size() == 0 {
        return Some(Box::new([]));
    }
    // SAFETY: the layout's size is not zero.
    let events = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<AtomicU32>();
    if events.is_null() {
        return None;
    }
    // SAFETY: a fresh allocation of the global allocator with the layout
    // of `[AtomicU32; capacity]`, which is how `Box<[AtomicU32]>` frees it;
    // all-zero bytes are a valid `AtomicU32`.
    Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(events, capacity)) })
}

/// Whether `a` and `b` name the same file: the same inode when both exist
/// (links followed), else the same canonical directory and name.
fn same_file(a: &Path, b: &Path) -> bool {
    if let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        return file_id(&ma) == file_id(&mb);
    }
    let canonical = |p: &Path| {
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(dir).ok()?.join(p.file_name()?))
    };
    matches!((canonical(a), canonical(b)), (Some(x), Some(y)) if x == y)
}

/// [`examine_file`] with the trace rule: a regular file whose first line is
/// a trace header (or an empty file: nothing to lose) may be replaced.
fn examine_trace(path: &Path, vault_file: Option<&(PathBuf, FileId)>) -> Found {
    examine_file(path, vault_file, HEAD_BYTES, |head| {
        if head.is_empty() || is_trace_header(head, head.len() == HEAD_BYTES) {
            None
        } else {
            let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
            let shown: String = String::from_utf8_lossy(&line[..line.len().min(40)]).into();
            Some(format!(
                "is not a routing trace (first line begins {shown:?}, expected \
                 \"token,layer,r0...\")"
            ))
        }
    })
}

/// Whether `head`'s first line is a trace header `token,layer,r0,...`
/// (fields trimmed as the parser trims them). With `cut` (the line may go on
/// past `head`) a last column that is a prefix of the expected one counts.
fn is_trace_header(head: &[u8], cut: bool) -> bool {
    let (line, whole) = match head.iter().position(|&b| b == b'\n') {
        Some(end) => (&head[..end], true),
        None => (head, !cut),
    };
    let Ok(line) = std::str::from_utf8(line) else {
        return false;
    };
    let cols: Vec<&str> = line.trim().split(',').map(str::trim).collect();
    if cols.len() < 3 || cols[0] != "token" || cols[1] != "layer" {
        return false;
    }
    let last = cols.len() - 1;
    cols[2..].iter().enumerate().all(|(i, c)| {
        let expected = format!("r{i}");
        *c == expected || (!whole && i + 2 == last && expected.starts_with(c))
    })
}

/// Groups claims, in order, into rows and calls `row(token, layer,
/// experts)` for each: the same layer as the previous claim continues its
/// row (an expert already in it is not repeated); a higher layer starts a
/// new row of the same token; a lower one starts the next token. Tokens are
/// numbered from 0. Streams: one row is held at a time, so a long trace
/// costs no memory per row at close.
pub(crate) fn for_each_row<E>(
    claims: impl IntoIterator<Item = (u32, u32)>,
    n_experts: u32,
    mut row: impl FnMut(u64, u32, &[u32]) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    // The row being built: (token, layer) and its experts.
    let mut current: Option<(u64, u32)> = None;
    let mut experts: Vec<u32> = Vec::new();
    // `in_row[e]` is 1 + the number of the last row expert `e` joined: an
    // O(1) duplicate check, however many experts a row collects.
    let mut in_row = vec![0u64; n_experts as usize];
    let mut rows = 0u64;
    for (layer, expert) in claims {
        let next = match current {
            Some((_, last)) if last == layer => None,
            Some((token, last)) if layer > last => Some(token),
            Some((token, _)) => Some(token + 1),
            None => Some(0),
        };
        if let Some(token) = next {
            if let Some((t, l)) = current {
                row(t, l, &experts)?;
            }
            experts.clear();
            current = Some((token, layer));
            rows += 1;
        }
        match in_row.get_mut(expert as usize) {
            Some(mark) if *mark == rows => {}
            Some(mark) => {
                *mark = rows;
                experts.push(expert);
            }
            None if experts.contains(&expert) => {}
            None => experts.push(expert),
        }
    }
    match current {
        Some((t, l)) => row(t, l, &experts),
        None => Ok(()),
    }
}

/// Writes the claims as trace text (docs/format.md §5.3): the header names
/// as many rank columns as the longest row has experts (at least one), and
/// a shorter row leaves its trailing fields empty. Lines end in LF. Walks
/// the claims twice (`claims` makes each walk): once for the width, once to
/// write.
pub(crate) fn write_trace<I: IntoIterator<Item = (u32, u32)>>(
    out: &mut impl Write,
    claims: impl Fn() -> I,
    n_experts: u32,
) -> std::io::Result<()> {
    let mut ranks = 1;
    for_each_row(claims(), n_experts, |_, _, experts| {
        ranks = ranks.max(experts.len());
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap_or_else(|never| match never {});
    write!(out, "token,layer")?;
    for r in 0..ranks {
        write!(out, ",r{r}")?;
    }
    writeln!(out)?;
    for_each_row(claims(), n_experts, |token, layer, experts| {
        write!(out, "{token},{layer}")?;
        for e in experts {
            write!(out, ",{e}")?;
        }
        for _ in experts.len()..ranks {
            write!(out, ",")?;
        }
        writeln!(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(claims: &[(u32, u32)]) -> String {
        let mut out = Vec::new();
        write_trace(&mut out, || claims.iter().copied(), 8).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn rows_follow_layers_and_tokens() {
        let claims = [
            (0, 6),
            (0, 5),
            (0, 6), // repeated in its row: once
            (1, 2),
            (3, 7), // a skipped layer: same token
            (3, 1),
            (3, 4),
            (0, 1), // layer goes down: token 1
            (0, 1),
            (2, 0),
        ];
        assert_eq!(
            text(&claims),
            "token,layer,r0,r1,r2\n0,0,6,5,\n0,1,2,,\n0,3,7,1,4\n1,0,1,,\n1,2,0,,\n"
        );
        assert_eq!(text(&[]), "token,layer,r0\n");
        let parsed = crate::router::parse_trace(&text(&claims)).unwrap();
        assert_eq!(parsed[0].experts, vec![6, 5]);
        assert_eq!(parsed[3].token, 1);
    }

    #[test]
    fn experts_beyond_the_shape_are_still_deduplicated() {
        let mut rows = Vec::new();
        for_each_row(
            [(0, 9), (0, 9), (0, 1), (1, 9)],
            2,
            |token, layer, experts| {
                rows.push((token, layer, experts.to_vec()));
                Ok::<(), ()>(())
            },
        )
        .unwrap();
        assert_eq!(rows, [(0, 0, vec![9, 1]), (0, 1, vec![9])]);
    }

    #[test]
    fn header_judgement() {
        for ours in [
            &b"token,layer,r0\n"[..],
            b"token,layer,r0,r1\r\n0,0,1,2\n",
            b" token , layer ,r0",
        ] {
            assert!(is_trace_header(ours, false), "{ours:?}");
        }
        // Cut inside a column name: judged on the part shown.
        assert!(is_trace_header(b"token,layer,r0,r1,r", true));
        assert!(!is_trace_header(b"token,layer,r0,r1,r", false));
        assert!(!is_trace_header(b"token,layer,r0,r1,r1", true));
        for foreign in [
            &b"token,layer\n"[..],
            b"token,layer,r1\n",
            b"token,layer,r0,r2\n",
            b"SMOEFREQ",
            b"token,layer,r0,x\n",
        ] {
            assert!(!is_trace_header(foreign, false), "{foreign:?}");
        }
    }

    #[test]
    fn an_impossible_capacity_is_refused_not_aborted() {
        assert!(zeroed_events(usize::MAX).is_none());
        assert!(zeroed_events(usize::MAX / 8).is_none());
        assert_eq!(zeroed_events(0).unwrap().len(), 0);
        let events = zeroed_events(1 << 20).unwrap();
        assert!(events.iter().all(|e| e.load(Ordering::Relaxed) == 0));
    }

    #[test]
    fn full_recorder_counts_drops_and_keeps_its_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let recorder = TraceRecorder {
            events: zeroed_events(3).unwrap(),
            next: CachePadded::new(AtomicUsize::new(0)),
            n_experts: 8,
            path: dir.path().join("t.csv"),
            seen: None,
            vault_file: None,
            histogram_path: None,
        };
        for id in [1, 9, 2, 3, 4] {
            recorder.record(id);
        }
        assert_eq!((recorder.recorded(), recorder.dropped()), (3, 2));
        recorder.save().unwrap();
        let written = std::fs::read_to_string(dir.path().join("t.csv")).unwrap();
        assert_eq!(written, "token,layer,r0\n0,0,1\n0,1,1\n1,0,2\n");
    }
}
