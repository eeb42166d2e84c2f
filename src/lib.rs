//! smoe streams Mixture-of-Experts expert weights from an SSD into a
//! pre-allocated ring of aligned memory slots, so an inference engine can run
//! a model far larger than RAM.
//!
//! Layers, from the bottom:
//! - `config`: each setting and counter declared once; the streamer, the
//!   ring sizing and the C API all build on it, and it imports none of them.
//! - [`vault`]: the on-disk format (`experts.smoe`), its validating reader and
//!   its streaming writer. Pure Rust, no platform calls.
//! - `sys`: every platform call (direct-I/O open, positional reads, aligned
//!   allocation, memory probes), one file for Linux and one for Apple.
//! - `streamer`: the ring, the slot state machine, the queues and the I/O
//!   workers. Knows nothing of C.
//! - `model`: GGUF and safetensors models read from their headers, their
//!   expert tensors found by name, and the vault a packer makes of them
//!   planned. Knows nothing of C either. The safetensors side (and the JSON
//!   parser it needs, serde_json) is the default feature `safetensors`; a
//!   host that reads only GGUF turns it off.
//! - `ffi`: the C API. Converts pointers and errors, catches panics; no logic.
//!
//! The Rust API is what a host uses: [`Streamer`] and its types at the crate
//! root (with [`RingPlan`], what [`Streamer::plan`] returns), [`streamer`]'s
//! constants, [`vault`] (reader, writer, [`vault::synth`] for synthetic
//! vaults) and [`ffi`]. The model readers, the ring sizing, the histogram,
//! file safety, the queue, the router and `sys` are private; `internals`
//! (hidden) lends the `smoe` tool, the packer (`smoe-pack`), the benchmarks
//! and the tests what they need of them, with no stability promise. The
//! packer, which writes vaults and scouts of the models `model` reads, is a
//! crate of its own (`pack/`), so a host never compiles it.
//!
//! The formats (vault bytes, metadata, histogram file, routing traces) are
//! described in the repository's `docs/format.md`, the C API's rules in
//! `docs/c-api.md`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// Under loom only the lock-free core (queue, slot table) is built into
// models; the streamer that uses the rest is left out, so the rest is unused.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

// The public API: what a Rust host uses. Everything else is crate-private;
// the `smoe` tool, the benchmarks and the tests reach the few pieces they
// need through [`internals`].
#[cfg(not(loom))]
pub mod ffi;
pub mod streamer;
pub mod vault;

mod budget;
mod config;
mod error;
mod fs_safe;
mod limits;
mod model;
mod popularity;
mod printable;
mod queue;
mod router;
mod sync;
mod sys;
mod tier;
mod trace;
mod try_alloc;

pub use budget::{PlanSources, RingPlan, SlotClamp};
pub use error::{Error, ErrorKind, Result};
#[cfg(not(loom))]
pub use streamer::{Claim, Config, Policy, Populate, Priority, SlotInfo, Stats, Streamer};
pub use sys::DirectIo;

/// For the `smoe` command-line tool (`cli/`), the packer (`pack/`, package
/// `smoe-pack`), the benchmarks and the integration tests; no stability
/// promise: anything here may change or go in any release, and a host must
/// not use it. Both crates pin this library's exact version for that reason.
///
/// What a host needs is at the crate root, in [`streamer`], in [`vault`] and
/// in the C API. This module lends the tool and the tests the pieces under
/// it: the ring sizing a `smoe budget` prints, the histogram file, file
/// safety (for the tool's own files and the packer's), the model readers
/// the packer opens and plans through, the synthetic router and trace
/// parser of `smoe bench`, the platform calls of `smoe verify` and the
/// packer, and the queue for its benchmark.
#[doc(hidden)]
pub mod internals {
    /// Ring sizing (docs/c-api.md, "Ring sizing") from fixed inputs: `smoe budget`, and the
    /// tests of every clamp. The plan itself is [`crate::RingPlan`].
    pub mod budget {
        pub use crate::budget::{
            check_fits, plan_for, plan_ring, BudgetConfig, LargestBlob, VaultShape,
        };
        /// The elastic ring's watermarks and least slot count, for `smoe
        /// budget`'s account of how the ring behaves under pressure.
        #[cfg(not(loom))]
        pub use crate::streamer::elastic::{
            watermarks as elastic_watermarks, MIN_ACTIVE_SLOTS as ELASTIC_MIN_ACTIVE_SLOTS,
        };
    }

    /// The device tier's rule (`src/tier/`): which experts a host keeps in
    /// device slots, for `smoe bench --sweep`'s simulation now and a C API
    /// once the llama.cpp glue computes from VRAM (issue 50).
    pub mod tier {
        pub use crate::tier::{DeviceTier, Promotion, TierError, TierStats};
    }

    /// The claim histogram and its file (docs/format.md §4).
    pub mod popularity {
        pub use crate::popularity::{
            encode, file_bytes, load, save, Histogram, LoadOutcome, Persistence,
        };
    }

    /// Replacing only one's own file, as the histogram and the trace do
    /// (judge what is at the path, save atomically, remove killed writers'
    /// temporary files; `src/fs_safe.rs`), the free-space check before a
    /// vault is written, and opening only a regular file,
    /// never blocking: for the files the tool reads and writes itself
    /// (`smoe bench --plot`, the mmap baseline) and the packer's (its
    /// inputs' identities, its vault directory's files, its renames).
    pub mod files {
        pub use crate::fs_safe::{
            check_free_space, examine_file, file_id, is_temp_file_name, judge_target,
            remove_leftover_temp_files, same_file, save_checked, sync_dir, vault_file_key, FileId,
            Found, Target,
        };
        pub use crate::sys::{open_regular, FileKind, OpenRegularError};
    }

    /// GGUF and safetensors models read from their headers (`src/model/`):
    /// the packer opens a model, checks and plans it here, and only writes.
    /// Private to the library's API because an in-place open is to grow
    /// these types (slot offsets, a model's identity) and they promise
    /// nothing yet. `json` (and safetensors) only with the `safetensors`
    /// feature.
    pub mod model {
        #[cfg(feature = "safetensors")]
        pub use crate::model::json;
        pub use crate::model::{
            check_no_overlap, interrupted, open_model, plan, Cancel, ExpertTensor, LayerPlan,
            LayoutItem, Model, Slice, SourceKind, Tensor, ITEM_ALIGNMENT,
        };
        pub use crate::model::{gguf, identity, meta, names, window};

        /// [`crate::vault::Vault::open`] of the model at `path` (a GGUF or
        /// safetensors model, opened in place), calling `after_headers`
        /// once every header is read and planned, before the model's files
        /// are recorded: the tests' seam for a file changed while it is
        /// being opened.
        pub fn open_in_place_observed(
            path: &std::path::Path,
            after_headers: &dyn Fn(),
        ) -> crate::Result<crate::vault::Vault> {
            crate::vault::Vault::open_model_observed(path, after_headers)
        }
    }

    /// Text from files made safe to print (`src/printable.rs`): the
    /// tool's error and warning lines and `smoe inspect` show names from a
    /// model through it.
    pub mod printable {
        pub use crate::printable::{escape, escape_json_text, Printable, PrintablePath};
    }

    /// The synthetic router of `smoe demo`/`smoe bench`, and (also under
    /// [`trace`]) the routing-trace parser.
    pub mod router {
        pub use crate::router::{Rng, RouterConfig, SyntheticRouter};
        pub use crate::trace::{parse_trace, trace_tokens, TraceRow, TraceTokens};
    }

    /// The routing-trace reader of `smoe bench --trace` (docs/format.md §5).
    pub mod trace {
        pub use crate::trace::{
            parse_trace, read_trace_file, read_trace_tokens, trace_tokens, TraceReader, TraceRow,
            TraceTokens, MAX_TRACE_LINE_BYTES,
        };
    }

    /// Platform calls: the direct-I/O open with its buffered fallback, the
    /// `pread` loop and the aligned buffer `smoe verify` reads through, the
    /// ring's kind of reserved mapping (for the first-pass benchmark), page
    /// cache and disk space probes, whether a process exists (the packer's
    /// leftovers), and the memory snapshot ring sizing starts from.
    pub mod sys {
        pub use crate::sys::{
            drop_file_cache, free_bytes, memory_snapshot, open_for_streaming, page_cache_bytes,
            probe_direct_read, process_exists, read_at_exact, AlignedBuffer, MemorySnapshot,
            OpenedFile, ReadError, Reservation,
        };
    }

    /// The bounded MPMC queue, for its benchmark against crossbeam's.
    pub use crate::queue::Queue;
}
