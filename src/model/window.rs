//! Aligned windows: how an expert's slices, wherever they sit in a model's
//! files, reach the same offsets in every slot of their layer (SPEC §6,
//! issue 34), read with direct I/O and, on the fast path, never copied.
//!
//! Direct I/O reads whole blocks: the file offset, the length and the
//! buffer are multiples of [`IO_ALIGN`]. A GGUF aligns tensor data to 32
//! bytes and safetensors to 8, so a slice seldom starts on a block. Each
//! slice is read with the window around it (its offset rounded down to a
//! block, its end rounded up) into the slot at a block boundary; the slice
//! lands `head = offset mod IO_ALIGN` bytes into its window. Within one
//! stacked tensor whose per-expert stride is a multiple of the block, every
//! expert's slice has the same head (Qwen3-235B's Q4_K gate: a stride of
//! 864 blocks), so the payload lands at the same offset of every slot of the
//! layer with no copy. Where the heads differ (small fixtures, strides of
//! 2176 bytes), the payload is read the same way and then moved to the
//! layer's offset, in the slot: a [`Move`], which the streamer counts.
//!
//! Slices of one expert that lie one after the other in a file, the same
//! way for every expert of the layer (a per-expert safetensors model's
//! gate, up and down, say), form one *run*: one window, one read.
//!
//! This module only computes; it reads nothing.

use std::fmt;

pub use super::plan::Slice;

/// The block of direct I/O: file offsets, lengths and slot positions of
/// every read are multiples of it (4096 serves Linux's filesystems on
/// 512-byte and 4K-sector drives, and macOS's `F_NOCACHE` asks nothing).
pub const IO_ALIGN: u64 = 4096;

/// The largest gap between two slices of a run: bytes between them are read
/// and thrown away rather than paying a second request.
const MAX_RUN_GAP: u64 = IO_ALIGN;

/// One read of an expert's load: `len` bytes of file `file` from `offset`
/// into the slot from `slot`; all three are multiples of [`IO_ALIGN`]. The
/// file may end before `offset + len`, but not before `offset + need`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    /// Which of the model's files.
    pub file: usize,
    /// File offset of the window.
    pub offset: u64,
    /// Window length.
    pub len: u64,
    /// The bytes of the window that hold payload (`head + span`): a read
    /// that ends earlier is short.
    pub need: u64,
    /// Slot offset where the window starts.
    pub slot: u64,
}

/// A move inside the slot after the reads: `len` bytes from slot offset
/// `from` to `to` (the ranges may overlap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// Where the payload landed.
    pub from: u64,
    /// Where the layer's layout puts it.
    pub to: u64,
    /// Its length.
    pub len: u64,
}

/// Why a layer's slices cannot share one layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowError {
    /// The layer has no experts, or an expert has no slices.
    Empty,
    /// Expert number `expert` (of the list given) has `got` slices where
    /// the first has `want`.
    RoleCount {
        /// Position of the expert in the list.
        expert: usize,
        /// Its slice count.
        got: usize,
        /// The first expert's.
        want: usize,
    },
    /// Slice `role` of expert number `expert` is `got` bytes long where the
    /// first expert's is `want` (or 0 bytes).
    Length {
        /// Position of the expert in the list.
        expert: usize,
        /// Position of the slice.
        role: usize,
        /// Its length.
        got: u64,
        /// The first expert's.
        want: u64,
    },
    /// A slice ends past 2^64, or the layout's slot would: no real model's
    /// does.
    TooLarge,
}

impl fmt::Display for WindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WindowError::Empty => f.write_str("a layer with no expert slices has no layout"),
            WindowError::RoleCount { expert, got, want } => write!(
                f,
                "expert {expert} of the layer has {got} slices, the layer's first {want}: every \
                 expert of a layer must have the same slices"
            ),
            WindowError::Length {
                expert,
                role,
                got,
                want,
            } => write!(
                f,
                "slice {role} of expert {expert} of the layer is {got} bytes, the layer's first \
                 expert's {want}: every expert of a layer must have slices of the same sizes"
            ),
            WindowError::TooLarge => {
                f.write_str("a slice, or the layer's slot layout, passes 2^64 bytes")
            }
        }
    }
}

impl std::error::Error for WindowError {}

/// The slices of a run, read with one window: `first` is the run's first
/// slice in the file, `last` its last (indices in the layer's slice
/// order, which need not be file order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    first: usize,
    last: usize,
    /// Slot offset of the run's window (a multiple of [`IO_ALIGN`]).
    window: u64,
    /// Where the run's first payload byte sits in every slot:
    /// `window + head` when every expert's head is the same, else
    /// `window` (the payload moved down to the block).
    payload: u64,
    /// Slot bytes the run's window may fill: the largest head of the
    /// layer's experts and the span, rounded up to the block.
    room: u64,
}

/// The layout of one layer: where each slice's payload sits in every slot
/// of the layer, and how each expert's slices are read there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerWindows {
    /// Per slice (in the order given): its payload's offset in the slot.
    offsets: Vec<u64>,
    runs: Vec<Run>,
    /// Slot bytes the layer needs: a multiple of [`IO_ALIGN`].
    slot_bytes: u64,
}

/// Rounds `n` up to a multiple of [`IO_ALIGN`], if that fits.
fn align_up(n: u64) -> Option<u64> {
    n.checked_next_multiple_of(IO_ALIGN)
}

impl LayerWindows {
    /// The layout of a layer whose experts have the slices `experts` (one
    /// list per expert, the roles in the same order, of the same lengths).
    ///
    /// The slices are taken in the first expert's file order (file, then
    /// offset). Two that follow one another join one run when, for every
    /// expert, they are in the same file, the second starts at the same
    /// distance after the first, and no further than [`MAX_RUN_GAP`] past
    /// its end. A run's payload
    /// keeps that shape in the slot. Runs follow one another in the slot,
    /// each at a block boundary, with room for its window whatever the
    /// expert's head.
    pub fn plan(experts: &[&[Slice]]) -> Result<LayerWindows, WindowError> {
        let first = experts.first().ok_or(WindowError::Empty)?;
        if first.is_empty() {
            return Err(WindowError::Empty);
        }
        for (e, slices) in experts.iter().enumerate() {
            if slices.len() != first.len() {
                return Err(WindowError::RoleCount {
                    expert: e,
                    got: slices.len(),
                    want: first.len(),
                });
            }
            for (role, (s, f)) in slices.iter().zip(first.iter()).enumerate() {
                if s.offset.checked_add(s.bytes).is_none() {
                    return Err(WindowError::TooLarge);
                }
                if s.bytes != f.bytes || s.bytes == 0 {
                    return Err(WindowError::Length {
                        expert: e,
                        role,
                        got: s.bytes,
                        want: f.bytes,
                    });
                }
            }
        }
        // Runs follow the first expert's slices in file order (a
        // safetensors checkpoint stores an expert's down, gate and up by
        // name, so role order would split them); `order[k]` is the slice
        // at position k. Every expert must keep the distances (`joins`).
        let mut order: Vec<usize> = (0..first.len()).collect();
        order.sort_by_key(|&r| (first[r].file, first[r].offset));
        let joins = |k: usize| {
            let (a, b) = (order[k], order[k + 1]);
            let step = first[b].offset.wrapping_sub(first[a].offset);
            step >= first[a].bytes
                && step - first[a].bytes <= MAX_RUN_GAP
                && experts.iter().all(|s| {
                    s[a].file == s[b].file && s[b].offset.wrapping_sub(s[a].offset) == step
                })
        };
        let mut offsets = vec![0; first.len()];
        let mut runs = Vec::new();
        let mut slot = 0u64;
        let mut start = 0;
        while start < order.len() {
            let mut last = start;
            while last + 1 < order.len() && joins(last) {
                last += 1;
            }
            let (a, z) = (order[start], order[last]);
            // Within a run the distances are every expert's (checked above),
            // so the span is too.
            let span = first[z].offset - first[a].offset + first[z].bytes;
            let heads = experts.iter().map(|s| s[a].offset % IO_ALIGN);
            let same_head = heads.clone().all(|h| h == first[a].offset % IO_ALIGN);
            let max_head = heads.max().unwrap_or(0);
            let window = slot;
            let payload = if same_head {
                window + first[a].offset % IO_ALIGN
            } else {
                window
            };
            for &r in &order[start..=last] {
                offsets[r] = payload + (first[r].offset - first[a].offset);
            }
            let room = max_head
                .checked_add(span)
                .and_then(align_up)
                .ok_or(WindowError::TooLarge)?;
            runs.push(Run {
                first: a,
                last: z,
                window,
                payload,
                room,
            });
            slot = slot.checked_add(room).ok_or(WindowError::TooLarge)?;
            start = last + 1;
        }
        Ok(LayerWindows {
            offsets,
            runs,
            slot_bytes: slot,
        })
    }

    /// Per slice: its payload's offset in every slot of the layer.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    /// Slot bytes the layer needs, a multiple of [`IO_ALIGN`].
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// How many reads each expert's load takes.
    pub fn reads_per_expert(&self) -> usize {
        self.runs.len()
    }

    /// The reads, then the moves, that bring `slices` (one expert of the
    /// layer [`LayerWindows::plan`] was given) to [`LayerWindows::offsets`]
    /// in its slot; appended to `reads` and `moves`.
    pub fn reads(&self, slices: &[Slice], reads: &mut Vec<Read>, moves: &mut Vec<Move>) {
        for run in &self.runs {
            let (a, b) = (slices[run.first], slices[run.last]);
            let head = a.offset % IO_ALIGN;
            let span = b.offset - a.offset + b.bytes;
            let need = head + span;
            // An expert of the layer `plan` was given fits its run's room.
            debug_assert!(
                need.next_multiple_of(IO_ALIGN) <= run.room,
                "an expert the layout was not planned for"
            );
            reads.push(Read {
                file: a.file,
                offset: a.offset - head,
                // ≤ the run's room, which `plan` checked fits.
                len: need.next_multiple_of(IO_ALIGN),
                need,
                slot: run.window,
            });
            let landed = run.window + head;
            if landed != run.payload {
                moves.push(Move {
                    from: landed,
                    to: run.payload,
                    len: span,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(file: usize, offset: u64, bytes: u64) -> Slice {
        Slice {
            file,
            offset,
            bytes,
        }
    }

    /// Applies an expert's reads and moves to a slot, with the files given
    /// as byte vectors: what the worker does.
    fn load(w: &LayerWindows, slices: &[Slice], files: &[Vec<u8>]) -> Vec<u8> {
        let mut slot = vec![0xEEu8; w.slot_bytes() as usize];
        let (mut reads, mut moves) = (Vec::new(), Vec::new());
        w.reads(slices, &mut reads, &mut moves);
        for r in &reads {
            assert_eq!(r.offset % IO_ALIGN, 0, "{r:?}");
            assert_eq!(r.len % IO_ALIGN, 0, "{r:?}");
            assert_eq!(r.slot % IO_ALIGN, 0, "{r:?}");
            assert!(r.need <= r.len && r.slot + r.len <= w.slot_bytes(), "{r:?}");
            let file = &files[r.file];
            let end = (r.offset + r.len).min(file.len() as u64);
            assert!(end >= r.offset + r.need, "the file ends inside the payload");
            let got = &file[r.offset as usize..end as usize];
            slot[r.slot as usize..r.slot as usize + got.len()].copy_from_slice(got);
        }
        for m in &moves {
            slot.copy_within(m.from as usize..(m.from + m.len) as usize, m.to as usize);
        }
        slot
    }

    fn check(w: &LayerWindows, experts: &[Vec<Slice>], files: &[Vec<u8>]) {
        for slices in experts {
            let slot = load(w, slices, files);
            for (slice, &at) in slices.iter().zip(w.offsets()) {
                let want = &files[slice.file]
                    [slice.offset as usize..(slice.offset + slice.bytes) as usize];
                assert_eq!(&slot[at as usize..(at + slice.bytes) as usize], want);
            }
        }
    }

    /// A stacked tensor whose stride is a multiple of the block (the
    /// issue's qwen3moe gate: every slice at 992 mod 4096): the payload
    /// lands at 992 in every slot, one read each, no move.
    #[test]
    fn a_block_stride_lands_in_place() {
        let stride = 204 * IO_ALIGN;
        let base = 7 * IO_ALIGN + 992;
        let experts: Vec<Vec<Slice>> = (0..4)
            .map(|e| vec![s(0, base + e * stride, 835_000)])
            .collect();
        let refs: Vec<&[Slice]> = experts.iter().map(Vec::as_slice).collect();
        let w = LayerWindows::plan(&refs).unwrap();
        assert_eq!(w.offsets(), [992]);
        assert_eq!(
            w.slot_bytes(),
            (992u64 + 835_000).next_multiple_of(IO_ALIGN)
        );
        let (mut reads, mut moves) = (Vec::new(), Vec::new());
        w.reads(&experts[3], &mut reads, &mut moves);
        assert_eq!(reads.len(), 1);
        assert!(moves.is_empty());
        assert_eq!(reads[0].offset, base + 3 * stride - 992);
    }

    /// A stride that is not (2176 bytes, a small fixture's): every payload
    /// ends up at the block, most of them moved there.
    #[test]
    fn an_odd_stride_is_moved_to_the_block() {
        let experts: Vec<Vec<Slice>> = (0..8).map(|e| vec![s(0, 100 + e * 2176, 2176)]).collect();
        let refs: Vec<&[Slice]> = experts.iter().map(Vec::as_slice).collect();
        let w = LayerWindows::plan(&refs).unwrap();
        assert_eq!(w.offsets(), [0]);
        let file: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        check(&w, &experts, &[file]);
    }

    /// A per-expert model's gate, up and down one after the other (8-byte
    /// alignment gaps): one read per expert, the gaps kept.
    #[test]
    fn adjacent_slices_are_one_read() {
        let experts: Vec<Vec<Slice>> = (0..3)
            .map(|e| {
                let b = 50 + e * 10_000;
                vec![s(0, b, 3000), s(0, b + 3000, 3000), s(0, b + 6008, 2990)]
            })
            .collect();
        let refs: Vec<&[Slice]> = experts.iter().map(Vec::as_slice).collect();
        let w = LayerWindows::plan(&refs).unwrap();
        assert_eq!(w.reads_per_expert(), 1);
        assert_eq!(w.offsets(), [0, 3000, 6008]);
        let file: Vec<u8> = (0..40_000u32).map(|i| (i ^ (i >> 9)) as u8).collect();
        check(&w, &experts, &[file]);
    }

    /// A safetensors checkpoint stores an expert's tensors by name: down,
    /// gate, up. Listed in role order (gate, up, down), they are still one
    /// read, their payloads in file order in the slot.
    #[test]
    fn slices_adjacent_in_file_order_are_one_read() {
        let experts: Vec<Vec<Slice>> = (0..3)
            .map(|e| {
                let b = 50 + e * 10_000;
                // gate, up, down; in the file: down at b, gate, up.
                vec![s(0, b + 2990, 3000), s(0, b + 5990, 3000), s(0, b, 2990)]
            })
            .collect();
        let refs: Vec<&[Slice]> = experts.iter().map(Vec::as_slice).collect();
        let w = LayerWindows::plan(&refs).unwrap();
        assert_eq!(w.reads_per_expert(), 1);
        // The heads differ (10,000-byte strides): moved to the block.
        assert_eq!(w.offsets(), [2990, 5990, 0]);
        let file: Vec<u8> = (0..40_000u32).map(|i| (i ^ (i >> 9)) as u8).collect();
        check(&w, &experts, &[file]);
    }

    #[test]
    fn mismatched_experts_are_refused() {
        let a = [s(0, 0, 10), s(0, 100, 10)];
        let b = [s(0, 0, 10)];
        let c = [s(0, 0, 10), s(0, 100, 11)];
        assert_eq!(LayerWindows::plan(&[]), Err(WindowError::Empty));
        assert_eq!(LayerWindows::plan(&[&[]]), Err(WindowError::Empty));
        assert!(matches!(
            LayerWindows::plan(&[&a, &b]),
            Err(WindowError::RoleCount {
                expert: 1,
                got: 1,
                want: 2
            })
        ));
        let err = LayerWindows::plan(&[&a, &c]).unwrap_err();
        assert!(err.to_string().contains("slice 1 of expert 1"), "{err}");
        assert_eq!(
            LayerWindows::plan(&[&[s(0, 4000, u64::MAX - 50)]]),
            Err(WindowError::TooLarge)
        );
        // A slice that ends past 2^64 is refused, not a panic.
        assert_eq!(
            LayerWindows::plan(&[&[s(0, 100, u64::MAX - 50), s(0, 50, 1)]]),
            Err(WindowError::TooLarge)
        );
        // Where a slice sits does not size the slot; its head and length do.
        let far = LayerWindows::plan(&[&[s(0, u64::MAX - 10, 10)]]).unwrap();
        assert_eq!((far.offsets(), far.slot_bytes()), (&[4085][..], IO_ALIGN));
    }

    proptest! {
        /// Any layer: reads aligned and inside the slot, every payload at
        /// the layer's offset for every expert, the slot no larger than
        /// the windows need.
        #[test]
        fn every_expert_lands_at_the_layers_offsets(
            lens in prop::collection::vec(1u64..9000, 1..4),
            n in 1usize..5,
            bases in prop::collection::vec(0u64..50_000, 4),
            strides in prop::collection::vec(prop_oneof![Just(IO_ALIGN * 3), 1u64..30_000], 4),
            files in prop::collection::vec(0usize..2, 4),
            per_expert_file in any::<bool>(),
        ) {
            let roles = lens.len();
            // A stacked tensor's stride is the expert's slice or more; a
            // block stride (3 × 4096) lands in place, others are moved.
            let experts: Vec<Vec<Slice>> = (0..n as u64)
                .map(|e| {
                    (0..roles)
                        .map(|r| {
                            let len = lens[r].min(strides[r]);
                            // Shards: an expert's slices need not share
                            // the first expert's files.
                            let file = if per_expert_file {
                                (files[r] + e as usize) % 2
                            } else {
                                files[r]
                            };
                            s(file, bases[r] + e * strides[r], len)
                        })
                        .collect()
                })
                .collect();
            let refs: Vec<&[Slice]> = experts.iter().map(Vec::as_slice).collect();
            let w = LayerWindows::plan(&refs).unwrap();
            let size = 50_000 + 5 * 40_000 + 10_000;
            let data: Vec<Vec<u8>> = (0..2u32)
                .map(|f| (0..size as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> (8 + f)) as u8).collect())
                .collect();
            let reads: usize = roles;
            prop_assert!(w.reads_per_expert() <= reads);
            check(&w, &experts, &data);
        }
    }
}
