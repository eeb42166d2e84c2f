//! `smoe budget`, the real binary, on synthetic vaults: its JSON checked
//! against the formula of docs/c-api.md, "Ring sizing", its human output, its errors. The
//! sizing itself is tested over fixed snapshots in the library's
//! `tests/budget.rs`.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use smoe::vault::DEFAULT_ALIGNMENT;

const SLOT_ALIGN: u64 = DEFAULT_ALIGNMENT as u64;
use smoe::vault::Vault;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

// Every test's path contains "budget", so `cargo test --test budget budget`
// runs them all.

/// `smoe budget`, the real binary.
mod budget_cli {
    use super::*;
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
        let want: BTreeSet<&str> = [
            "avail_bytes",
            "ram_bytes",
            "scout_bytes",
            "engine_overhead_bytes",
            "floor_bytes",
            "budget_bytes",
            "slot_bytes",
            "slots",
            "sources",
        ]
        .into();
        assert_eq!(keys, want);
        let sources = v["sources"].as_object().unwrap();
        let source_keys: BTreeSet<&str> = sources.keys().map(String::as_str).collect();
        let want_sources: BTreeSet<&str> =
            ["avail", "ram", "scout", "overhead", "slot", "slots"].into();
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
        let floor = if in_cgroup {
            ram / 8
        } else {
            (ram / 8).max(4 * GIB)
        };
        assert_eq!(u64_of(v, "floor_bytes"), floor);
        let subtractive = avail
            .saturating_sub(scout)
            .saturating_sub(overhead)
            .saturating_sub(u64_of(v, "floor_bytes"));
        let budget = u64_of(v, "budget_bytes");
        assert_eq!(budget, subtractive.max(avail / 4));
        assert!(slot >= vault.max_padded_size() && slot % SLOT_ALIGN == 0);
        let n_entries = vault.entries().len() as u64;
        assert_eq!(slots, (budget / slot).clamp(64, 4096).min(n_entries), "{v}");
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
}
