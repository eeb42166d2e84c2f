//! Ring sizing (docs/c-api.md, "Ring sizing"): how many slots, of what size, when the caller
//! leaves `ring_slots` at 0.
//!
//! The sizing is [`plan_ring`], a pure function of a [`MemorySnapshot`], the
//! [`VaultShape`] and a [`BudgetConfig`]; fixed snapshots test it, and
//! `smoe budget` prints it. Its [`RingPlan`] keeps every input, every
//! intermediate value and where each input came from, so a person can see
//! why the ring has the size it has. [`plan_for`] and [`plan_to_open`] are
//! the only parts that touch the OS: they probe memory and list the vault's
//! `scout.*` files. The one process-wide state is the bytes promised to
//! rings committed at open and not committed yet ([`Promise`]), which
//! [`plan_to_open`] takes off the memory it plans with.
//!
//! This module must never allocate the ring or read a blob; it only decides
//! sizes. All arithmetic saturates or is checked: any input, however odd,
//! gives a plan or an [`Error`], never a panic or a wrapped value.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::config::{select_budget, Config, Populate};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::MemorySnapshot;
use crate::vault::{Vault, DEFAULT_ALIGNMENT};

/// Engine memory besides the ring and the scout when the config says 0.
pub const DEFAULT_ENGINE_OVERHEAD_BYTES: u64 = 2 << 30;
/// The floor (memory left to the rest of the system) is at least this,
/// except for an elastic ring under a cgroup limit (see [`plan_ring`]).
pub const MIN_FLOOR_BYTES: u64 = 4 << 30;
/// Fewest slots the automatic sizing gives (before the cap at the entry count).
pub const MIN_AUTO_SLOTS: u32 = 64;
/// Most slots the automatic sizing gives.
pub const MAX_AUTO_SLOTS: u32 = 4096;

/// The largest blob of a vault: the one that decides the slot size, named
/// in the error when an overridden slot is too small for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LargestBlob {
    /// Layer id.
    pub layer: u32,
    /// Expert id within the layer.
    pub expert: u32,
    /// Its padded size: the bytes a read covers, so the bytes a slot must hold.
    pub padded_size: u64,
}

/// What the sizing needs to know about a vault, and nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VaultShape {
    /// The blob with the largest `padded_size` (the first in (layer, expert)
    /// order on a tie); `None` for a vault without blobs.
    pub largest_blob: Option<LargestBlob>,
    /// Number of blobs: the ring never has more slots than this.
    pub n_entries: u32,
    /// Bytes the engine keeps resident besides the ring: the vault's
    /// `scout.*` files, or a model's non-expert tensors.
    pub scout_bytes: u64,
    /// Where `scout_bytes` came from: `"scout.* files in <dir>"`, or
    /// `"the non-expert tensors of <model file>"`.
    pub scout_source: String,
}

impl VaultShape {
    /// The shape of an opened vault. Lists the vault directory for its
    /// `scout.*` files, or sums a model's other tensors
    /// ([`Vault::dense_bytes`]); reads no blob.
    pub fn of(vault: &Vault) -> VaultShape {
        // `max_by_key` keeps the last maximum; reversing keeps the first.
        let largest_blob = vault
            .entries()
            .iter()
            .rev()
            .max_by_key(|e| e.padded_size)
            .map(|e| LargestBlob {
                layer: e.layer,
                expert: e.expert,
                padded_size: e.padded_size,
            });
        let (scout_bytes, scout_source) = vault.dense_bytes();
        VaultShape {
            largest_blob,
            n_entries: u32::try_from(vault.entries().len()).unwrap_or(u32::MAX),
            scout_bytes,
            scout_source,
        }
    }

    /// The largest `padded_size` of any blob, 0 without blobs.
    pub fn max_padded_size(&self) -> u64 {
        self.largest_blob.map_or(0, |b| b.padded_size)
    }
}

macro_rules! define_budget_config {
    ($($(#[$doc:meta])* $name:ident : $ty:ty = $default:expr,)*) => {
        /// The caller's say in the sizing: the settings of
        /// [`Config`](crate::Config) marked `[budget]` in its schema
        /// (`src/config.rs`), the `smoe_config` fields of docs/c-api.md
        /// that §2.1 reads. Zero (or `None`) in a field means "choose for
        /// me". [`Config::budget`](crate::Config::budget) gives a config's.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct BudgetConfig {
            $($(#[$doc])* pub $name: $ty,)*
        }

        impl Default for BudgetConfig {
            fn default() -> Self {
                BudgetConfig {
                    $($name: $default,)*
                }
            }
        }
    };
}

crate::config::config_schema!(select_budget define_budget_config);

macro_rules! define_budget_of {
    ($($(#[$doc:meta])* $name:ident : $ty:ty = $default:expr,)*) => {
        impl Config {
            /// The settings the ring sizing reads ([`plan_for`]).
            pub fn budget(&self) -> BudgetConfig {
                BudgetConfig {
                    $($name: self.$name,)*
                }
            }
        }
    };
}

crate::config::config_schema!(select_budget define_budget_of);

/// Which bound, if any, changed the slot count (the last one that did, in
/// the order docs/c-api.md, "Ring sizing" applies them: 64..=4096, then the entry count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotClamp {
    /// The count is what the budget (or `ring_slots`) gave.
    None,
    /// Raised to the automatic minimum, 64 slots.
    Min,
    /// Lowered to the automatic maximum, 4096 slots.
    Max,
    /// Lowered to the number of entries.
    Entries,
    /// Lowered to what the available memory holds: fewer slots than the
    /// automatic minimum of 64 fit.
    Fit,
    /// Lowered to the budget for a ring whose pages are all committed
    /// ([`Commit::is_eager`]): never raised to the minimum of 64 past it,
    /// so that the host keeps the rest.
    Committed,
}

/// When a ring's pages are committed: as slots are first loaded, or all of
/// them soon after open, which the sizing must leave room for (issue 33: a
/// pinned ring sized as if its pages came later got its host OOM-killed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    /// As slots are first loaded; an elastic ring that is populated stops
    /// at its high watermark, and gives pages back under pressure.
    OnLoad,
    /// `populate` on a ring that is not elastic: every page committed
    /// during or soon after open.
    Populated,
    /// `pinned`: populated for a device, never elastic.
    Pinned,
    /// `lock`: `mlock` commits every page at open.
    Locked,
}

impl Commit {
    /// The commit of a config's ring: `lock` first, then `pinned`, then
    /// `populate` on a ring that is not elastic.
    pub fn of(config: &BudgetConfig) -> Commit {
        if config.lock {
            Commit::Locked
        } else if config.pinned {
            Commit::Pinned
        } else if config.populate != Populate::Off && !config.is_elastic() {
            Commit::Populated
        } else {
            Commit::OnLoad
        }
    }

    /// Every page is committed at or soon after open.
    pub fn is_eager(self) -> bool {
        self != Commit::OnLoad
    }
}

impl fmt::Display for Commit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Commit::OnLoad => "committed as slots are first loaded",
            Commit::Populated => "populated (every page committed at or after open)",
            Commit::Pinned => "pinned (every page committed after open, for a device)",
            Commit::Locked => "locked (every page committed at open)",
        })
    }
}

impl BudgetConfig {
    /// Whether the ring is elastic: asked for, and neither locked (madvise
    /// refuses locked pages) nor pinned (the device would keep reading the
    /// old pages). The one place this is decided.
    pub fn is_elastic(&self) -> bool {
        self.elastic && !self.lock && !self.pinned
    }
}

/// The part of the committable memory ([`MemorySnapshot::committable_bytes`])
/// a ring whose pages are all committed may take: all but an eighth, which
/// stays the host's.
pub fn eager_limit_bytes(committable_bytes: u64) -> u64 {
    committable_bytes - committable_bytes / 8
}

/// Bytes of this process's rings committed at open whose pages are not
/// committed yet (a populate thread is still filling them): the memory
/// probe cannot see them, so the next open subtracts them (issue 33: two
/// pinned rings opened one after the other each fitted alone). A child
/// made by `fork` inherits the parent's count without its threads: its
/// opens are more careful than they need be, never less.
static PROMISED: AtomicU64 = AtomicU64::new(0);

/// Held from the memory probe to the promise of [`plan_to_open`], so that
/// two opens at once each see the other's ring.
static PLANNING: Mutex<()> = Mutex::new(());

/// A ring's share of the bytes promised to rings committed at open: given
/// back as its pages are committed ([`Promise::settle`]), and whatever is
/// left when it drops (the ring is closed, or its open failed).
#[derive(Debug)]
pub struct Promise {
    left: AtomicU64,
}

impl Promise {
    /// A promise of nothing: a ring committed as slots are loaded.
    pub fn none() -> Promise {
        Promise {
            left: AtomicU64::new(0),
        }
    }

    /// `bytes` of the ring's pages are committed now.
    pub fn settle(&self, bytes: u64) {
        let mut taken = 0;
        // Relaxed: this promise's own count, touched by its ring's threads.
        let _ = self
            .left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                taken = left.min(bytes);
                Some(left - taken)
            });
        // Release: the commit of those pages (the madvise or mlock before
        // this call) happens before an open that Acquires the smaller sum,
        // so that open's memory probe sees them.
        PROMISED.fetch_sub(taken, Ordering::Release);
    }
}

impl Drop for Promise {
    fn drop(&mut self) {
        self.settle(u64::MAX);
    }
}

impl fmt::Display for SlotClamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SlotClamp::None => "none",
            SlotClamp::Min => "raised to the minimum of 64",
            SlotClamp::Max => "lowered to the maximum of 4096",
            SlotClamp::Entries => "capped at the entry count",
            SlotClamp::Fit => {
                "fewer than the minimum of 64: only these fit in the available memory"
            }
            SlotClamp::Committed => {
                "lowered to the budget: a ring committed at open is not raised past it"
            }
        })
    }
}

/// Where each input of a [`RingPlan`] came from, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanSources {
    /// Of `avail_bytes`, e.g. "/proc/meminfo MemAvailable" or
    /// "cgroup v2 memory.max − memory.current in /sys/fs/cgroup/app".
    pub avail: String,
    /// Of `ram_bytes`, e.g. "/proc/meminfo MemTotal" or "sysctl hw.memsize".
    pub ram: String,
    /// Of `scout_bytes`: `"scout.* files in <dir>"` or `"config"`.
    pub scout: String,
    /// Of `engine_overhead_bytes`: "default 2 GiB" or "config".
    pub overhead: String,
    /// Of `slot_bytes`: "largest padded blob (layer L expert E, N bytes)
    /// rounded up to 16384" or "config slot_mb".
    pub slot: String,
    /// Of `slots`: "auto" or "config ring_slots", plus the clamp when one
    /// applied ("auto, raised to the minimum of 64").
    pub slots: String,
    /// Of `committable_bytes`, e.g. "cgroup v2 memory.max - (memory.current
    /// - file cache) in /sys/fs/cgroup/app".
    pub committable: String,
}

/// The ring size docs/c-api.md, "Ring sizing" gives, with every input and intermediate value.
///
/// The memory figures are computed even when `ring_slots` overrides the
/// count, so a person can compare the two.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingPlan {
    /// Memory available before pressure (the snapshot's).
    pub avail_bytes: u64,
    /// Physical memory, or the cgroup limit if lower (the snapshot's).
    pub ram_bytes: u64,
    /// Resident dense weights the ring must leave room for.
    pub scout_bytes: u64,
    /// Engine memory besides the ring and the scout.
    pub engine_overhead_bytes: u64,
    /// Memory left to everything else: `max(ram / 8, 4 GiB)`, or `ram / 8`
    /// for an elastic ring under a cgroup limit.
    pub floor_bytes: u64,
    /// `avail − scout − overhead − floor`, saturating at 0.
    pub subtractive_budget_bytes: u64,
    /// `avail / 4`, the least the ring is given however tight memory is.
    pub quarter_avail_bytes: u64,
    /// The ring's byte budget (docs/c-api.md "Ring sizing"'s `bytes`):
    /// `max(subtractive_budget_bytes, quarter_avail_bytes)`.
    pub budget_bytes: u64,
    /// Bytes per slot, a multiple of [`DEFAULT_ALIGNMENT`] that every blob
    /// fits.
    pub slot_bytes: u64,
    /// `budget_bytes / slot_bytes`, before any clamp.
    pub budget_slots: u64,
    /// The slot count: the automatic or the configured one, clamped.
    pub slots: u32,
    /// Number of blobs in the vault.
    pub n_entries: u32,
    /// Which bound changed the slot count, if any.
    pub clamp: SlotClamp,
    /// `slots × slot_bytes`: the memory the ring will take.
    pub ring_bytes: u64,
    /// The ring is elastic (it gives idle slots back under memory
    /// pressure, docs/c-api.md "Elastic ring"): asked for, and neither
    /// locked nor pinned ([`BudgetConfig::is_elastic`]).
    pub elastic: bool,
    /// When the ring's pages are committed; a ring committed at open must
    /// fit in [`eager_limit_bytes`] of `committable_bytes`
    /// ([`check_fits`]).
    pub commit: Commit,
    /// Memory that pages committed now would get
    /// ([`MemorySnapshot::committable_bytes`]), less what this process
    /// promised to its other rings committed at open.
    pub committable_bytes: u64,
    /// `ram_bytes` is a cgroup's limit, so the floor had no 4 GiB minimum
    /// when the ring is elastic.
    pub cgroup_limited: bool,
    /// Where each input came from.
    pub sources: PlanSources,
}

/// Sizes the ring (docs/c-api.md, "Ring sizing") from fixed inputs; touches nothing outside.
///
/// ```text
/// floor  = max(ram / 8, 4 GiB)       (ram / 8: elastic, under a cgroup limit)
/// budget = avail − scout − overhead − floor      (saturating at 0)
/// bytes  = max(budget, avail / 4)
/// slots  = clamp(bytes / slot_bytes, 64, 4096), then min(slots, n_entries)
/// ```
///
/// The count never passes `min(avail, ram) / slot_bytes`: when 64 slots
/// do not fit in the available memory, the ring takes the slots that do
/// ([`SlotClamp::Fit`], with [`RingPlan::warning`]), and when not even one
/// does, sizing fails. So an automatic plan always passes [`check_fits`],
/// the rule `smoe_open` applies to every ring.
///
/// With `config.ring_slots` set, `slots` is that number, still capped at
/// `n_entries`. `slot_bytes` is the largest padded blob rounded up to
/// [`DEFAULT_ALIGNMENT`], or `config.slot_mb` MiB.
///
/// The 4 GiB minimum of the floor keeps memory for the rest of a machine.
/// Inside a memory cgroup the rest of the machine is outside the limit,
/// which already protects it, and an elastic ring gives its idle slots
/// back when a neighbour in the cgroup needs memory; so an elastic ring
/// under a cgroup limit keeps only `ram / 8` (of the limit) as its floor.
/// Without a cgroup limit, or with `elastic` off, the formula is unchanged.
///
/// # Errors
///
/// [`ErrorKind::Argument`] when `slot_mb` is smaller than the largest blob
/// (the message names the blob), or when the vault has no blobs;
/// [`ErrorKind::NoMemory`] when the count is automatic and not even one
/// slot fits in the available memory, or when the ring fails
/// [`check_fits`].
pub fn plan_ring(
    snapshot: &MemorySnapshot,
    vault: &VaultShape,
    config: &BudgetConfig,
) -> Result<RingPlan> {
    let largest = match vault.largest_blob {
        Some(blob) if vault.n_entries > 0 => blob,
        _ => {
            return Err(Error::argument(
                "the vault has no expert blobs, so there is no ring to size",
            ))
        }
    };
    let (slot_bytes, slot_source) = slot_size(&largest, config.slot_mb)?;

    let (scout_bytes, scout_source) = match config.scout_bytes {
        Some(bytes) => (bytes, "config".to_owned()),
        None => (vault.scout_bytes, vault.scout_source.clone()),
    };
    let (engine_overhead_bytes, overhead_source) = match config.engine_overhead_bytes {
        0 => (DEFAULT_ENGINE_OVERHEAD_BYTES, "default 2 GiB"),
        bytes => (bytes, "config"),
    };

    let avail_bytes = snapshot.avail_bytes;
    let ram_bytes = snapshot.ram_bytes;
    let elastic = config.is_elastic();
    let commit = Commit::of(config);
    let floor_bytes = if elastic && snapshot.cgroup_limited {
        ram_bytes / 8
    } else {
        (ram_bytes / 8).max(MIN_FLOOR_BYTES)
    };
    let subtractive_budget_bytes = avail_bytes
        .saturating_sub(scout_bytes)
        .saturating_sub(engine_overhead_bytes)
        .saturating_sub(floor_bytes);
    let quarter_avail_bytes = avail_bytes / 4;
    let budget_bytes = subtractive_budget_bytes.max(quarter_avail_bytes);
    // `slot_bytes >= DEFAULT_ALIGNMENT > 0` (see `slot_size`).
    let budget_slots = budget_bytes / slot_bytes;

    let (wanted, mut clamp, slots_source) = match config.ring_slots {
        0 => {
            let clamped = budget_slots.clamp(u64::from(MIN_AUTO_SLOTS), u64::from(MAX_AUTO_SLOTS));
            // Never more than the available memory holds (nor the
            // machine: a snapshot's avail never exceeds its ram, but a
            // fixture's may). `budget_bytes ≤ avail`, so only the raise to
            // the minimum can pass it.
            let fitting = avail_bytes.min(ram_bytes) / slot_bytes;
            // A ring committed at open is never raised to the minimum
            // past its budget: the host keeps the rest, as an elastic ring
            // would give it back.
            let eager =
                budget_bytes.min(eager_limit_bytes(snapshot.committable_bytes)) / slot_bytes;
            let fitting = if commit.is_eager() {
                fitting.min(eager)
            } else {
                fitting
            };
            let clamp = if clamped > fitting && commit.is_eager() && fitting == eager {
                SlotClamp::Committed
            } else if clamped > fitting {
                SlotClamp::Fit
            } else if budget_slots < u64::from(MIN_AUTO_SLOTS) {
                SlotClamp::Min
            } else if budget_slots > u64::from(MAX_AUTO_SLOTS) {
                SlotClamp::Max
            } else {
                SlotClamp::None
            };
            let slots = clamped.min(fitting);
            if slots == 0 {
                return Err(Error::new(
                    ErrorKind::NoMemory,
                    format!(
                        "not even one slot of {slot_bytes} bytes ({slot_source}) fits in the \
                         {avail_bytes} bytes of memory available ({}){}; free memory, raise \
                         the limit, or pack the model with smaller experts",
                        snapshot.avail_source,
                        if commit.is_eager() {
                            format!(
                                " for a ring that is {commit}, whose budget is {budget_bytes} \
                                 bytes and which may take 7/8 of the {} bytes that can be \
                                 committed ({})",
                                snapshot.committable_bytes, snapshot.committable_source
                            )
                        } else {
                            String::new()
                        }
                    ),
                ));
            }
            // `slots <= MAX_AUTO_SLOTS`, so it fits a u32.
            (slots as u32, clamp, "auto")
        }
        n => (n, SlotClamp::None, "config ring_slots"),
    };
    let slots = wanted.min(vault.n_entries);
    if slots < wanted {
        clamp = SlotClamp::Entries;
    }
    let slots_source = match clamp {
        SlotClamp::None => slots_source.to_owned(),
        SlotClamp::Entries => format!("{slots_source}, capped at the {} entries", vault.n_entries),
        other => format!("{slots_source}, {other}"),
    };

    let plan = RingPlan {
        avail_bytes,
        ram_bytes,
        scout_bytes,
        engine_overhead_bytes,
        floor_bytes,
        subtractive_budget_bytes,
        quarter_avail_bytes,
        budget_bytes,
        slot_bytes,
        budget_slots,
        slots,
        n_entries: vault.n_entries,
        clamp,
        ring_bytes: u64::from(slots).saturating_mul(slot_bytes),
        elastic,
        commit,
        cgroup_limited: snapshot.cgroup_limited,
        committable_bytes: snapshot.committable_bytes,
        sources: PlanSources {
            avail: snapshot.avail_source.clone(),
            ram: snapshot.ram_source.clone(),
            scout: scout_source,
            overhead: overhead_source.to_owned(),
            slot: slot_source,
            slots: slots_source,
            committable: snapshot.committable_source.clone(),
        },
    };
    check_fits(&plan)?;
    Ok(plan)
}

/// Whether `smoe_open` accepts the ring `plan` describes: no larger than
/// this machine's memory (or its cgroup limit), and, for a ring committed
/// at open ([`Commit::is_eager`]), no larger than 7/8 of the memory that
/// can be committed ([`eager_limit_bytes`]). The ring is reserved, not
/// committed, so the OS would accept a larger one, and its reads would
/// exhaust memory later. A plan whose memory was not probed (`ram_bytes`
/// 0, with `ring_slots` set) passes, with a warning when it is committed
/// at open ([`RingPlan::warning`]).
///
/// # Errors
///
/// [`ErrorKind::NoMemory`], naming the ring's size and the memory.
pub fn check_fits(plan: &RingPlan) -> Result<()> {
    let limit = eager_limit_bytes(plan.committable_bytes);
    if plan.commit.is_eager() && plan.ram_bytes > 0 && plan.ring_bytes > limit {
        let fit = limit / plan.slot_bytes.max(1);
        return Err(Error::new(
            ErrorKind::NoMemory,
            format!(
                "the ring of {} slots × {} bytes = {} bytes is {}, and does not fit in the {} \
                 bytes of memory that can be committed ({}) less an eighth kept for the host: \
                 at most {fit} slots of {} bytes ({} bytes) fit; ask for fewer slots, or leave \
                 ring_slots at 0 to size it",
                plan.slots,
                plan.slot_bytes,
                plan.ring_bytes,
                plan.commit,
                plan.committable_bytes,
                plan.sources.committable,
                plan.slot_bytes,
                fit.saturating_mul(plan.slot_bytes),
            ),
        ));
    }
    if plan.ram_bytes > 0 && plan.ring_bytes > plan.ram_bytes {
        return Err(Error::new(
            ErrorKind::NoMemory,
            format!(
                "the ring of {} slots × {} bytes = {} bytes is larger than this machine's memory ({} bytes{})",
                plan.slots,
                plan.slot_bytes,
                plan.ring_bytes,
                plan.ram_bytes,
                if plan.sources.ram.contains("cgroup") { ", its cgroup limit" } else { "" }
            ),
        ));
    }
    Ok(())
}

impl RingPlan {
    /// What a person should hear about this plan: fewer slots than the
    /// automatic minimum because only those fit.
    pub fn warning(&self) -> Option<String> {
        if self.commit.is_eager() && self.ram_bytes == 0 {
            return Some(format!(
                "the ring of {} bytes is {}, and could not be checked against the memory that \
                 can be committed ({}): make sure it fits",
                self.ring_bytes, self.commit, self.sources.committable
            ));
        }
        if self.clamp == SlotClamp::Committed && self.slots < MIN_AUTO_SLOTS {
            return Some(format!(
                "the ring has {} slots of {} bytes, fewer than the automatic minimum of \
                 {MIN_AUTO_SLOTS}: it is {}, and only these fit in its budget of {} bytes (the \
                 plan's budget, at most 7/8 of the {} bytes that can be committed: {})",
                self.slots,
                self.slot_bytes,
                self.commit,
                self.budget_bytes
                    .min(eager_limit_bytes(self.committable_bytes)),
                self.committable_bytes,
                self.sources.committable
            ));
        }
        (self.clamp == SlotClamp::Fit).then(|| {
            format!(
                "the ring has {} slots of {} bytes, fewer than the automatic minimum of \
                 {MIN_AUTO_SLOTS}: only these fit in the {} bytes of memory available ({})",
                self.slots, self.slot_bytes, self.avail_bytes, self.sources.avail
            )
        })
    }
}

/// The slot size and where it came from. Always a non-zero multiple of
/// [`DEFAULT_ALIGNMENT`].
fn slot_size(largest: &LargestBlob, slot_mb: u32) -> Result<(u64, String)> {
    let LargestBlob {
        layer,
        expert,
        padded_size,
    } = *largest;
    let align = u64::from(DEFAULT_ALIGNMENT);
    if slot_mb == 0 {
        let bytes = padded_size
            .checked_next_multiple_of(align)
            .ok_or_else(|| {
                Error::argument(format!(
                    "the blob of layer {layer} expert {expert} ({padded_size} padded bytes) is too large for a slot"
                ))
            })?
            .max(align);
        let source = format!(
            "largest padded blob (layer {layer} expert {expert}, {padded_size} bytes) rounded up to {align}"
        );
        return Ok((bytes, source));
    }
    // A u32 shifted by 20 fits a u64; a whole MiB is a multiple of `align`.
    let bytes = u64::from(slot_mb) << 20;
    if padded_size > bytes {
        return Err(Error::argument(format!(
            "slot_mb {slot_mb} ({bytes} bytes) is smaller than the blob of layer {layer} expert {expert} ({padded_size} padded bytes)"
        )));
    }
    Ok((bytes, "config slot_mb".to_owned()))
}

/// Probes this machine's memory ([`crate::sys::memory_snapshot`]) and sizes
/// the ring for `vault` with [`plan_ring`].
///
/// When `config.ring_slots` is set the count does not depend on memory, so a
/// failed probe is not fatal: the plan then shows 0 for `avail_bytes` and
/// `ram_bytes` and the probe's error as their source.
///
/// # Errors
///
/// [`ErrorKind::Io`] when the probe fails and `ring_slots` is 0 (the message
/// names the file or sysctl); otherwise those of [`plan_ring`].
pub fn plan_for(vault: &Vault, config: &BudgetConfig) -> Result<RingPlan> {
    plan_promised(vault, config, 0)
}

/// [`plan_for`] for a ring `smoe_open` is about to allocate: its committable
/// memory lowered by what this process promised to its other rings
/// committed at open and has not committed yet; and, when this ring is one
/// too, its own promise, which the streamer settles as it commits the
/// pages.
///
/// # Errors
///
/// Those of [`plan_for`].
pub fn plan_to_open(vault: &Vault, config: &BudgetConfig) -> Result<(RingPlan, Promise)> {
    let _planning = PLANNING.lock().unwrap_or_else(PoisonError::into_inner);
    // Acquire: pairs with `Promise::settle`'s Release; read before the
    // probe, so a promise settled meanwhile is counted twice, never none.
    let promised = PROMISED.load(Ordering::Acquire);
    let plan = plan_promised(vault, config, promised)?;
    if !plan.commit.is_eager() {
        return Ok((plan, Promise::none()));
    }
    // Relaxed: the planning mutex orders it before the next open's load.
    PROMISED.fetch_add(plan.ring_bytes, Ordering::Relaxed);
    let promise = Promise {
        left: AtomicU64::new(plan.ring_bytes),
    };
    Ok((plan, promise))
}

/// [`plan_for`] with `promised` bytes of this process's rings not yet
/// committed taken off the committable memory.
fn plan_promised(vault: &Vault, config: &BudgetConfig, promised: u64) -> Result<RingPlan> {
    let mut snapshot = match crate::sys::memory_snapshot() {
        Ok(snapshot) => snapshot,
        Err(err) if config.ring_slots != 0 => {
            let source = format!("not probed ({err})");
            MemorySnapshot {
                avail_bytes: 0,
                ram_bytes: 0,
                avail_source: source.clone(),
                ram_source: source.clone(),
                cgroup_limited: false,
                committable_bytes: 0,
                committable_source: source,
            }
        }
        Err(err) => {
            return Err(Error::new(
                ErrorKind::Io,
                format!("cannot size the ring: the memory probe failed: {err}"),
            ))
        }
    };
    if promised > 0 {
        snapshot.committable_bytes = snapshot.committable_bytes.saturating_sub(promised);
        snapshot.committable_source = format!(
            "{}, less {promised} bytes promised to this process's other rings committed at open",
            snapshot.committable_source
        );
    }
    plan_ring(&snapshot, &VaultShape::of(vault), config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_defaults_are_the_configs() {
        assert_eq!(Config::default().budget(), BudgetConfig::default());
        let config = Config {
            ring_slots: 7,
            slot_mb: 3,
            scout_bytes: Some(5),
            engine_overhead_bytes: 9,
            elastic: false,
            populate: Populate::Background,
            pinned: true,
            workers: 2,
            ..Config::default()
        };
        assert_eq!(
            config.budget(),
            BudgetConfig {
                ring_slots: 7,
                slot_mb: 3,
                scout_bytes: Some(5),
                engine_overhead_bytes: 9,
                populate: Populate::Background,
                lock: false,
                elastic: false,
                pinned: true,
            }
        );
    }

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn snapshot(avail_bytes: u64, ram_bytes: u64) -> MemorySnapshot {
        MemorySnapshot {
            avail_bytes,
            ram_bytes,
            avail_source: "test avail".to_owned(),
            ram_source: "test ram".to_owned(),
            cgroup_limited: false,
            committable_bytes: avail_bytes,
            committable_source: "test avail".to_owned(),
        }
    }

    /// A process in a memory cgroup of `limit` bytes using 256 MiB of it.
    fn in_cgroup(limit: u64) -> MemorySnapshot {
        MemorySnapshot {
            avail_bytes: limit - 256 * MIB,
            ram_bytes: limit,
            avail_source: "cgroup v2 memory.max - memory.current".to_owned(),
            ram_source: "cgroup v2 memory.max".to_owned(),
            cgroup_limited: true,
            committable_bytes: limit - 256 * MIB,
            committable_source: "cgroup v2 memory.max - (memory.current - file cache)".to_owned(),
        }
    }

    /// A promise is given back as the pages are committed, never more than
    /// it holds, and the rest when it drops.
    #[test]
    fn a_promise_is_settled_once() {
        let p = Promise {
            left: AtomicU64::new(100),
        };
        PROMISED.fetch_add(100, Ordering::Relaxed);
        let before = PROMISED.load(Ordering::Relaxed);
        p.settle(30);
        assert_eq!(p.left.load(Ordering::Relaxed), 70);
        p.settle(500);
        assert_eq!(p.left.load(Ordering::Relaxed), 0);
        drop(p);
        // No other test promises anything: the counter fell by 100.
        assert_eq!(before - PROMISED.load(Ordering::Relaxed), 100);
        drop(Promise::none());
        assert_eq!(before - PROMISED.load(Ordering::Relaxed), 100);
    }

    /// A ring whose pages are all committed at open (pinned, locked, or
    /// populated and not elastic) in a 512 MiB cgroup of which the host
    /// uses 256 MiB (issue 33: a pinned 40 × 8 MiB ring opened, and its
    /// populate thread got the host OOM-killed). Configured, it must fit in
    /// 7/8 of the 256 MiB available; automatic, it is never raised to the
    /// minimum of 64 slots past its budget. An elastic ring that is
    /// populated stops at its watermark, so it is sized as before.
    #[test]
    fn a_ring_committed_at_open_fits_what_is_available() {
        let vault = shape(8 * MIB, 100_000, 0);
        let snap = in_cgroup(512 * MIB);
        let eager = [
            BudgetConfig {
                pinned: true,
                ..BudgetConfig::default()
            },
            BudgetConfig {
                lock: true,
                ..BudgetConfig::default()
            },
            BudgetConfig {
                populate: Populate::Background,
                elastic: false,
                ..BudgetConfig::default()
            },
        ];
        for config in eager {
            let err = plan_ring(
                &snap,
                &vault,
                &BudgetConfig {
                    ring_slots: 40,
                    ..config
                },
            )
            .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::NoMemory, "{config:?}: {err}");
            let msg = err.to_string();
            assert!(
                msg.contains("268435456 bytes of memory that can be committed")
                    && msg.contains("at most 28 slots of 8388608 bytes (234881024 bytes) fit"),
                "{msg}"
            );
            // 28 slots (224 MiB) fit; 29 do not.
            let fits = plan_ring(
                &snap,
                &vault,
                &BudgetConfig {
                    ring_slots: 28,
                    ..config
                },
            )
            .unwrap();
            assert_eq!(fits.ring_bytes, 224 * MIB);
            assert!(plan_ring(
                &snap,
                &vault,
                &BudgetConfig {
                    ring_slots: 29,
                    ..config
                }
            )
            .is_err());
            // Automatic: the budget, avail / 4 = 64 MiB, not 64 slots.
            let auto = plan_ring(&snap, &vault, &config).unwrap();
            assert_eq!(
                (auto.slots, auto.clamp),
                (8, SlotClamp::Committed),
                "{config:?}"
            );
            assert!(!auto.elastic && auto.commit.is_eager());
            let warning = auto.warning().expect("fewer than 64 slots are said");
            assert!(
                warning.contains("only these fit in its budget"),
                "{warning}"
            );
        }
        // Lazily committed rings are sized and checked as before: elastic
        // (populated or not) and fixed.
        for config in [
            BudgetConfig::default(),
            BudgetConfig {
                populate: Populate::Background,
                ..BudgetConfig::default()
            },
            BudgetConfig {
                elastic: false,
                ..BudgetConfig::default()
            },
        ] {
            let p = plan_ring(
                &snap,
                &vault,
                &BudgetConfig {
                    ring_slots: 40,
                    ..config
                },
            )
            .unwrap();
            assert_eq!((p.ring_bytes, p.commit), (320 * MIB, Commit::OnLoad));
            let auto = plan_ring(&snap, &vault, &config).unwrap();
            assert_eq!((auto.slots, auto.clamp), (32, SlotClamp::Fit), "{config:?}");
        }
    }

    /// The plan under cgroup limits of 2, 4, 8 and 16 GiB (issue 13): the
    /// ring's bytes with the elastic ring (the default) and without, for a
    /// vault of 8 MiB blobs, no scout, the default 2 GiB engine overhead.
    #[test]
    fn plan_under_cgroup_limits() {
        let vault = shape(8 * MIB, 100_000, 0);
        let elastic = BudgetConfig::default();
        assert!(elastic.elastic, "elastic is the default");
        let fixed = BudgetConfig {
            elastic: false,
            ..BudgetConfig::default()
        };
        // (limit GiB, elastic ring MiB, fixed ring MiB): budget / 8 MiB
        // slots (at least 64), times 8 MiB.
        let expected = [
            // 1.75 GiB avail: both fall back to avail / 4 = 448 MiB, raised
            // to the minimum of 64 slots.
            (2, 512, 512),
            // 3.75 − 2 − 0.5 = 1.25 GiB against avail / 4 = 0.94 GiB.
            (4, 1280, 960),
            // 7.75 − 2 − 1 = 4.75 GiB against 7.75 − 2 − 4 = 1.75 < 1.94.
            (8, 4864, 1984),
            // 15.75 − 2 − 2 = 11.75 GiB against 15.75 − 6 = 9.75 GiB.
            (16, 12032, 9984),
        ];
        for (limit, elastic_mib, fixed_mib) in expected {
            let snap = in_cgroup(limit * GIB);
            let e = plan_ring(&snap, &vault, &elastic).unwrap();
            let f = plan_ring(&snap, &vault, &fixed).unwrap();
            eprintln!(
                "cgroup {limit} GiB: elastic {} slots = {} MiB (floor {} MiB), fixed {} slots = {} MiB",
                e.slots,
                e.ring_bytes / MIB,
                e.floor_bytes / MIB,
                f.slots,
                f.ring_bytes / MIB
            );
            assert_eq!(e.floor_bytes, limit * GIB / 8);
            assert_eq!(f.floor_bytes, 4 * GIB);
            assert_eq!(
                (e.ring_bytes / MIB, f.ring_bytes / MIB),
                (elastic_mib, fixed_mib),
                "{limit} GiB"
            );
            assert!(e.elastic && e.cgroup_limited);
            // Never more than the limit less the engine's overhead.
            assert!(
                e.ring_bytes <= limit * GIB - 2 * GIB || e.budget_bytes == e.quarter_avail_bytes
            );
        }
        // No cgroup limit: the original formula, elastic or not.
        let machine = snapshot(40 * GIB, 64 * GIB);
        assert_eq!(
            plan_ring(&machine, &vault, &elastic).unwrap(),
            RingPlan {
                elastic: true,
                ..plan_ring(&machine, &vault, &fixed).unwrap()
            }
        );
        let small = snapshot(7 * GIB, 8 * GIB);
        assert_eq!(
            plan_ring(&small, &vault, &elastic).unwrap().floor_bytes,
            4 * GIB
        );
    }

    fn shape(padded_size: u64, n_entries: u32, scout_bytes: u64) -> VaultShape {
        VaultShape {
            largest_blob: Some(LargestBlob {
                layer: 3,
                expert: 17,
                padded_size,
            }),
            n_entries,
            scout_bytes,
            scout_source: "scout.* files in /vaults/test".to_owned(),
        }
    }

    #[test]
    fn formula_by_hand() {
        // ram 64 GiB: floor 8 GiB; 40 − 6 − 2 − 8 = 24 GiB > 10 GiB (avail/4).
        let plan = plan_ring(
            &snapshot(40 * GIB, 64 * GIB),
            &shape(8 * MIB + 1, 100_000, 6 * GIB),
            &BudgetConfig::default(),
        )
        .unwrap();
        assert_eq!(plan.floor_bytes, 8 * GIB);
        assert_eq!(plan.subtractive_budget_bytes, 24 * GIB);
        assert_eq!(plan.quarter_avail_bytes, 10 * GIB);
        assert_eq!(plan.budget_bytes, 24 * GIB);
        assert_eq!(plan.slot_bytes, 8 * MIB + u64::from(DEFAULT_ALIGNMENT));
        assert_eq!(
            plan.budget_slots,
            24 * GIB / (8 * MIB + u64::from(DEFAULT_ALIGNMENT))
        );
        assert_eq!(u64::from(plan.slots), plan.budget_slots);
        assert_eq!(plan.clamp, SlotClamp::None);
        assert_eq!(plan.ring_bytes, u64::from(plan.slots) * plan.slot_bytes);
        assert_eq!(plan.sources.slots, "auto");
        assert_eq!(plan.sources.overhead, "default 2 GiB");
        assert_eq!(plan.sources.scout, "scout.* files in /vaults/test");
        assert_eq!(
            plan.sources.slot,
            "largest padded blob (layer 3 expert 17, 8388609 bytes) rounded up to 16384"
        );
    }

    #[test]
    fn extreme_inputs_do_not_overflow() {
        for avail in [0, 1, u64::MAX / 2, u64::MAX] {
            for ram in [0, u64::MAX] {
                for padded in [0, 1, u64::MAX - u64::from(DEFAULT_ALIGNMENT)] {
                    let config = BudgetConfig {
                        scout_bytes: Some(u64::MAX),
                        engine_overhead_bytes: u64::MAX,
                        ..BudgetConfig::default()
                    };
                    match plan_ring(&snapshot(avail, ram), &shape(padded, u32::MAX, 0), &config) {
                        Ok(plan) => {
                            assert!(plan.slot_bytes >= u64::from(DEFAULT_ALIGNMENT));
                            assert!((1..=MAX_AUTO_SLOTS).contains(&plan.slots));
                            assert!(check_fits(&plan).is_ok());
                        }
                        // Not even one slot fits in min(avail, ram).
                        Err(err) => {
                            assert_eq!(err.kind(), ErrorKind::NoMemory, "{err}");
                            assert!(
                                avail.min(ram) < padded.max(u64::from(DEFAULT_ALIGNMENT)),
                                "{err}"
                            );
                        }
                    }
                }
            }
        }
        let err = plan_ring(
            &snapshot(GIB, GIB),
            &shape(u64::MAX, 1, 0),
            &BudgetConfig::default(),
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Argument);
        assert!(err.message().contains("layer 3 expert 17"), "{err}");
    }

    #[test]
    fn empty_vault_is_an_argument_error() {
        let mut empty = shape(MIB, 0, 0);
        for largest in [None, empty.largest_blob] {
            empty.largest_blob = largest;
            let err = plan_ring(&snapshot(GIB, GIB), &empty, &BudgetConfig::default()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Argument);
        }
    }

    #[test]
    fn plan_for_probes_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::vault::synth::SynthSpec {
            n_layers: 2,
            n_experts: 3,
            blob_bytes: 20 * 1024,
            dense_layers: vec![],
            seed: 1,
            top_k: 2,
        };
        spec.write(dir.path(), &mut |_| {}).unwrap();
        std::fs::write(dir.path().join("scout.gguf"), [0u8; 1000]).unwrap();
        let vault = Vault::open(dir.path()).unwrap();
        let plan = plan_for(&vault, &BudgetConfig::default()).unwrap();
        assert_eq!(plan.scout_bytes, 1000);
        assert_eq!(plan.n_entries, 6);
        assert_eq!(plan.slots, 6);
        assert_eq!(
            plan.slot_bytes,
            vault
                .max_padded_size()
                .next_multiple_of(u64::from(DEFAULT_ALIGNMENT))
        );
        assert!(plan.ram_bytes > 0 && !plan.sources.avail.is_empty());
    }
}
