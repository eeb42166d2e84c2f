//! `smoe budget`, the real binary, on synthetic vaults: its JSON checked
//! against the formula of docs/c-api.md, "Ring sizing", its human output, its errors. The
//! sizing itself is tested over fixed snapshots in the library's
//! `tests/library/budget.rs`.

use crate::support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use smoe::vault::DEFAULT_ALIGNMENT;

const SLOT_ALIGN: u64 = DEFAULT_ALIGNMENT as u64;
use smoe::vault::Vault;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

use support::{smoe, text};

fn synth(dir: &Path, experts: &str, blob_kib: &str) -> PathBuf {
    let vault = dir.join("vault");
    let args = [
        "synth",
        vault.to_str().unwrap(),
        "--layers",
        "2",
        "--experts",
        experts,
        "--blob-kib",
        blob_kib,
        "--seed",
        "3",
    ];
    let out = smoe(&args);
    assert!(out.status.success(), "synth failed: {}", text(&out.stderr));
    vault
}

fn budget_json(args: &[&str]) -> Value {
    let mut all = vec!["budget", "--json"];
    all.extend_from_slice(args);
    let out = smoe(&all);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a u64 in {v}"))
}

/// The exact key set, and every value consistent with docs/c-api.md, "Ring sizing".
fn check_json(v: &Value, vault: &Vault) {
    let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    // Every fact the text prints (see cli_json_holds_every_fact_of_the_text).
    let want: BTreeSet<&str> = [
        "vault",
        "entries",
        "avail_bytes",
        "ram_bytes",
        "scout_bytes",
        "engine_overhead_bytes",
        "floor_bytes",
        "floor_rule",
        "cgroup_limited",
        "subtractive_budget_bytes",
        "quarter_avail_bytes",
        "budget_bytes",
        "budget_from",
        "slot_bytes",
        "budget_slots",
        "slots",
        "slot_clamp",
        "ring_bytes",
        "commit",
        "committable_bytes",
        "elastic",
        "under_pressure",
        "warning",
        "sources",
    ]
    .into();
    assert_eq!(keys, want);
    assert_eq!(u64_of(v, "entries"), vault.entries().len() as u64);
    assert_eq!(
        u64_of(v, "ring_bytes"),
        u64_of(v, "slots") * u64_of(v, "slot_bytes")
    );
    assert_eq!(
        u64_of(v, "budget_slots"),
        u64_of(v, "budget_bytes") / u64_of(v, "slot_bytes")
    );
    let elastic = &v["elastic"];
    if !elastic.is_null() {
        let keys: BTreeSet<&str> = elastic
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let want: BTreeSet<&str> = [
            "low_watermark_bytes",
            "high_watermark_bytes",
            "min_active_slots",
        ]
        .into();
        assert_eq!(keys, want);
        assert!(u64_of(elastic, "low_watermark_bytes") < u64_of(elastic, "high_watermark_bytes"));
        assert!(u64_of(elastic, "min_active_slots") <= u64_of(v, "slots"));
    }
    let sources = v["sources"].as_object().unwrap();
    let source_keys: BTreeSet<&str> = sources.keys().map(String::as_str).collect();
    let want_sources: BTreeSet<&str> = [
        "avail",
        "ram",
        "scout",
        "overhead",
        "slot",
        "slots",
        "committable",
    ]
    .into();
    assert_eq!(source_keys, want_sources);
    for (key, value) in sources {
        assert!(
            value.as_str().is_some_and(|s| !s.is_empty()),
            "sources.{key} = {value}"
        );
    }

    let (avail, ram) = (u64_of(v, "avail_bytes"), u64_of(v, "ram_bytes"));
    let (scout, overhead) = (u64_of(v, "scout_bytes"), u64_of(v, "engine_overhead_bytes"));
    let (slot, slots) = (u64_of(v, "slot_bytes"), u64_of(v, "slots"));
    assert!(ram > 0 && avail <= ram, "{v}");
    // An elastic ring (the default) under a cgroup limit keeps ram / 8.
    let in_cgroup = v["sources"]["ram"]
        .as_str()
        .is_some_and(|s| s.starts_with("cgroup"));
    let floor = if in_cgroup && !v["elastic"].is_null() {
        ram / 8
    } else {
        (ram / 8).max(4 * GIB)
    };
    assert_eq!(u64_of(v, "floor_bytes"), floor);
    let subtractive = avail
        .saturating_sub(scout)
        .saturating_sub(overhead)
        .saturating_sub(u64_of(v, "floor_bytes"));
    assert_eq!(u64_of(v, "subtractive_budget_bytes"), subtractive);
    assert_eq!(u64_of(v, "quarter_avail_bytes"), avail / 4);
    let budget = u64_of(v, "budget_bytes");
    assert_eq!(budget, subtractive.max(avail / 4));
    let from = if subtractive >= avail / 4 {
        "subtractive"
    } else {
        "avail / 4"
    };
    assert_eq!(v["budget_from"], from);
    assert!(slot >= vault.max_padded_size() && slot % SLOT_ALIGN == 0);
    let n_entries = vault.entries().len() as u64;
    let mut fitting = avail.min(ram) / slot;
    if v["commit"].as_str().unwrap() != "committed as slots are first loaded" {
        // Committed at open: never past the budget nor 7/8 of avail.
        let committable = u64_of(v, "committable_bytes");
        fitting = fitting.min(budget.min(committable - committable / 8) / slot);
    }
    assert_eq!(
        slots,
        (budget / slot).clamp(64, 4096).min(fitting).min(n_entries),
        "{v}"
    );
}

#[test]
fn cli_json_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "6", "20");
    std::fs::write(path.join("scout.gguf"), vec![0u8; 12345]).unwrap();
    let vault = Vault::open(&path).unwrap();
    let v = budget_json(&[path.to_str().unwrap()]);
    check_json(&v, &vault);
    assert_eq!(u64_of(&v, "scout_bytes"), 12345);
    assert_eq!(u64_of(&v, "engine_overhead_bytes"), 2 * GIB);
    assert_eq!(
        u64_of(&v, "slot_bytes"),
        vault.max_padded_size().next_multiple_of(SLOT_ALIGN)
    );
    // 12 tiny blobs: whatever this machine has, the entry count caps the ring.
    assert_eq!(u64_of(&v, "slots"), 12);
    let s = &v["sources"];
    assert_eq!(s["scout"], format!("scout.* files in {}", path.display()));
    assert_eq!(s["overhead"], "default 2 GiB");
    assert_eq!(s["slots"], "auto, capped at the 12 entries");
    assert!(s["slot"]
        .as_str()
        .unwrap()
        .starts_with("largest padded blob (layer "));
}

/// `--pinned` plans the ring a CUDA host pins (issue 33): not elastic,
/// every page committed after open, so never past 7/8 of what is available
/// and never raised to 64 slots past its budget.
#[test]
fn cli_pinned_plans_a_ring_committed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "300", "4");
    let vault = Vault::open(&path).unwrap();
    let args = [path.to_str().unwrap(), "--slot-mb", "64"];
    let lazy = budget_json(&args);
    assert_eq!(lazy["commit"], "committed as slots are first loaded");
    let v = budget_json(&[&args[..], &["--pinned"]].concat());
    check_json(&v, &vault);
    assert!(v["elastic"].is_null(), "{v}");
    assert!(
        v["commit"].as_str().unwrap().starts_with("pinned"),
        "{}",
        v["commit"]
    );
    let avail = u64_of(&v, "avail_bytes");
    let slots = u64_of(&v, "slots");
    let committable = u64_of(&v, "committable_bytes");
    assert!(committable >= avail, "{v}");
    assert!(
        u64_of(&v, "ring_bytes") <= committable - committable / 8,
        "{v}"
    );
    assert!(
        slots <= (u64_of(&v, "budget_bytes") / (64 * MIB)).max(1),
        "{v}"
    );
    let text = smoe(&[
        "budget",
        path.to_str().unwrap(),
        "--slot-mb",
        "64",
        "--pinned",
    ]);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(stdout.contains("\npages             pinned ("), "{stdout}");
}

#[test]
fn cli_json_overrides_reach_the_clamps() {
    // 2 × 300 small blobs; 64 MiB slots and a scout that eats everything
    // leave avail / 4 as the budget, so the count depends on this machine:
    // check it against the formula, whatever it is.
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "300", "4");
    let vault = Vault::open(&path).unwrap();
    let v = budget_json(&[
        path.to_str().unwrap(),
        "--slot-mb",
        "64",
        "--scout-bytes",
        &u64::MAX.to_string(),
        "--overhead-bytes",
        "12345",
    ]);
    check_json(&v, &vault);
    assert_eq!(u64_of(&v, "slot_bytes"), 64 * MIB);
    assert_eq!(u64_of(&v, "scout_bytes"), u64::MAX);
    assert_eq!(u64_of(&v, "engine_overhead_bytes"), 12345);
    assert_eq!(u64_of(&v, "budget_bytes"), u64_of(&v, "avail_bytes") / 4);
    let s = &v["sources"];
    assert_eq!(
        (&s["scout"], &s["overhead"], &s["slot"]),
        (
            &Value::from("config"),
            &Value::from("config"),
            &Value::from("config slot_mb")
        )
    );
}

#[test]
fn cli_human_lists_every_value_and_source() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "6", "20");
    let out = smoe(&["budget", path.to_str().unwrap(), "--overhead-bytes", "7"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for needle in [
        "avail ",
        "ram ",
        "scout ",
        "engine overhead ",
        "floor ",
        "subtractive ",
        "avail / 4 ",
        "budget ",
        "slot ",
        "slots ",
        "ring ",
        "7 bytes (7 B)  from config",
        "from scout.* files in",
        "from largest padded blob (layer ",
        "capped at the 12 entries",
    ] {
        assert!(stdout.contains(needle), "{needle:?} not in\n{stdout}");
    }
}

/// Each value the text prints is in the JSON, and the text is made of
/// them: the elastic plan, the floor rule, the warning.
#[test]
fn cli_json_holds_every_fact_of_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "6", "20");
    let p = path.to_str().unwrap();
    for extra in [&[][..], &["--no-elastic"]] {
        let mut args = vec![p];
        args.extend_from_slice(extra);
        let human = smoe(&[&["budget"][..], &args].concat());
        assert!(human.status.success(), "{}", text(&human.stderr));
        let human = text(&human.stdout);
        let v = budget_json(&args);
        let line = |key: &str| -> String {
            human
                .lines()
                .find(|l| l.starts_with(&format!("{key:<18}")))
                .unwrap_or_else(|| panic!("no {key} line in\n{human}"))[18..]
                .to_owned()
        };
        assert_eq!(line("vault"), v["vault"].as_str().unwrap());
        assert_eq!(line("entries"), v["entries"].to_string());
        assert_eq!(
            line("under pressure"),
            v["under_pressure"].as_str().unwrap()
        );
        assert!(line("floor").ends_with(v["floor_rule"].as_str().unwrap()));
        // The two runs probe memory apart, so what follows from the
        // available memory may differ between them: only its presence
        // is compared.
        for (key, field, stable) in [
            ("avail", "avail_bytes", false),
            ("ram", "ram_bytes", true),
            ("scout", "scout_bytes", true),
            ("engine overhead", "engine_overhead_bytes", true),
            ("floor", "floor_bytes", true),
            ("subtractive", "subtractive_budget_bytes", false),
            ("avail / 4", "quarter_avail_bytes", false),
            ("budget", "budget_bytes", false),
            ("slot", "slot_bytes", true),
            ("budget / slot", "budget_slots", false),
            ("slots", "slots", true),
            ("ring", "ring_bytes", true),
        ] {
            let first = line(key).split(' ').next().unwrap().to_owned();
            assert!(v[field].is_u64(), "{field}: {v}");
            if stable {
                assert_eq!(first, v[field].to_string(), "{key}");
            } else {
                assert!(first.parse::<u64>().is_ok(), "{key}: {first}");
            }
        }
        if extra.is_empty() {
            let e = &v["elastic"];
            assert!(line("under pressure").starts_with("elastic: "));
            assert_eq!(e["min_active_slots"], 8, "{v}");
        } else {
            assert!(v["elastic"].is_null(), "{v}");
            assert!(line("under pressure").starts_with("fixed ring"));
        }
        assert!(v["warning"].is_null(), "{v}");
    }
}

#[test]
fn cli_sizes_take_units() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "6", "20");
    let p = path.to_str().unwrap();
    let v = budget_json(&[
        p,
        "--overhead-bytes",
        "1536MiB",
        "--scout-bytes",
        "1.5G",
        "--slot-mb",
        "1G",
    ]);
    assert_eq!(u64_of(&v, "engine_overhead_bytes"), 1536 * MIB);
    assert_eq!(u64_of(&v, "scout_bytes"), 3 * GIB / 2);
    assert_eq!(u64_of(&v, "slot_bytes"), GIB);
    let v = budget_json(&[p, "--overhead-bytes", "2GB", "--slot-mb", "64"]);
    assert_eq!(u64_of(&v, "engine_overhead_bytes"), 2_000_000_000);
    assert_eq!(u64_of(&v, "slot_bytes"), 64 * MIB);
    for (flag, bad) in [("--slot-mb", "1.5M"), ("--overhead-bytes", "2 parsecs")] {
        let out = smoe(&["budget", p, flag, bad]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(flag) && stderr.contains(bad), "{stderr}");
    }
}

#[test]
fn cli_slot_mb_too_small_names_the_blob() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "2", "2000");
    let vault = Vault::open(&path).unwrap();
    let first = vault
        .entries()
        .iter()
        .find(|e| e.padded_size == vault.max_padded_size())
        .unwrap();
    let out = smoe(&["budget", "--json", path.to_str().unwrap(), "--slot-mb", "1"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let needle = format!(
    "smoe: slot_mb 1 (1048576 bytes) is smaller than the blob of layer {} expert {} ({} padded bytes)",
    first.layer, first.expert, first.padded_size
);
    assert_eq!(stderr.trim_end(), needle);
}

/// The automatic ring never exceeds what smoe_open accepts: slots of a
/// quarter of the available memory give the few that fit, with a
/// warning (the 64-slot minimum once gave a ring of 16× the memory);
/// a slot larger than all of it is one line and exit 1.
#[test]
fn cli_automatic_ring_takes_what_fits() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "2", "64");
    let p = path.to_str().unwrap();
    let plan = budget_json(&[p]);
    let avail = u64_of(&plan, "avail_bytes");
    let quarter_mb = (avail / 4 / MIB).max(1).to_string();
    let out = smoe(&["budget", "--json", p, "--slot-mb", &quarter_mb]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let big: Value = serde_json::from_slice(&out.stdout).unwrap();
    let slots = u64_of(&big, "slots");
    let slot = u64_of(&big, "slot_bytes");
    assert!((1..64).contains(&slots), "{big}");
    // The warning is in the JSON too, word for word.
    let warning = big["warning"].as_str().unwrap();
    assert_eq!(stderr.trim_end(), format!("smoe: warning: {warning}"));
    assert!(slots * slot <= u64_of(&big, "ram_bytes"), "{big}");
    assert!(
        stderr.starts_with("smoe: warning: the ring has ")
            && stderr.contains("fewer than the automatic minimum of 64"),
        "{stderr}"
    );
    let out = smoe(&["budget", p, "--slot-mb", "4294967295"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("smoe: not even one slot of 4503599626321920 bytes"),
        "{stderr}"
    );
}

#[test]
fn cli_missing_vault_fails_cleanly() {
    let out = smoe(&["budget", "/nonexistent/smoe-vault"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("smoe: ") && stderr.contains("/nonexistent/smoe-vault"));
}
