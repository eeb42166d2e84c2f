//! `smoe budget`: how the ring would be sized on this machine (docs/c-api.md, "Ring sizing"),
//! with every input, every intermediate value and where each input came
//! from, for people or (with `--json`) for programs.
//!
//! The sizing is `smoe::internals::budget`; this file only parses and prints.

use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value};
use smoe::internals::budget::{plan_for, BudgetConfig};
use smoe::vault::Vault;
use smoe::RingPlan;

use crate::flags;
use crate::output::{human_bytes, out, Failure};

/// Arguments of `smoe budget`.
#[derive(Debug, Args)]
pub struct BudgetArgs {
    /// The vault directory or its experts.smoe.
    pub vault: PathBuf,
    /// Print one JSON object instead of the human summary.
    #[arg(long)]
    pub json: bool,
    /// Slot size in MiB; 0 = the largest padded blob, else at least that
    /// blob (0..=4294967295).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32))]
    pub slot_mb: u32,
    /// Bytes of dense weights the engine keeps resident [default: the size
    /// of the vault's scout.* files] (0..=18446744073709551615).
    #[arg(long, allow_negative_numbers = true, value_parser = flags::whole_u64)]
    pub scout_bytes: Option<u64>,
    /// Memory the engine needs besides the ring and the scout; 0 = 2 GiB
    /// (0..=18446744073709551615).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true,
          value_parser = flags::whole_u64)]
    pub overhead_bytes: u64,
    /// Plan a fixed ring (`elastic` off) instead of the default elastic one.
    #[arg(long)]
    pub no_elastic: bool,
}

/// Runs `smoe budget`: opens (and so validates) the vault, probes memory and
/// prints the plan.
pub fn run(args: &BudgetArgs) -> Result<(), Failure> {
    let vault = Vault::open(&args.vault)?;
    let config = BudgetConfig {
        ring_slots: 0,
        slot_mb: args.slot_mb,
        scout_bytes: args.scout_bytes,
        engine_overhead_bytes: args.overhead_bytes,
        elastic: !args.no_elastic,
    };
    let plan = plan_for(&vault, &config)?;
    if let Some(warning) = plan.warning() {
        eprintln!("smoe: warning: {warning}");
    }
    if args.json {
        let text = serde_json::to_string_pretty(&json_plan(&plan))
            .map_err(|e| Failure::Message(format!("cannot encode the plan as JSON: {e}")))?;
        out(&(text + "\n"))
    } else {
        out(&human_plan(&vault, &plan))
    }
}

/// Exactly the keys the `--json` contract lists, no others.
fn json_plan(plan: &RingPlan) -> Value {
    let s = &plan.sources;
    json!({
        "avail_bytes": plan.avail_bytes,
        "ram_bytes": plan.ram_bytes,
        "scout_bytes": plan.scout_bytes,
        "engine_overhead_bytes": plan.engine_overhead_bytes,
        "floor_bytes": plan.floor_bytes,
        "budget_bytes": plan.budget_bytes,
        "slot_bytes": plan.slot_bytes,
        "slots": plan.slots,
        "sources": {
            "avail": s.avail,
            "ram": s.ram,
            "scout": s.scout,
            "overhead": s.overhead,
            "slot": s.slot,
            "slots": s.slots,
        },
    })
}

/// "N bytes (1.50 GiB)".
fn bytes(n: u64) -> String {
    format!("{n} bytes ({})", human_bytes(n))
}

fn human_plan(vault: &Vault, plan: &RingPlan) -> String {
    let s = &plan.sources;
    let mut text = String::new();
    let mut line = |key: &str, value: String| {
        text.push_str(&format!("{key:<18}{value}\n"));
    };
    line("vault", vault.path().display().to_string());
    line("entries", plan.n_entries.to_string());
    line(
        "avail",
        format!("{}  from {}", bytes(plan.avail_bytes), s.avail),
    );
    line("ram", format!("{}  from {}", bytes(plan.ram_bytes), s.ram));
    line(
        "scout",
        format!("{}  from {}", bytes(plan.scout_bytes), s.scout),
    );
    line(
        "engine overhead",
        format!("{}  from {}", bytes(plan.engine_overhead_bytes), s.overhead),
    );
    let floor_rule = if plan.elastic && plan.cgroup_limited {
        "= ram / 8 (an elastic ring under a cgroup limit: no 4 GiB minimum)"
    } else {
        "= max(ram / 8, 4 GiB)"
    };
    line(
        "floor",
        format!("{}  {floor_rule}", bytes(plan.floor_bytes)),
    );
    line(
        "subtractive",
        format!(
            "{}  = avail − scout − overhead − floor, at least 0",
            bytes(plan.subtractive_budget_bytes)
        ),
    );
    line(
        "avail / 4",
        format!(
            "{}  (the least the ring gets)",
            bytes(plan.quarter_avail_bytes)
        ),
    );
    let chosen = if plan.subtractive_budget_bytes >= plan.quarter_avail_bytes {
        "the subtractive budget"
    } else {
        "avail / 4"
    };
    line(
        "budget",
        format!(
            "{}  = max(subtractive, avail / 4): {chosen}",
            bytes(plan.budget_bytes)
        ),
    );
    line(
        "slot",
        format!("{}  from {}", bytes(plan.slot_bytes), s.slot),
    );
    line(
        "budget / slot",
        format!("{} slots fit the budget", plan.budget_slots),
    );
    line(
        "slots",
        format!(
            "{}  = clamp(budget / slot, 64, 4096), then at most the {} entries; from {}",
            plan.slots, plan.n_entries, s.slots
        ),
    );
    line(
        "ring",
        format!("{}  = slots × slot", bytes(plan.ring_bytes)),
    );
    line("under pressure", pressure_behaviour(plan));
    text
}

/// How the ring will behave when memory runs short, in one sentence.
fn pressure_behaviour(plan: &RingPlan) -> String {
    if !plan.elastic {
        return "fixed ring (elastic off): it keeps every slot; under pressure the OS reclaims or kills"
            .to_owned();
    }
    let (low, high) = smoe::internals::budget::elastic_watermarks(plan.ram_bytes);
    format!(
        "elastic: when less than {} can still be committed (of {}; page cache not counted), \
         idle slots go offline and their pages are released until {} is free again, keeping at \
         least {} slots; they come back when memory is free again",
        human_bytes(low),
        human_bytes(plan.ram_bytes),
        human_bytes(high),
        plan.slots
            .min(smoe::internals::budget::ELASTIC_MIN_ACTIVE_SLOTS)
    )
}
