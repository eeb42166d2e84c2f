//! The limits every reader and writer of the crate shares: how many
//! expert ids a vault or a model may have, and how many bytes of metadata
//! one may hold (SPEC §1; docs/limits.md). Below the vault and the model
//! readers alike, and importing nothing of the crate, so both use them
//! without either importing the other.

/// This reader's limit on `n_layers × n_experts`: 2^20 = 1,048,576 ids.
/// Some costs follow the id space, not the entries: the dense expert index
/// (4 bytes per id), the streamer's identity map (9 bytes per id) and the
/// histogram file (8 bytes per id, docs/format.md §4; in memory the histogram keeps
/// one counter per entry). At 2^20 they stay near 13 MiB and an 8 MiB
/// histogram file; at 2^24 a one-entry vault would cost 210 MiB at open and
/// a 134 MB file write at every close. Real
/// models are far below it (Qwen3-235B: 94 × 128 = 12,032 ids; DeepSeek-V3:
/// 61 × 256 = 15,616). Ticket slot fields are 20 bits for the same reason:
/// a ring never has more slots than the vault has entries.
pub const MAX_EXPERT_IDS: u64 = 1 << 20;
/// This reader's limit on `meta_bytes`: 64 MiB. The metadata is held in
/// memory for the streamer's life (one copy, handed to C as is), so a hostile
/// header must not make `open` read and keep gigabytes; real metadata (the
/// keys of docs/format.md §3, a layout per layer) is kilobytes.
pub const MAX_META_BYTES: u64 = 64 << 20;
