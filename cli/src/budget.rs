//! `smoe budget`: how the ring would be sized on this machine (docs/c-api.md, "Ring sizing"),
//! with every input, every intermediate value and where each input came
//! from, for people or (with `--json`) for programs.
//!
//! The sizing is `smoe::internals::budget`; this file only parses and prints.

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;
use smoe::internals::budget::{
    elastic_watermarks, plan_for, BudgetConfig, ELASTIC_MIN_ACTIVE_SLOTS,
};
use smoe::vault::Vault;
use smoe::RingPlan;

use crate::flags::{self, Size};
use crate::output::{human_bytes, out, warning_line, Failure};

/// Arguments of `smoe budget`.
#[derive(Debug, Args)]
pub struct BudgetArgs {
    /// The vault (its directory or experts.smoe), or a model opened in
    /// place: a GGUF file (the first part of a split one), a safetensors
    /// file, a model directory or its model.safetensors.index.json.
    pub vault: PathBuf,
    /// Print one JSON object instead of the human summary.
    #[arg(long)]
    pub json: bool,
    /// Slot size in MiB (or a size with a unit, a whole number of MiB:
    /// 64M, 1G); 0 = the largest padded blob, else at least that blob.
    #[arg(long, value_name = "MIB", default_value_t = 0, allow_negative_numbers = true,
          value_parser = flags::mebibytes)]
    pub slot_mb: u32,
    /// Dense weights the engine keeps resident (10G, 1.5GiB or bytes)
    /// [default: the size of the vault's scout.* files; a model's
    /// non-expert tensors].
    #[arg(long, value_name = "SIZE", allow_negative_numbers = true, value_parser = flags::size)]
    pub scout_bytes: Option<Size>,
    /// Memory the engine needs besides the ring and the scout (2G, 512MiB
    /// or bytes); 0 = 2 GiB.
    #[arg(long, value_name = "SIZE", default_value = "0", allow_negative_numbers = true,
          value_parser = flags::size)]
    pub overhead_bytes: Size,
    /// Plan a fixed ring (`elastic` off) instead of the default elastic one.
    #[arg(long)]
    pub no_elastic: bool,
    /// Plan a ring the host pins for a device (config `pinned`, as for
    /// `cudaHostRegister`): never elastic, every page committed after
    /// open, so it must fit in 7/8 of the memory that can be committed.
    #[arg(long)]
    pub pinned: bool,
}

/// Runs `smoe budget`: opens (and so validates) the vault, probes memory and
/// prints the plan.
pub fn run(args: &BudgetArgs) -> Result<(), Failure> {
    let vault = Vault::open(&args.vault)?;
    let config = BudgetConfig {
        ring_slots: 0,
        slot_mb: args.slot_mb,
        scout_bytes: args.scout_bytes.as_ref().map(|s| s.bytes),
        engine_overhead_bytes: args.overhead_bytes.bytes,
        elastic: !args.no_elastic,
        pinned: args.pinned,
        ..BudgetConfig::default()
    };
    let mut plan = Plan::new(&vault, &plan_for(&vault, &config)?);
    plan.model = vault.model().map(|m| ModelFacts {
        kind: m.kind().name(),
        given: args.vault.display().to_string(),
        files: m
            .files()
            .iter()
            .map(|f| f.path.display().to_string())
            .collect(),
    });
    if let Some(warning) = &plan.warning {
        warning_line(warning);
    }
    if args.json {
        let text = serde_json::to_string_pretty(&plan)
            .map_err(|e| Failure::Message(format!("cannot encode the plan as JSON: {e}")))?;
        out(&(text + "\n"))
    } else {
        out(&plan.text())
    }
}

/// Where each input came from, in words.
#[derive(Debug, Serialize)]
struct Sources {
    avail: String,
    ram: String,
    scout: String,
    overhead: String,
    slot: String,
    slots: String,
    committable: String,
}

/// A model opened in place (SPEC §6): what it is and where its experts are.
#[derive(Debug, Serialize)]
struct ModelFacts {
    /// "gguf" or "safetensors".
    kind: &'static str,
    /// The path as given.
    given: String,
    /// Its files, in order (split parts, shards).
    files: Vec<String>,
}

/// How an elastic ring gives memory back (docs/c-api.md, "Elastic ring").
#[derive(Debug, Serialize)]
struct Elastic {
    /// Below this much committable memory, idle slots go offline.
    low_watermark_bytes: u64,
    /// ... until this much is free again.
    high_watermark_bytes: u64,
    /// The slots that always stay online.
    min_active_slots: u32,
}

/// Everything `smoe budget` says, once: `--json` prints it, the text is
/// written from it, so each fact of the text is in the JSON.
#[derive(Debug, Serialize)]
struct Plan {
    vault: String,
    /// A model opened in place; absent for a vault.
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<ModelFacts>,
    entries: u32,
    avail_bytes: u64,
    ram_bytes: u64,
    scout_bytes: u64,
    engine_overhead_bytes: u64,
    floor_bytes: u64,
    /// How the floor was computed.
    floor_rule: &'static str,
    /// `ram_bytes` is a cgroup's limit.
    cgroup_limited: bool,
    subtractive_budget_bytes: u64,
    quarter_avail_bytes: u64,
    budget_bytes: u64,
    /// Which of the two the budget is: "subtractive" or "avail / 4".
    budget_from: &'static str,
    slot_bytes: u64,
    /// Slots the budget holds, before any clamp.
    budget_slots: u64,
    slots: u32,
    /// Which bound changed the slot count, if any.
    slot_clamp: String,
    ring_bytes: u64,
    /// When the ring's pages are committed: as slots are first loaded, or
    /// all of them at open (pinned, locked, populated and fixed).
    commit: String,
    /// Memory that pages committed now would get (the cgroup's file cache
    /// counted as free); a ring committed at open takes at most 7/8 of it.
    committable_bytes: u64,
    /// The elastic ring's plan; null for a fixed ring.
    elastic: Option<Elastic>,
    /// How the ring behaves under memory pressure, in one sentence.
    under_pressure: String,
    /// Fewer than the automatic minimum of 64 slots fit: why (also printed
    /// on stderr).
    warning: Option<String>,
    sources: Sources,
}

impl Plan {
    fn new(vault: &Vault, plan: &RingPlan) -> Plan {
        let s = &plan.sources;
        let elastic = plan.elastic.then(|| {
            let (low, high) = elastic_watermarks(plan.ram_bytes);
            Elastic {
                low_watermark_bytes: low,
                high_watermark_bytes: high,
                min_active_slots: plan.slots.min(ELASTIC_MIN_ACTIVE_SLOTS),
            }
        });
        let under_pressure = match &elastic {
            None => "fixed ring (elastic off): it keeps every slot; under pressure the OS reclaims or kills"
                .to_owned(),
            Some(e) => format!(
                "elastic: when less than {} can still be committed (of {}; page cache not counted), \
                 idle slots go offline and their pages are released until {} is free again, keeping at \
                 least {} slots; they come back when memory is free again",
                human_bytes(e.low_watermark_bytes),
                human_bytes(plan.ram_bytes),
                human_bytes(e.high_watermark_bytes),
                e.min_active_slots
            ),
        };
        Plan {
            vault: vault.path().display().to_string(),
            model: None,
            entries: plan.n_entries,
            avail_bytes: plan.avail_bytes,
            ram_bytes: plan.ram_bytes,
            scout_bytes: plan.scout_bytes,
            engine_overhead_bytes: plan.engine_overhead_bytes,
            floor_bytes: plan.floor_bytes,
            floor_rule: if plan.elastic && plan.cgroup_limited {
                "ram / 8 (an elastic ring under a cgroup limit: no 4 GiB minimum)"
            } else {
                "max(ram / 8, 4 GiB)"
            },
            cgroup_limited: plan.cgroup_limited,
            subtractive_budget_bytes: plan.subtractive_budget_bytes,
            quarter_avail_bytes: plan.quarter_avail_bytes,
            budget_bytes: plan.budget_bytes,
            budget_from: if plan.subtractive_budget_bytes >= plan.quarter_avail_bytes {
                "subtractive"
            } else {
                "avail / 4"
            },
            slot_bytes: plan.slot_bytes,
            budget_slots: plan.budget_slots,
            slots: plan.slots,
            slot_clamp: plan.clamp.to_string(),
            ring_bytes: plan.ring_bytes,
            commit: plan.commit.to_string(),
            committable_bytes: plan.committable_bytes,
            elastic,
            under_pressure,
            warning: plan.warning(),
            sources: Sources {
                avail: s.avail.clone(),
                ram: s.ram.clone(),
                scout: s.scout.clone(),
                overhead: s.overhead.clone(),
                slot: s.slot.clone(),
                slots: s.slots.clone(),
                committable: s.committable.clone(),
            },
        }
    }

    /// The human summary: one line per fact, each with its rule or source.
    fn text(&self) -> String {
        let s = &self.sources;
        let mut text = String::new();
        let mut line = |key: &str, value: String| {
            text.push_str(&format!("{key:<18}{value}\n"));
        };
        line("vault", self.vault.clone());
        if let Some(m) = &self.model {
            let n = m.files.len();
            line(
                "model",
                format!(
                    "{}: a {} model opened in place, {n} file{} (nothing is written beside it)",
                    m.given,
                    m.kind,
                    if n == 1 { "" } else { "s" }
                ),
            );
        }
        line("entries", self.entries.to_string());
        line(
            "avail",
            format!("{}  from {}", bytes(self.avail_bytes), s.avail),
        );
        line("ram", format!("{}  from {}", bytes(self.ram_bytes), s.ram));
        line(
            "committable",
            format!("{}  from {}", bytes(self.committable_bytes), s.committable),
        );
        line(
            "scout",
            format!("{}  from {}", bytes(self.scout_bytes), s.scout),
        );
        line(
            "engine overhead",
            format!("{}  from {}", bytes(self.engine_overhead_bytes), s.overhead),
        );
        line(
            "floor",
            format!("{}  = {}", bytes(self.floor_bytes), self.floor_rule),
        );
        line(
            "subtractive",
            format!(
                "{}  = avail − scout − overhead − floor, at least 0",
                bytes(self.subtractive_budget_bytes)
            ),
        );
        line(
            "avail / 4",
            format!(
                "{}  (the least the ring gets)",
                bytes(self.quarter_avail_bytes)
            ),
        );
        let chosen = match self.budget_from {
            "subtractive" => "the subtractive budget",
            other => other,
        };
        line(
            "budget",
            format!(
                "{}  = max(subtractive, avail / 4): {chosen}",
                bytes(self.budget_bytes)
            ),
        );
        line(
            "slot",
            format!("{}  from {}", bytes(self.slot_bytes), s.slot),
        );
        line(
            "budget / slot",
            format!("{} slots fit the budget", self.budget_slots),
        );
        line(
            "slots",
            if self.commit == "committed as slots are first loaded" {
                format!(
                    "{}  = clamp(budget / slot, 64, 4096), then at most the {} entries; from {}",
                    self.slots, self.entries, s.slots
                )
            } else {
                format!(
                    "{}  = clamp(budget / slot, 64, 4096), at most min(budget, 7/8 of {}) / slot \
                     (committed at open), then at most the {} entries; from {}",
                    self.slots,
                    bytes(self.committable_bytes),
                    self.entries,
                    s.slots
                )
            },
        );
        line(
            "ring",
            format!("{}  = slots × slot", bytes(self.ring_bytes)),
        );
        line("pages", self.commit.clone());
        line("under pressure", self.under_pressure.clone());
        text
    }
}

/// "N bytes (1.50 GiB)".
fn bytes(n: u64) -> String {
    format!("{n} bytes ({})", human_bytes(n))
}
