//! Ring sizing (docs/c-api.md, "Ring sizing") over fixed memory snapshots: every clamp, the
//! avail/4 fallback, saturation, the overrides, the oversize-blob error, the
//! design's 48 GB Mac. `smoe budget` run as a process is tested with the
//! tool, in `cli/tests/tool/budget_cli.rs`.

use proptest::prelude::*;
use smoe::internals::budget::{check_fits, plan_ring, BudgetConfig, LargestBlob, VaultShape};
use smoe::internals::sys::MemorySnapshot;
use smoe::vault::synth::SynthSpec;
use smoe::vault::{Vault, DEFAULT_ALIGNMENT};
use smoe::{ErrorKind, Populate, RingPlan, SlotClamp};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

// Every test's path contains "budget", so `cargo test --release budget`
// runs them with the library's unit tests of `budget` and the tool's
// `budget_cli`; `cargo test --release --test library -- budget::` runs
// these alone.

/// `plan_ring` over fixed snapshots.
mod budget_plan {
    use super::*;

    fn snapshot(avail_bytes: u64, ram_bytes: u64) -> MemorySnapshot {
        MemorySnapshot {
            avail_bytes,
            ram_bytes,
            avail_source: "fixture MemAvailable".to_owned(),
            ram_source: "fixture MemTotal".to_owned(),
            cgroup_limited: false,
            committable_bytes: avail_bytes,
            committable_source: "fixture MemAvailable".to_owned(),
        }
    }

    fn shape(padded_size: u64, n_entries: u32, scout_bytes: u64) -> VaultShape {
        VaultShape {
            largest_blob: Some(LargestBlob {
                layer: 5,
                expert: 9,
                padded_size,
            }),
            n_entries,
            scout_bytes,
            scout_source: "scout.* files in /vaults/model".to_owned(),
        }
    }

    fn auto() -> BudgetConfig {
        BudgetConfig::default()
    }

    fn plan(avail: u64, ram: u64, vault: &VaultShape, config: &BudgetConfig) -> RingPlan {
        plan_ring(&snapshot(avail, ram), vault, config).unwrap()
    }

    #[test]
    fn inputs_and_sources_are_kept() {
        let p = plan(
            40 * GIB,
            64 * GIB,
            &shape(8 * MIB, 100_000, 6 * GIB),
            &auto(),
        );
        assert_eq!((p.avail_bytes, p.ram_bytes), (40 * GIB, 64 * GIB));
        assert_eq!(p.scout_bytes, 6 * GIB);
        assert_eq!(p.engine_overhead_bytes, 2 * GIB);
        assert_eq!(p.floor_bytes, 8 * GIB);
        assert_eq!(p.subtractive_budget_bytes, 24 * GIB);
        assert_eq!(p.quarter_avail_bytes, 10 * GIB);
        assert_eq!(p.budget_bytes, 24 * GIB);
        assert_eq!(p.slot_bytes, 8 * MIB);
        assert_eq!((p.budget_slots, p.slots), (3072, 3072));
        assert_eq!(p.clamp, SlotClamp::None);
        assert_eq!(p.n_entries, 100_000);
        assert_eq!(p.ring_bytes, 24 * GIB);
        let s = &p.sources;
        assert_eq!(s.avail, "fixture MemAvailable");
        assert_eq!(s.ram, "fixture MemTotal");
        assert_eq!(s.scout, "scout.* files in /vaults/model");
        assert_eq!(s.overhead, "default 2 GiB");
        assert_eq!(
            s.slot,
            "largest padded blob (layer 5 expert 9, 8388608 bytes) rounded up to 16384"
        );
        assert_eq!(s.slots, "auto");
    }

    #[test]
    fn floor_is_at_least_4_gib() {
        // ram / 8 = 2 GiB < 4 GiB.
        let p = plan(12 * GIB, 16 * GIB, &shape(MIB, 100_000, 0), &auto());
        assert_eq!(p.floor_bytes, 4 * GIB);
        assert_eq!(p.subtractive_budget_bytes, 6 * GIB);
        // ram / 8 = 32 GiB > 4 GiB.
        let p = plan(200 * GIB, 256 * GIB, &shape(MIB, 100_000, 0), &auto());
        assert_eq!(p.floor_bytes, 32 * GIB);
    }

    #[test]
    fn slot_is_the_largest_blob_rounded_up_to_16_kib() {
        for (padded, slot) in [
            (1, u64::from(DEFAULT_ALIGNMENT)),
            (u64::from(DEFAULT_ALIGNMENT), u64::from(DEFAULT_ALIGNMENT)),
            (
                u64::from(DEFAULT_ALIGNMENT) + 1,
                2 * u64::from(DEFAULT_ALIGNMENT),
            ),
            (10 * MIB + 4 * KIB, 10 * MIB + 16 * KIB),
        ] {
            let p = plan(40 * GIB, 64 * GIB, &shape(padded, 100_000, 0), &auto());
            assert_eq!(p.slot_bytes, slot, "padded {padded}");
        }
    }

    #[test]
    fn clamp_min_64() {
        // budget = max(8 − 0 − 2 − 4, 8/4) = 2 GiB; 2 GiB / 64 MiB = 32 → 64.
        let p = plan(8 * GIB, 16 * GIB, &shape(64 * MIB, 10_000, 0), &auto());
        assert_eq!(p.budget_bytes, 2 * GIB);
        assert_eq!(p.budget_slots, 32);
        assert_eq!(p.slots, 64);
        assert_eq!(p.clamp, SlotClamp::Min);
        assert_eq!(p.sources.slots, "auto, raised to the minimum of 64");
        assert_eq!(p.ring_bytes, 64 * 64 * MIB);
    }

    #[test]
    fn clamp_max_4096() {
        // budget = 200 − 2 − 32 = 166 GiB; / 1 MiB = 169984 → 4096.
        let p = plan(200 * GIB, 256 * GIB, &shape(MIB, 100_000, 0), &auto());
        assert_eq!(p.budget_slots, 166 * 1024);
        assert_eq!(p.slots, 4096);
        assert_eq!(p.clamp, SlotClamp::Max);
        assert_eq!(p.sources.slots, "auto, lowered to the maximum of 4096");
    }

    #[test]
    fn quarter_of_avail_when_the_subtractive_budget_is_smaller() {
        // 20 − 6 − 2 − 8 = 4 GiB < 20 / 4 = 5 GiB.
        let p = plan(
            20 * GIB,
            64 * GIB,
            &shape(4 * MIB, 100_000, 6 * GIB),
            &auto(),
        );
        assert_eq!(p.subtractive_budget_bytes, 4 * GIB);
        assert_eq!(p.quarter_avail_bytes, 5 * GIB);
        assert_eq!(p.budget_bytes, 5 * GIB);
        assert_eq!(p.slots, 1280);
    }

    #[test]
    fn subtractive_budget_saturates_at_zero() {
        // 12 − 10 − 2 − 16 < 0 → 0; the ring still gets 12 / 4 = 3 GiB.
        let p = plan(
            12 * GIB,
            128 * GIB,
            &shape(4 * MIB, 100_000, 10 * GIB),
            &auto(),
        );
        assert_eq!(p.floor_bytes, 16 * GIB);
        assert_eq!(p.subtractive_budget_bytes, 0);
        assert_eq!(p.budget_bytes, 3 * GIB);
        assert_eq!(p.slots, 768);
        // Nothing at all available: not even one slot fits (the ring
        // once took 64 slots of nothing, which smoe_open then refused).
        let err =
            plan_ring(&snapshot(0, 0), &shape(4 * MIB, 100_000, u64::MAX), &auto()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NoMemory, "{err}");
    }

    /// The automatic ring under a 150 MiB cgroup limit, with 3 MiB slots:
    /// 64 slots (192 MiB) would be more than the limit, which smoe_open
    /// refuses; the ring takes the 46 that fit in the 140 MiB available,
    /// and says so.
    #[test]
    fn when_64_slots_do_not_fit_the_ring_takes_what_fits() {
        let limited = MemorySnapshot {
            avail_bytes: 140 * MIB,
            ram_bytes: 150 * MIB,
            avail_source: "fixture cgroup".to_owned(),
            ram_source: "fixture cgroup v2 memory.max".to_owned(),
            cgroup_limited: true,
            committable_bytes: 140 * MIB,
            committable_source: "fixture cgroup".to_owned(),
        };
        let p = plan_ring(&limited, &shape(3 * MIB, 10_000, 0), &auto()).unwrap();
        assert_eq!((p.slots, p.clamp), (46, SlotClamp::Fit));
        assert!(p.ring_bytes <= p.avail_bytes && check_fits(&p).is_ok());
        let warning = p.warning().expect("a warning");
        assert!(
            warning.contains("46 slots") && warning.contains("minimum of 64"),
            "{warning}"
        );
        // A plan that fits the minimum warns of nothing.
        let p = plan(8 * GIB, 16 * GIB, &shape(64 * MIB, 10_000, 0), &auto());
        assert_eq!((p.slots, p.clamp, p.warning()), (64, SlotClamp::Min, None));
    }

    /// Mixtral-8x22B at Q8 (~320 MB experts) on a 16 GB machine with 12 GiB
    /// available: 64 slots are 20 GiB, more than the machine; the default
    /// config now opens a ring of the 38 slots that fit.
    #[test]
    fn huge_experts_on_a_small_machine_get_the_slots_that_fit() {
        let p = plan(
            12 * GIB,
            16 * GIB,
            &shape(320 * MIB, 56 * 8, 2 * GIB),
            &auto(),
        );
        assert_eq!((p.slots, p.clamp), (38, SlotClamp::Fit));
        assert!(check_fits(&p).is_ok());
        // A 20000 MiB slot with 22 GiB available: one slot, not 1.22 TiB.
        let config = BudgetConfig {
            slot_mb: 20_000,
            ..auto()
        };
        let p = plan(22 * GIB, 24 * GIB, &shape(MIB, 100, 0), &config);
        assert_eq!((p.slots, p.clamp), (1, SlotClamp::Fit));
        // One slot larger than what is available: an error naming both.
        let err = plan_ring(
            &snapshot(22 * GIB, 24 * GIB),
            &shape(23 * GIB, 100, 0),
            &auto(),
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NoMemory, "{err}");
        assert!(
            err.to_string()
                .contains("not even one slot of 24696061952 bytes"),
            "{err}"
        );
    }

    /// An override larger than the machine is refused by the sizing
    /// itself, with the message smoe_open gives (one rule for both).
    #[test]
    fn an_override_larger_than_memory_is_refused() {
        let config = BudgetConfig {
            ring_slots: 100,
            ..auto()
        };
        let err = plan_ring(
            &snapshot(8 * GIB, 16 * GIB),
            &shape(256 * MIB, 1000, 0),
            &config,
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NoMemory, "{err}");
        assert!(
            err.to_string()
                .contains("larger than this machine's memory"),
            "{err}"
        );
    }

    #[test]
    fn slots_are_capped_at_entries() {
        let p = plan(40 * GIB, 64 * GIB, &shape(MIB, 1000, 6 * GIB), &auto());
        assert_eq!(p.budget_slots, 24 * 1024);
        assert_eq!((p.slots, p.clamp), (1000, SlotClamp::Entries));
        assert_eq!(p.sources.slots, "auto, capped at the 1000 entries");
        // Below the minimum and below it again: the entry count wins.
        let p = plan(8 * GIB, 16 * GIB, &shape(64 * MIB, 20, 0), &auto());
        assert_eq!((p.slots, p.clamp), (20, SlotClamp::Entries));
        // Exactly at the entry count is no clamp.
        let p = plan(40 * GIB, 64 * GIB, &shape(8 * MIB, 3072, 6 * GIB), &auto());
        assert_eq!((p.slots, p.clamp), (3072, SlotClamp::None));
    }

    #[test]
    fn ring_slots_override() {
        let vault = shape(8 * MIB, 1000, 6 * GIB);
        let config = |ring_slots| BudgetConfig {
            ring_slots,
            ..auto()
        };
        // Taken as given, even below the automatic minimum...
        let p = plan(40 * GIB, 64 * GIB, &vault, &config(10));
        assert_eq!((p.slots, p.clamp), (10, SlotClamp::None));
        assert_eq!(p.sources.slots, "config ring_slots");
        // ... and above the automatic maximum, with the budget still reported ...
        let big = shape(8 * MIB, 100_000, 6 * GIB);
        let p = plan(40 * GIB, 64 * GIB, &big, &config(5000));
        assert_eq!((p.slots, p.clamp), (5000, SlotClamp::None));
        assert_eq!((p.budget_bytes, p.budget_slots), (24 * GIB, 3072));
        // ... but never more slots than entries.
        let p = plan(40 * GIB, 64 * GIB, &vault, &config(5000));
        assert_eq!((p.slots, p.clamp), (1000, SlotClamp::Entries));
        assert_eq!(
            p.sources.slots,
            "config ring_slots, capped at the 1000 entries"
        );
    }

    #[test]
    fn slot_mb_override() {
        let config = BudgetConfig {
            slot_mb: 16,
            ..auto()
        };
        let p = plan(
            40 * GIB,
            64 * GIB,
            &shape(8 * MIB, 100_000, 6 * GIB),
            &config,
        );
        assert_eq!(p.slot_bytes, 16 * MIB);
        assert_eq!(p.slots, 1536);
        assert_eq!(p.sources.slot, "config slot_mb");
        // A blob exactly the slot's size fits.
        let p = plan(
            40 * GIB,
            64 * GIB,
            &shape(16 * MIB, 100_000, 6 * GIB),
            &config,
        );
        assert_eq!(p.slot_bytes, 16 * MIB);
    }

    #[test]
    fn slot_mb_smaller_than_a_blob_names_it() {
        let config = BudgetConfig {
            slot_mb: 8,
            ..auto()
        };
        let err = plan_ring(
            &snapshot(40 * GIB, 64 * GIB),
            &shape(8 * MIB + u64::from(DEFAULT_ALIGNMENT), 100_000, 0),
            &config,
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Argument);
        assert_eq!(
        err.message(),
        "slot_mb 8 (8388608 bytes) is smaller than the blob of layer 5 expert 9 (8404992 padded bytes)"
    );
    }

    #[test]
    fn scout_and_overhead_overrides() {
        let config = BudgetConfig {
            scout_bytes: Some(GIB),
            engine_overhead_bytes: 3 * GIB,
            ..auto()
        };
        let p = plan(
            40 * GIB,
            64 * GIB,
            &shape(8 * MIB, 100_000, 6 * GIB),
            &config,
        );
        assert_eq!((p.scout_bytes, p.engine_overhead_bytes), (GIB, 3 * GIB));
        assert_eq!(p.subtractive_budget_bytes, 28 * GIB);
        assert_eq!(
            (p.sources.scout.as_str(), p.sources.overhead.as_str()),
            ("config", "config")
        );
        // Some(0) is a real "no scout", not "use the files".
        let config = BudgetConfig {
            scout_bytes: Some(0),
            ..auto()
        };
        let p = plan(
            40 * GIB,
            64 * GIB,
            &shape(8 * MIB, 100_000, 6 * GIB),
            &config,
        );
        assert_eq!(p.scout_bytes, 0);
    }

    /// The design's target machine: a 48 GB Mac (`hw.memsize` = 48 GiB) running
    /// a model whose scout (dense weights) is ~10 GB, must get ~15 GB of ring.
    ///
    /// Assumption: `kern.memorystatus_level` is 67 (the percentage of memory
    /// macOS considers available before pressure; 60–75 is typical of such a
    /// machine with a browser and an editor open), so avail = 48 GiB × 67 / 100
    /// = 32.16 GiB. Then floor = max(6, 4) = 6 GiB, overhead 2 GiB, and
    /// budget = 32.16 − 10 − 2 − 6 = 14.16 GiB = 15.2 GB, well above avail/4.
    /// Blobs are Qwen3-235B-A22B-sized experts (3 × 4096 × 1536 weights at ~4.5
    /// bits): 10.125 MiB padded, 94 layers × 128 experts. The sweep over levels
    /// 63..=70 checks the answer is not a knife edge.
    #[test]
    fn mac_48_gb_with_a_10_gb_scout_gets_about_15_gb_of_ring() {
        let ram = 48 * GIB;
        let vault = shape(10 * MIB + 128 * KIB, 94 * 128, 10 * GIB);
        let at_level = |level: u64| plan(ram * level / 100, ram, &vault, &auto());

        let p = at_level(67);
        assert_eq!(p.floor_bytes, 6 * GIB);
        assert_eq!(p.slot_bytes, 10 * MIB + 128 * KIB);
        assert!(p.subtractive_budget_bytes > p.quarter_avail_bytes);
        assert_eq!(p.clamp, SlotClamp::None);
        assert_eq!(p.slots, 1432);
        eprintln!(
            "48 GiB Mac at level 67: {} slots × {} bytes = {:.2} GB of ring",
            p.slots,
            p.slot_bytes,
            p.ring_bytes as f64 / 1e9
        );
        assert!((14.5e9..=16e9).contains(&(p.ring_bytes as f64)), "{p:?}");

        for level in 63..=70 {
            let p = at_level(level);
            let gb = p.ring_bytes as f64 / 1e9;
            assert!((13.0..=17.0).contains(&gb), "level {level}: {gb:.2} GB");
            assert!((1200..=1600).contains(&p.slots), "level {level}: {p:?}");
        }
    }

    #[test]
    fn shape_of_a_vault_names_its_first_largest_blob() {
        let dir = tempfile::tempdir().unwrap();
        let spec = SynthSpec {
            n_layers: 3,
            n_experts: 5,
            blob_bytes: 40 * KIB,
            dense_layers: vec![0],
            seed: 7,
            top_k: 2,
        };
        spec.write(dir.path(), &mut |_| {}).unwrap();
        std::fs::write(dir.path().join("scout.weights"), vec![1u8; 4321]).unwrap();
        std::fs::write(dir.path().join("not-a-scout"), vec![1u8; 99]).unwrap();
        let vault = Vault::open(dir.path()).unwrap();
        let s = VaultShape::of(&vault);
        assert_eq!(s.n_entries, 10);
        assert_eq!(s.scout_bytes, 4321);
        assert_eq!(s.max_padded_size(), vault.max_padded_size());
        let first = vault
            .entries()
            .iter()
            .find(|e| e.padded_size == vault.max_padded_size())
            .unwrap();
        let largest = s.largest_blob.unwrap();
        assert_eq!((largest.layer, largest.expert), (first.layer, first.expert));
        assert_eq!(
            s.scout_source,
            format!("scout.* files in {}", vault.dir().display())
        );
    }

    proptest! {
        /// Any inputs give a plan that obeys docs/c-api.md, "Ring sizing", or an Argument error for
        /// a too-small slot_mb; nothing panics or wraps.
        #[test]
        fn plan_obeys_the_formula(
            avail in any::<u64>(),
            ram in any::<u64>(),
            padded in 1..=(1u64 << 40),
            n_entries in 1..=u32::MAX,
            scout in any::<u64>(),
            ring_slots in prop_oneof![Just(0u32), any::<u32>()],
            slot_mb in prop_oneof![Just(0u32), any::<u32>()],
            scout_override in any::<Option<u64>>(),
            overhead in prop_oneof![Just(0u64), any::<u64>()],
            elastic in any::<bool>(),
            populate in prop_oneof![Just(Populate::Off), Just(Populate::Background), Just(Populate::Open)],
            lock in any::<bool>(),
            pinned in any::<bool>(),
            committable in any::<u64>(),
        ) {
            let config = BudgetConfig {
                ring_slots,
                slot_mb,
                scout_bytes: scout_override,
                engine_overhead_bytes: overhead,
                elastic,
                populate,
                lock,
                pinned,
            };
            // Committed at open: locked, pinned, or populated and not
            // elastic (a locked or pinned ring never is).
            let is_elastic = elastic && !lock && !pinned;
            let eager = lock || pinned || (populate != Populate::Off && !is_elastic);
            // What can be committed may be more than avail (a cgroup's file
            // cache) or less (promises to other rings): any value.
            let snap = MemorySnapshot {
                committable_bytes: committable,
                ..snapshot(avail, ram)
            };
            let result = plan_ring(&snap, &shape(padded, n_entries, scout), &config);
            let p = match result {
                Err(err) if err.kind() == ErrorKind::Argument => {
                    prop_assert!(slot_mb != 0 && padded > u64::from(slot_mb) << 20);
                    return Ok(());
                }
                Err(err) => {
                    // Automatic: not even one slot fits; configured: the
                    // ring is larger than the machine.
                    prop_assert_eq!(err.kind(), ErrorKind::NoMemory);
                    return Ok(());
                }
                Ok(p) => p,
            };
            // Whatever the inputs, a plan is one smoe_open accepts.
            prop_assert!(check_fits(&p).is_ok());
            // The fixture snapshot has no cgroup limit: elastic or not,
            // the original floor.
            let floor = (ram / 8).max(4 * GIB);
            let overhead = if overhead == 0 { 2 * GIB } else { overhead };
            let scout = scout_override.unwrap_or(scout);
            let subtractive = avail.saturating_sub(scout).saturating_sub(overhead).saturating_sub(floor);
            prop_assert_eq!(p.floor_bytes, floor);
            prop_assert_eq!(p.subtractive_budget_bytes, subtractive);
            prop_assert_eq!(p.budget_bytes, subtractive.max(avail / 4));
            prop_assert!(p.slot_bytes >= padded && p.slot_bytes % u64::from(DEFAULT_ALIGNMENT) == 0);
            prop_assert_eq!(p.budget_slots, p.budget_bytes / p.slot_bytes);
            let wanted = if ring_slots == 0 {
                let mut fitting = avail.min(ram) / p.slot_bytes;
                if eager {
                    // Never past the budget, nor past 7/8 of avail.
                    fitting = fitting
                        .min(p.budget_bytes.min(committable - committable / 8) / p.slot_bytes);
                }
                prop_assert!(fitting > 0);
                p.budget_slots.clamp(64, 4096).min(fitting)
            } else {
                u64::from(ring_slots)
            };
            prop_assert_eq!(u64::from(p.slots), wanted.min(u64::from(n_entries)));
            prop_assert_eq!(p.ring_bytes, u64::from(p.slots).saturating_mul(p.slot_bytes));
            prop_assert_eq!(p.elastic, is_elastic);
            prop_assert_eq!(p.commit.is_eager(), eager);
            if eager && ram > 0 {
                // A ring committed at open leaves the host an eighth of
                // what is available (memory that was probed).
                prop_assert!(p.ring_bytes <= committable - committable / 8);
            }
        }
    }
}
