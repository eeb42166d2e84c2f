//! What `smoe bench` measured, as typed results: `--json` serializes them
//! and the text output is written from the same structs, so the two always
//! say the same thing, and a misspelled field is a compile error rather
//! than a key that reads back as 0. A capped run's child side prints a
//! [`SideReport`] that the parent reads back with the same types.

use serde::{Deserialize, Serialize, Serializer};

use crate::output::{gb_per_s, human_bytes};
use crate::replay::{mean_p99, waits_ms, WorkingSet};
use crate::stream::DecodeReport;

/// Rounds to 3 decimals when serialized (milliseconds: microseconds).
fn round3<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((x * 1e3).round() / 1e3)
}

/// Rounds to 4 decimals when serialized (rates: a hundredth of a percent).
fn round4<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((x * 1e4).round() / 1e4)
}

/// [`round4`] of an optional value.
fn round4_opt<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(x) => round4(x, s),
        None => s.serialize_none(),
    }
}

/// Which kind of run a result is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunMode {
    /// `--mode scan`.
    Scan,
    /// A decode: synthetic, or a trace replay.
    Decode,
    /// `--sweep`: simulated only.
    Sweep,
}

/// Where the top-k of a run came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopKFrom {
    /// `--top-k`.
    Flag,
    /// The vault's metadata, `top_k`.
    Metadata,
    /// Neither: 8, or the vault's n_experts when fewer.
    Default,
    /// The ranks of the trace replayed, fewer than the metadata's or the
    /// default top-k.
    Trace,
}

/// The experts a token claims per layer, and where that number came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopK {
    /// The number.
    pub value: u32,
    /// Its source.
    pub from: TopKFrom,
}

impl TopK {
    /// "top-2 (from the vault's metadata)".
    pub fn text(self) -> String {
        let from = match self.from {
            TopKFrom::Flag => "from --top-k",
            TopKFrom::Metadata => "from the vault's metadata",
            TopKFrom::Default => "the default: the vault's metadata has no top_k",
            TopKFrom::Trace => "all the trace's ranks, fewer than the metadata's or default top-k",
        };
        format!("top-{} ({from})", self.value)
    }
}

/// `smoe bench --mode scan`.
#[derive(Debug, Serialize)]
pub struct ScanResult {
    /// Always [`RunMode::Scan`].
    pub mode: RunMode,
    /// Experts claimed, each once.
    pub experts: u64,
    /// Bytes the workers read.
    pub bytes_read: u64,
    /// Payload bytes moved inside slots after the reads (a model opened in
    /// place whose slices do not all sit alike in their blocks; 0 for a
    /// vault).
    pub bytes_moved: u64,
    /// Wall time of the scan.
    pub seconds: f64,
    /// Decimal GB per second.
    #[serde(serialize_with = "round4")]
    pub gb_per_s: f64,
    /// I/O workers.
    pub workers: u64,
    /// Ring slots.
    pub ring_slots: u64,
    /// Bytes per slot.
    pub slot_bytes: u64,
    /// 1 when every read was direct I/O.
    pub direct_io: u64,
}

impl ScanResult {
    /// The one line of text.
    pub fn text(&self) -> String {
        format!(
            "scan: {} experts, {}{} in {:.2} s = {} with {} workers, {} ({} slots of {})\n",
            self.experts,
            human_bytes(self.bytes_read),
            moved(self.bytes_moved),
            self.seconds,
            gb_per_s(self.bytes_read, self.seconds),
            self.workers,
            io_name(self.direct_io),
            self.ring_slots,
            human_bytes(self.slot_bytes)
        )
    }
}

/// ", 12.00 KiB moved in slots", or nothing when no byte was moved.
fn moved(bytes_moved: u64) -> String {
    if bytes_moved == 0 {
        String::new()
    } else {
        format!(" ({} moved in slots)", human_bytes(bytes_moved))
    }
}

fn io_name(direct_io: u64) -> &'static str {
    if direct_io == 1 {
        "direct I/O"
    } else {
        "buffered I/O"
    }
}

/// A decode, synthetic or replayed: what the streamer measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DecodeResult {
    /// Always [`RunMode::Decode`].
    pub mode: RunMode,
    /// Tokens decoded.
    pub tokens: u64,
    /// Claims made.
    pub claims: u64,
    /// Claims that found their expert resident.
    pub hits: u64,
    /// hits / claims.
    #[serde(serialize_with = "round4")]
    pub coverage: f64,
    /// Bytes the workers read.
    pub bytes_read: u64,
    /// Payload bytes moved inside slots after the reads (0 for a vault).
    pub bytes_moved: u64,
    /// Wall time of the decode loop.
    pub seconds: f64,
    /// Decimal GB per second.
    #[serde(serialize_with = "round4")]
    pub gb_per_s: f64,
    /// Mean wait per token, ms.
    #[serde(serialize_with = "round3")]
    pub wait_mean_ms: f64,
    /// 99th-percentile wait per token, ms.
    #[serde(serialize_with = "round3")]
    pub wait_p99_ms: f64,
    /// Ring slots.
    pub ring_slots: u64,
    /// Bytes per slot.
    pub slot_bytes: u64,
    /// `ring_slots × slot_bytes`.
    pub ring_bytes: u64,
    /// Experts in the vault.
    pub experts: u64,
    /// 1 when every read was direct I/O.
    pub direct_io: u64,
    /// The eviction policy.
    pub policy: String,
    /// Experts claimed per layer.
    pub top_k: u32,
    /// Where `top_k` came from.
    pub top_k_from: TopKFrom,
    /// One token's working set.
    pub working_set: WorkingSet,
    /// What the reader should know about this run (the text's `note:`
    /// lines).
    pub notes: Vec<String>,
}

impl DecodeResult {
    /// The first line of text.
    pub fn headline(&self) -> String {
        let top_k = TopK {
            value: self.top_k,
            from: self.top_k_from,
        };
        format!(
            "decode: {} tokens × {} MoE layers × {}, {} policy, coverage {:.1}%, read {}{} in {:.2} s = {}, wait per token mean {:.2} ms p99 {:.2} ms ({} slots)\n",
            self.tokens,
            self.working_set.layers,
            top_k.text(),
            self.policy,
            self.coverage * 100.0,
            human_bytes(self.bytes_read),
            moved(self.bytes_moved),
            self.seconds,
            gb_per_s(self.bytes_read, self.seconds),
            self.wait_mean_ms,
            self.wait_p99_ms,
            self.ring_slots
        )
    }

    /// The headline and the notes: a synthetic decode's text.
    pub fn text(&self) -> String {
        let mut text = self.headline();
        push_notes(&mut text, &self.notes);
        text
    }
}

fn push_notes(text: &mut String, notes: &[String]) {
    for note in notes {
        text.push_str(&format!("note: {note}\n"));
    }
}

impl DecodeResult {
    /// The report of `side`'s decode of a vault of `experts` experts under
    /// `policy`, `top_k` experts per layer, `working_set` the experts a
    /// token claims (for the ring's notes).
    pub fn of_side(
        side: &SmoeSide,
        experts: u64,
        policy: &str,
        top_k: TopK,
        working_set: WorkingSet,
    ) -> DecodeResult {
        let (mean, p99) = mean_p99(&side.waits_ms);
        DecodeResult {
            mode: RunMode::Decode,
            tokens: side.tokens,
            claims: side.claims,
            hits: side.hits,
            coverage: side.hits as f64 / side.claims.max(1) as f64,
            bytes_read: side.bytes_read,
            bytes_moved: side.bytes_moved,
            seconds: side.seconds,
            gb_per_s: side.bytes_read as f64 / side.seconds.max(1e-9) / 1e9,
            wait_mean_ms: mean,
            wait_p99_ms: p99,
            ring_slots: side.ring_slots,
            slot_bytes: side.slot_bytes,
            ring_bytes: side.ring_slots * side.slot_bytes,
            experts,
            direct_io: side.direct_io,
            policy: policy.to_owned(),
            top_k: top_k.value,
            top_k_from: top_k.from,
            working_set,
            notes: ring_notes(side.ring_slots, experts, working_set, policy),
        }
    }
}

/// What a ring of `ring_slots` cannot show, or shows badly, in one line
/// each: a ring that holds every expert (coverage is then only the cold
/// start), and a ring smaller than one token's working set (LRU's worst
/// case).
pub fn ring_notes(
    ring_slots: u64,
    experts: u64,
    working_set: WorkingSet,
    policy: &str,
) -> Vec<String> {
    let mut notes = Vec::new();
    let ws = working_set.experts();
    if experts > 1 && ring_slots >= experts {
        let suggest = (experts / 4)
            .max(ws)
            .max(u64::from(working_set.top_k))
            .min(experts - 1)
            .max(1);
        notes.push(format!(
            "the ring's {ring_slots} slots hold all {experts} experts of the vault: after each expert's \
             first read every claim hits, so coverage measures only the cold start; \
             --ring-slots {suggest} ({:.0}% of the experts) measures a ring that must evict",
            100.0 * suggest as f64 / experts as f64
        ));
    } else if ring_slots < ws {
        let policy_note = if policy == "lru" {
            "LRU evicts each expert before the next token needs it again (its worst case); \
             --policy adaptive keeps part of the working set"
        } else {
            "LRU would evict each expert before the next token needs it again; the adaptive \
             policy keeps part of the working set"
        };
        notes.push(format!(
            "the ring's {ring_slots} slots are fewer than one token's working set \
             ({working_set}): {policy_note}, and --ring-slots {} or more holds all of it",
            ws.min(experts)
        ));
    }
    notes
}

/// The simulated policies at the ring size of a replay.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SimRates {
    /// Exact LRU's hit rate.
    #[serde(serialize_with = "round4")]
    pub lru: f64,
    /// Belady's optimum.
    #[serde(serialize_with = "round4")]
    pub belady: f64,
}

/// The mmap side of a comparison.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BaselineResult {
    /// Always "mmap".
    pub kind: String,
    /// Mean wait per token, ms.
    #[serde(serialize_with = "round3")]
    pub wait_mean_ms: f64,
    /// 99th-percentile wait per token, ms.
    #[serde(serialize_with = "round3")]
    pub wait_p99_ms: f64,
    /// Wall time of the replay.
    pub seconds: f64,
    /// The vault file's bytes: all of it may sit in the page cache when
    /// memory is not capped.
    pub vault_bytes: u64,
    /// Whether both sides had the same memory (a cap enforced on each).
    pub like_for_like: bool,
}

/// `smoe bench --trace`: the replay, its simulation and its comparison.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TraceResult {
    /// What the streamer measured.
    #[serde(flatten)]
    pub decode: DecodeResult,
    /// `--mem-cap` in bytes, if given.
    pub mem_cap_bytes: Option<u64>,
    /// How the cap was enforced: "cgroup v1", "cgroup v2" or "none".
    pub isolation: String,
    /// The simulated policies at this ring size.
    pub sim: SimRates,
    /// The mmap side, with `--baseline mmap`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub baseline: Option<BaselineResult>,
    /// smoe's mean wait over mmap's, with `--baseline mmap`.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "round4_opt",
        default
    )]
    pub ratio: Option<f64>,
}

impl TraceResult {
    /// The text: headline, the side-by-side table, the ratio, memory, notes.
    /// `mem_cap` is `--mem-cap` as written.
    pub fn text(&self, mem_cap: Option<&str>) -> String {
        let d = &self.decode;
        let mut text = d.headline();
        text.push_str(&format!(
            "{:<8} {:>16} {:>12} {:>10}\n{:<8} {:>13.2} ms {:>9.2} ms {:>9.1}%\n",
            "",
            "wait/token mean",
            "p99",
            "hit rate",
            "smoe",
            d.wait_mean_ms,
            d.wait_p99_ms,
            d.coverage * 100.0
        ));
        if let Some(b) = &self.baseline {
            text.push_str(&format!(
                "{:<8} {:>13.2} ms {:>9.2} ms {:>10}\n",
                "mmap", b.wait_mean_ms, b.wait_p99_ms, "-"
            ));
        }
        text.push_str(&format!(
            "{:<8} {:>16} {:>12} {:>9.1}%  (simulated; exact LRU {:.1}%)\n",
            "Belady",
            "-",
            "-",
            self.sim.belady * 100.0,
            self.sim.lru * 100.0
        ));
        if let (Some(b), Some(ratio)) = (&self.baseline, self.ratio) {
            if b.like_for_like {
                text.push_str(&format!("smoe/mmap wait ratio {ratio:.2}\n"));
            } else {
                text.push_str(&format!(
                    "smoe/mmap wait ratio {ratio:.2}, not like for like: mmap could keep the whole \
                     vault ({}) in the page cache, smoe held {} slots ({}); --mem-cap SIZE (root) \
                     gives each side the same memory\n",
                    human_bytes(b.vault_bytes),
                    d.ring_slots,
                    human_bytes(d.ring_bytes)
                ));
            }
        }
        text.push_str(&match (mem_cap, self.isolation.as_str()) {
            (Some(cap), "none") => {
                format!("memory: uncapped, warm page cache (--mem-cap {cap} not enforced)\n")
            }
            (Some(cap), name) => format!(
                "memory: each side in a memory cgroup of its own ({name}) capped at {} (--mem-cap {cap}), page cache dropped before each\n",
                human_bytes(self.mem_cap_bytes.unwrap_or_default())
            ),
            (None, _) => "memory: uncapped\n".to_string(),
        });
        push_notes(&mut text, &d.notes);
        text
    }
}

/// One ring size of a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SweepRow {
    /// Ring slots.
    pub ring_slots: u32,
    /// Exact LRU's hit rate.
    #[serde(serialize_with = "round4")]
    pub lru: f64,
    /// Belady's optimum.
    #[serde(serialize_with = "round4")]
    pub belady: f64,
    /// The device tier's rule (admission by use count, copies completing
    /// between tokens; `src/tier/`) with as many device slots.
    #[serde(serialize_with = "round4")]
    pub device_tier: f64,
}

/// `smoe bench --trace --sweep`.
#[derive(Debug, Serialize)]
pub struct SweepResult {
    /// Always [`RunMode::Sweep`].
    pub mode: RunMode,
    /// Tokens of the trace.
    pub tokens: u64,
    /// Demand claims simulated.
    pub claims: u64,
    /// Experts in the vault.
    pub experts: u32,
    /// The policy the command line named (the sweep simulates LRU, Belady
    /// and the device tier whatever it is).
    pub policy: String,
    /// Experts claimed per layer.
    pub top_k: u32,
    /// Where `top_k` came from.
    pub top_k_from: TopKFrom,
    /// One token's working set.
    pub working_set: WorkingSet,
    /// Per ring size, ascending.
    pub rows: Vec<SweepRow>,
}

impl SweepResult {
    /// The header and the table; a row below one token's working set is
    /// marked.
    pub fn text(&self) -> String {
        let top_k = TopK {
            value: self.top_k,
            from: self.top_k_from,
        };
        let mut text = format!(
            "sweep: {} tokens, {} demand claims at {} over {} experts, simulated; one token's working set: {}\n{:>8} {:>9} {:>8} {:>8} {:>8}\n",
            self.tokens,
            self.claims,
            top_k.text(),
            self.experts,
            self.working_set,
            "slots",
            "% experts",
            "LRU",
            "Belady",
            "tier"
        );
        let ws = self.working_set.experts();
        for r in &self.rows {
            let mark = if u64::from(r.ring_slots) < ws {
                "  < one token's working set"
            } else {
                ""
            };
            text.push_str(&format!(
                "{:>8} {:>8.1}% {:>7.1}% {:>7.1}% {:>7.1}%{mark}\n",
                r.ring_slots,
                100.0 * f64::from(r.ring_slots) / f64::from(self.experts.max(1)),
                r.lru * 100.0,
                r.belady * 100.0,
                r.device_tier * 100.0
            ));
        }
        text
    }
}

/// The smoe side of a replay, as a capped run's child prints it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SmoeSide {
    /// Tokens decoded.
    pub tokens: u64,
    /// Claims made.
    pub claims: u64,
    /// Claims that hit.
    pub hits: u64,
    /// Bytes the workers read.
    pub bytes_read: u64,
    /// Payload bytes moved inside slots after the reads.
    pub bytes_moved: u64,
    /// Wall time of the decode loop.
    pub seconds: f64,
    /// Ring slots.
    pub ring_slots: u64,
    /// Bytes per slot.
    pub slot_bytes: u64,
    /// 1 when every read was direct I/O.
    pub direct_io: u64,
    /// Per-token waits, ms.
    pub waits_ms: Vec<f64>,
}

impl SmoeSide {
    /// The measurements of a decode run (a synthetic decode, or a
    /// replay's smoe side).
    pub fn of_decode(r: &DecodeReport) -> SmoeSide {
        let st = &r.stats;
        SmoeSide {
            tokens: u64::from(r.tokens),
            claims: st.claims,
            hits: st.hits,
            bytes_read: st.bytes_read,
            bytes_moved: st.bytes_moved,
            seconds: r.seconds,
            ring_slots: st.ring_slots,
            slot_bytes: st.slot_bytes,
            direct_io: st.direct_io,
            waits_ms: waits_ms(&r.waits),
        }
    }
}

/// The mmap side of a replay, as a capped run's child prints it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MmapSide {
    /// Wall time of the replay.
    pub seconds: f64,
    /// Per-token waits, ms.
    pub waits_ms: Vec<f64>,
}

/// What one side of a comparison measured (`--side`'s JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "side", rename_all = "lowercase")]
pub enum SideReport {
    /// The streamer.
    Smoe(SmoeSide),
    /// The mmap baseline.
    Mmap(MmapSide),
}

#[cfg(test)]
mod tests {
    use super::*;

    const WS: WorkingSet = WorkingSet {
        layers: 32,
        top_k: 2,
    };

    #[test]
    fn notes_for_a_ring_of_every_expert_and_one_below_a_token() {
        let all = ring_notes(256, 256, WS, "lru");
        assert_eq!(all.len(), 1);
        assert!(all[0].contains("hold all 256 experts") && all[0].contains("--ring-slots 64 (25%"));
        let small = ring_notes(40, 256, WS, "lru");
        assert!(small[0]
            .contains("fewer than one token's working set (32 layers × top-2 = 64 experts)"));
        assert!(small[0].contains("--policy adaptive"));
        let small = ring_notes(40, 256, WS, "adaptive");
        assert!(!small[0].contains("--policy adaptive"), "{}", small[0]);
        assert!(ring_notes(64, 256, WS, "lru").is_empty());
        assert!(ring_notes(1, 1, WS, "lru").len() <= 1);
    }

    #[test]
    fn side_reports_read_back() {
        let side = SideReport::Mmap(MmapSide {
            seconds: 1.5,
            waits_ms: vec![1.0, 2.0],
        });
        let json = serde_json::to_string(&side).unwrap();
        assert_eq!(
            json,
            r#"{"side":"mmap","seconds":1.5,"waits_ms":[1.0,2.0]}"#
        );
        assert!(matches!(
            serde_json::from_str::<SideReport>(&json).unwrap(),
            SideReport::Mmap(MmapSide { seconds, .. }) if seconds == 1.5
        ));
        // A missing field is an error, not a zero.
        assert!(serde_json::from_str::<SideReport>(r#"{"side":"mmap","seconds":1.5}"#).is_err());
    }
}
