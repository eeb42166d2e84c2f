//! Routing traces (docs/format.md §5): reading them ([`TraceReader`], for
//! `smoe bench --trace` and the tests), and trace capture (`trace_path`):
//! every OK claim recorded, written at close as a trace (§5.3).
//!
//! The reader holds one line at a time, of at most
//! [`MAX_TRACE_LINE_BYTES`], so a hostile or endless input costs bounded
//! memory, and [`read_trace_tokens`] stops at the last token it is asked
//! for. Its header rule is also the one that decides whether an existing
//! file is a trace that capture may replace.
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
//!   [`crate::fs_safe`]'s, shared.
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
//! [`DEFAULT_TRACE_CAPACITY`](crate::config::DEFAULT_TRACE_CAPACITY) claims, is reserved address space, not memory.

use std::alloc::Layout;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::error::{Error, ErrorKind, Result};
use crate::fs_safe::{
    examine_file, file_id, judge_target, remove_leftover_temp_files, same_file, save_checked,
    vault_file_key, FileId, Found, Target,
};
use crate::sys::OpenRegularError;
use crate::vault::Vault;

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

/// Whether `head`'s first line is a trace header `token,layer,r0,...` as
/// [`TraceReader`] reads it (a byte order mark skipped, fields trimmed).
/// With `cut` (the line may go on past `head`) a last column that is a
/// prefix of the expected one counts.
fn is_trace_header(head: &[u8], cut: bool) -> bool {
    let head = head.strip_prefix(UTF8_BOM).unwrap_or(head);
    let (line, whole) = match head.iter().position(|&b| b == b'\n') {
        Some(end) => (&head[..end], true),
        None => (head, !cut),
    };
    std::str::from_utf8(line).is_ok_and(|line| header_ranks(line, !whole).is_ok())
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

// ------------------------------------------------------------- reading

/// The most bytes one line of a routing trace may hold, its line end
/// included: 16 MiB. Trace capture's longest line is under 10 MiB (a header
/// of 2^20 rank columns, the most experts a vault may have, at up to 9
/// bytes each, or a row of 2^20 experts at up to 8), so every trace it
/// writes is read back; a longer line is an error, not an allocation
/// without bound.
pub const MAX_TRACE_LINE_BYTES: usize = 16 << 20;

/// Input quoted in an error is cut to this many characters.
const QUOTE_CHARS: usize = 80;

/// One row of a routing trace: a token's experts at one layer, in gate-rank
/// order (rank 0 first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRow {
    /// Line of the trace file the row came from (1 is the header).
    pub line: usize,
    /// Token number.
    pub token: u64,
    /// Layer id.
    pub layer: u32,
    /// Expert ids by gate rank.
    pub experts: Vec<u32>,
}

/// Tokens of a trace: per token, `(layer, experts)` in execution order.
pub type TraceTokens = Vec<Vec<(u32, Vec<u32>)>>;

/// Reads a routing trace (docs/format.md §5.1) one line at a time: a line
/// holds at most [`MAX_TRACE_LINE_BYTES`], and only the current line is
/// kept, so memory does not grow with the input. Every error names the
/// line (the header is line 1) and quotes at most 80 characters of it.
pub struct TraceReader<R> {
    input: R,
    /// The current line, its end included.
    line: Vec<u8>,
    /// Its number, from 1; 0 before the first.
    line_no: usize,
    /// Rank columns of the header.
    ranks: usize,
}

impl<R: std::io::BufRead> TraceReader<R> {
    /// Reads and checks the header: `token,layer,r0,r1,...`, a UTF-8 byte
    /// order mark before it skipped.
    pub fn new(input: R) -> Result<TraceReader<R>> {
        let mut reader = TraceReader {
            input,
            line: Vec::new(),
            line_no: 0,
            ranks: 0,
        };
        if !reader.next_line()? {
            return Err(Error::format(
                "trace is empty: expected a header token,layer,r0,...",
            ));
        }
        let ranks = header_ranks(reader.text()?, false)
            .map_err(|why| Error::format(format!("trace line 1: {why}")))?;
        reader.ranks = ranks;
        Ok(reader)
    }

    /// The next row, blank lines skipped; `None` at the end of the input.
    pub fn next_row(&mut self) -> Result<Option<TraceRow>> {
        self.next_row_of(None)
    }

    /// [`TraceReader::next_row`]; with `only`, a line that is not a row of
    /// token `only` (its first field is not that number) ends the reading
    /// (`None`) and is not checked further.
    fn next_row_of(&mut self, only: Option<u64>) -> Result<Option<TraceRow>> {
        loop {
            if !self.next_line()? {
                return Ok(None);
            }
            if let Some(token) = only {
                let content = self.content().trim_ascii();
                let first = content.split(|&b| b == b',').next().unwrap_or_default();
                if !content.is_empty() && decimal(first.trim_ascii()) != Some(token) {
                    return Ok(None);
                }
            }
            let line_no = self.line_no;
            let text = self.text()?;
            if text.trim_ascii().is_empty() {
                continue;
            }
            let fields: Vec<&str> = text.trim_ascii().split(',').map(str::trim_ascii).collect();
            let token = number(line_no, "token", fields[0])?;
            let (layer, experts) = row_experts(line_no, &fields, self.ranks)?;
            return Ok(Some(TraceRow {
                line: line_no,
                token,
                layer,
                experts,
            }));
        }
    }

    /// Reads the next line into `self.line`; `false` at the end of the
    /// input. A line longer than [`MAX_TRACE_LINE_BYTES`] is an error once
    /// that many bytes are read.
    fn next_line(&mut self) -> Result<bool> {
        use std::io::{BufRead, Read};
        self.line.clear();
        let at = self.line_no + 1;
        let read = (&mut self.input)
            .take(MAX_TRACE_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut self.line)
            .map_err(|e| Error::new(ErrorKind::Io, format!("trace line {at}: cannot read: {e}")))?;
        if read == 0 {
            return Ok(false);
        }
        self.line_no = at;
        if self.line.len() > MAX_TRACE_LINE_BYTES {
            return Err(Error::format(format!(
                "trace line {at}: longer than {} MiB, the most a line may hold",
                MAX_TRACE_LINE_BYTES >> 20
            )));
        }
        Ok(true)
    }

    /// The current line without its line end (and, on line 1, without a
    /// byte order mark).
    fn content(&self) -> &[u8] {
        let mut bytes = &self.line[..];
        bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        if self.line_no == 1 {
            bytes = bytes.strip_prefix(UTF8_BOM).unwrap_or(bytes);
        }
        bytes
    }

    /// [`TraceReader::content`] as text.
    fn text(&self) -> Result<&str> {
        let bytes = self.content();
        std::str::from_utf8(bytes).map_err(|e| {
            let at = e.valid_up_to();
            Error::format(format!(
                "trace line {}: not UTF-8 (byte {} of the line is 0x{:02x})",
                self.line_no,
                at + 1,
                bytes[at]
            ))
        })
    }
}

/// The UTF-8 encoding of U+FEFF, which some editors put before the header.
const UTF8_BOM: &[u8] = b"\xef\xbb\xbf";

/// The rank columns of a header line `token,layer,r0,r1,...` (fields
/// trimmed), or what is wrong with it. With `cut` (the line may go on past
/// what `line` shows) a last column that is a prefix of the expected name
/// counts.
fn header_ranks(line: &str, cut: bool) -> std::result::Result<usize, String> {
    let cols: Vec<&str> = line.trim_ascii().split(',').map(str::trim_ascii).collect();
    if cols.len() < 3 || cols[0] != "token" || cols[1] != "layer" {
        return Err(format!(
            "header is {}, expected \"token,layer,r0,r1,...\"",
            quote(line)
        ));
    }
    let last = cols.len() - 1;
    for (i, c) in cols[2..].iter().enumerate() {
        let expected = format!("r{i}");
        if *c != expected && !(cut && i + 2 == last && expected.starts_with(c)) {
            return Err(format!(
                "column {} is {}, expected \"r{i}\"",
                i + 3,
                quote(c)
            ));
        }
    }
    Ok(cols.len() - 2)
}

/// The layer and experts of a row whose fields are `fields` (the token
/// already read), under a header of `ranks` rank columns.
fn row_experts(line_no: usize, fields: &[&str], ranks: usize) -> Result<(u32, Vec<u32>)> {
    if fields.len() != ranks + 2 {
        return Err(Error::format(format!(
            "trace line {line_no}: {} fields, expected {} (token, layer, {ranks} ranks)",
            fields.len(),
            ranks + 2
        )));
    }
    let small = |i: usize, what: &str| -> Result<u32> {
        let v = number(line_no, what, fields[i])?;
        u32::try_from(v)
            .map_err(|_| Error::format(format!("trace line {line_no}: {what} {v} is too large")))
    };
    let layer = small(1, "layer")?;
    // A row with fewer experts than the header has ranks leaves its
    // trailing fields empty (what trace capture writes); an empty field
    // before a number is an error, and so is an empty r0.
    let named = fields[2..]
        .iter()
        .rposition(|f| !f.is_empty())
        .map_or(1, |last| last + 1);
    let mut experts = Vec::with_capacity(named);
    for r in 0..named {
        experts.push(small(r + 2, &format!("r{r}"))?);
    }
    // Sorted, not pairwise: a row may have as many ranks as its header
    // names, and a quadratic check of a hostile one would not end.
    let mut sorted = experts.clone();
    sorted.sort_unstable();
    if let Some(pair) = sorted.windows(2).find(|p| p[0] == p[1]) {
        return Err(Error::format(format!(
            "trace line {line_no}: expert {} appears twice in one row",
            pair[0]
        )));
    }
    Ok((layer, experts))
}

/// `field` as a number if it is plain decimal digits (no sign, no space
/// inside) and fits a `u64`.
fn decimal(field: &[u8]) -> Option<u64> {
    if field.is_empty() || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// [`decimal`], or an error naming the line and the field.
fn number(line_no: usize, what: &str, field: &str) -> Result<u64> {
    if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::format(format!(
            "trace line {line_no}: {what} is {}, expected a non-negative integer in decimal digits",
            quote(field)
        )));
    }
    decimal(field.as_bytes()).ok_or_else(|| {
        Error::format(format!(
            "trace line {line_no}: {what} {} is too large",
            quote(field)
        ))
    })
}

/// `text` quoted for a message: whole up to [`QUOTE_CHARS`] characters,
/// else its first 60 and its length.
fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTE_CHARS) {
        None => format!("{text:?}"),
        Some(_) => {
            let end = text.char_indices().nth(60).map_or(text.len(), |(i, _)| i);
            format!("{:?}... ({} bytes)", &text[..end], text.len())
        }
    }
}

/// Parses a whole routing trace held in memory (tests, small inputs); see
/// [`TraceReader`] for the rules.
pub fn parse_trace(text: &str) -> Result<Vec<TraceRow>> {
    let mut reader = TraceReader::new(text.as_bytes())?;
    let mut rows = Vec::new();
    while let Some(row) = reader.next_row()? {
        rows.push(row);
    }
    Ok(rows)
}

/// Groups trace rows into tokens (consecutive rows with one token number),
/// each a list of `(layer, experts)` in execution order; `top_k` keeps the
/// first ranks of each row (0 = all).
pub fn trace_tokens(rows: &[TraceRow], top_k: usize) -> TraceTokens {
    let mut tokens = TokenBuilder::new(top_k);
    for row in rows {
        tokens.push(row.token, row.layer, &row.experts);
    }
    tokens.tokens
}

/// Reads the tokens of a trace from `input`, as [`trace_tokens`] groups
/// them, keeping the first `max_tokens` (all when `None`). Once that many
/// tokens have begun, the first line that is not a row of the last one
/// (its token field is another number, or not a number) ends the reading:
/// that line is not checked, and nothing after it is read.
pub fn read_trace_tokens(
    input: impl std::io::BufRead,
    top_k: usize,
    max_tokens: Option<usize>,
) -> Result<TraceTokens> {
    let mut reader = TraceReader::new(input)?;
    let mut tokens = TokenBuilder::new(top_k);
    let max = max_tokens.unwrap_or(usize::MAX);
    loop {
        let only = if tokens.tokens.len() >= max {
            match tokens.current {
                Some(token) => Some(token),
                None => return Ok(tokens.tokens),
            }
        } else {
            None
        };
        match reader.next_row_of(only)? {
            Some(row) => tokens.push(row.token, row.layer, &row.experts),
            None => return Ok(tokens.tokens),
        }
    }
}

/// [`read_trace_tokens`] of the file at `path`, opened without blocking:
/// anything but a regular file (a FIFO, a device such as `/dev/zero`, a
/// directory) is refused before it is read. Errors name the path.
pub fn read_trace_file(
    path: &Path,
    top_k: usize,
    max_tokens: Option<usize>,
) -> Result<TraceTokens> {
    let (file, _) = match crate::sys::open_regular(path) {
        Ok(opened) => opened,
        Err(OpenRegularError::NotRegular(kind)) => {
            return Err(Error::argument(format!("is {kind}, not a routing trace")).with_path(path))
        }
        Err(OpenRegularError::Os(e)) => return Err(Error::io("cannot read trace", path, &e)),
    };
    read_trace_tokens(std::io::BufReader::new(file), top_k, max_tokens)
        .map_err(|e| e.context(path.display()))
}

/// Builds [`TraceTokens`] from rows in order.
struct TokenBuilder {
    tokens: TraceTokens,
    /// The token number of the last row.
    current: Option<u64>,
    top_k: usize,
}

impl TokenBuilder {
    fn new(top_k: usize) -> TokenBuilder {
        TokenBuilder {
            tokens: Vec::new(),
            current: None,
            top_k,
        }
    }

    fn push(&mut self, token: u64, layer: u32, experts: &[u32]) {
        if self.current != Some(token) {
            self.tokens.push(Vec::new());
            self.current = Some(token);
        }
        let k = match self.top_k {
            0 => experts.len(),
            k => k.min(experts.len()),
        };
        if let Some(t) = self.tokens.last_mut() {
            t.push((layer, experts[..k].to_vec()));
        }
    }
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
        let parsed = parse_trace(&text(&claims)).unwrap();
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
    fn trace_parses_and_rejects_bad_rows() {
        let rows = parse_trace("token,layer,r0,r1\n0,0,6,5\n0,1,6,2\n").unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].experts, vec![6, 2]);
        // Trailing empty fields: a shorter row (trace capture writes them).
        let rows = parse_trace("token,layer,r0,r1,r2\n3,7,5,,\n3,8,1, 2 ,\n").unwrap();
        assert_eq!(rows[0].experts, vec![5]);
        assert_eq!(rows[1].experts, vec![1, 2]);
        // CRLF, blank lines, a byte order mark before the header.
        let rows = parse_trace("\u{feff}token,layer,r0\r\n\r\n 0 , 1 , 2 \r\n\n").unwrap();
        assert_eq!(
            (rows[0].line, rows[0].layer, &rows[0].experts[..]),
            (3, 1, &[2][..])
        );
        for (bad, needle) in [
            ("", "empty"),
            ("tok,layer,r0\n", "header"),
            ("token,layer,r0,r2\n", "column 4"),
            ("token,layer,r0\n0,0\n", "line 2: 2 fields"),
            ("token,layer,r0\n0,x,1\n", "line 2: layer is \"x\""),
            ("token,layer,r0\n0,0,-1\n", "r0 is \"-1\""),
            ("token,layer,r0\n0,0,+1\n", "r0 is \"+1\""),
            ("token,layer,r0\n+0,0,1\n", "token is \"+0\""),
            ("token,layer,r0\n0,1 2,1\n", "layer is \"1 2\""),
            ("token,layer,r0\n0,0,\u{ff11}\n", "r0 is \"\u{ff11}\""),
            ("token,layer,r0,r1\n0,0,3,3\n", "appears twice"),
            ("token,layer,r0\n0,99999999999,1\n", "too large"),
            (
                "token,layer,r0\n18446744073709551616,0,1\n",
                "token \"18446744073709551616\" is too large",
            ),
            ("token,layer,r0,r1\n0,0,,\n", "r0 is \"\""),
            ("token,layer,r0,r1\n0,0,,3\n", "r0 is \"\""),
            ("token,layer,r0,r1,r2\n0,0,1,,3\n", "r1 is \"\""),
            (
                "token,layer,r0\n\u{feff}0,0,1\n",
                "line 2: token is \"\\u{feff}0\"",
            ),
        ] {
            let err = parse_trace(bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{bad:?}: {err}");
        }
    }

    #[test]
    fn errors_quote_at_most_80_characters_and_name_the_line() {
        let long = "7".repeat(100_000);
        for text in [
            format!("token,layer,r0\n0,0,{long}\n"),
            format!("token,layer,r0\n{long}x,0,1\n"),
            format!("{long}\n"),
            format!("token,layer,r0,{long}\n"),
        ] {
            let err = parse_trace(&text).unwrap_err().to_string();
            assert!(err.len() < 250, "{} bytes: {err:.300}", err.len());
            assert!(
                err.contains("(100000 bytes)") || err.contains("(100001 bytes)"),
                "{err}"
            );
        }
        // Exactly 80 characters are quoted whole; 81 are cut.
        let err = parse_trace(&format!("token,layer,r0\n0,0,{}\n", "x".repeat(80))).unwrap_err();
        assert!(
            err.to_string().contains(&format!("{:?},", "x".repeat(80))),
            "{err}"
        );
        let err = parse_trace(&format!("token,layer,r0\n0,0,{}\n", "é".repeat(81))).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("{:?}... (162 bytes)", "é".repeat(60))),
            "{err}"
        );
        let err = parse_trace("token,layer,r0\n0,0,1\n0,1,\u{e9}\n").unwrap_err();
        assert!(err.to_string().contains("line 3"), "{err}");
    }

    #[test]
    fn not_utf8_names_the_line_and_long_lines_stop_the_reading() {
        let err = TraceReader::new(&b"token,layer,r0\n0,0,1\n0,1,\xff\n"[..])
            .and_then(|mut r| {
                while r.next_row()?.is_some() {}
                Ok(())
            })
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("trace line 3: not UTF-8 (byte 5 of the line is 0xff)"),
            "{err}"
        );
        // A line of exactly the cap is read; one byte more is refused
        // after the cap, without reading the rest of the input.
        let row = format!("0,0,{}1\n", " ".repeat(MAX_TRACE_LINE_BYTES - 6));
        assert_eq!(row.len(), MAX_TRACE_LINE_BYTES);
        let rows = parse_trace(&format!("token,layer,r0\n{row}")).unwrap();
        assert_eq!(rows[0].experts, vec![1]);
        let endless = std::io::repeat(b' ');
        let err = read_trace_tokens(std::io::BufReader::new(endless), 0, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("trace line 1: longer than 16 MiB"), "{err}");
    }

    #[test]
    fn reading_stops_at_the_last_token_needed() {
        let mut text = String::from("token,layer,r0,r1\n0,0,1,2\n0,1,3,4\n1,0,1,5\n2,0,6,7\n");
        text.push_str("garbage\n");
        let input = || std::io::Cursor::new(text.as_bytes());
        let tokens = read_trace_tokens(input(), 1, Some(2)).unwrap();
        assert_eq!(
            tokens,
            vec![vec![(0, vec![1]), (1, vec![3])], vec![(0, vec![1])]]
        );
        assert_eq!(read_trace_tokens(input(), 0, Some(3)).unwrap().len(), 3);
        for max in [Some(4), None] {
            let err = read_trace_tokens(input(), 0, max).unwrap_err().to_string();
            assert!(err.contains("trace line 6: token is \"garbage\""), "{err}");
        }
        // The first row past the limit is read no further than its token.
        let mut cursor = std::io::Cursor::new(&b"token,layer,r0\n0,0,1\n1,x\nrest"[..]);
        assert_eq!(read_trace_tokens(&mut cursor, 0, Some(1)).unwrap().len(), 1);
        assert_eq!(cursor.position(), 25, "stopped after line 3");
    }

    #[test]
    fn rows_group_into_tokens_and_keep_top_k() {
        let rows = parse_trace("token,layer,r0,r1,r2\n0,0,1,2,3\n0,1,4,5,6\n1,0,7,1,2\n").unwrap();
        assert_eq!(rows[2].line, 4);
        let t = trace_tokens(&rows, 2);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0], vec![(0, vec![1, 2]), (1, vec![4, 5])]);
        assert_eq!(t[1], vec![(0, vec![7, 1])]);
        assert_eq!(trace_tokens(&rows, 0)[1][0].1, vec![7, 1, 2]);
    }

    #[test]
    fn header_judgement() {
        for ours in [
            &b"token,layer,r0\n"[..],
            b"token,layer,r0,r1\r\n0,0,1,2\n",
            b" token , layer ,r0",
            b"\xef\xbb\xbftoken,layer,r0\n",
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
