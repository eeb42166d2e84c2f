//! `smoe bench --trace` against its simulators and the mmap baseline: the
//! sweep's figures on the shared Mixtral trace, measured coverage equal to
//! the simulated exact LRU, the JSON keys, the SVG plot, and `--mem-cap`
//! (capped as root; refused with one line where it cannot isolate).
//!
//! The trace is read from ../shared/traces relative to the repository and is
//! never copied into it; without it these tests print a note and pass.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use support::{assert_contains, smoe, synth_shape, text};

mod support;

fn smoe_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_smoe"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the smoe binary runs")
}

fn trace() -> Option<PathBuf> {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/mixtral-8x7b-decode.csv");
    if p.is_file() {
        Some(p)
    } else {
        println!("note: {} is absent; skipping", p.display());
        None
    }
}

/// A Mixtral-shaped synthetic vault (32 layers × 8 experts) of small blobs.
fn vault(dir: &Path, blob_kib: &str) -> PathBuf {
    let v = dir.join("vault");
    let o = synth_shape(&v, "32", "8", blob_kib, &[]);
    assert!(o.status.success(), "synth: {}", text(&o.stderr));
    v
}

/// `smoe bench V --trace T --top-k 2 EXTRA...`.
fn bench_trace(v: &Path, t: &Path, extra: &[&str]) -> Output {
    bench_trace_env(v, t, extra, &[])
}

/// [`bench_trace`] with environment variables set.
fn bench_trace_env(v: &Path, t: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut args = vec![
        "bench",
        v.to_str().unwrap(),
        "--trace",
        t.to_str().unwrap(),
        "--top-k",
        "2",
    ];
    args.extend_from_slice(extra);
    smoe_env(&args, env)
}

fn json_of(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        text(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o.stdout)))
}

#[test]
fn sweep_gives_the_reference_lru_and_belady_figures() {
    let Some(t) = trace() else { return };
    let dir = tempfile::tempdir().unwrap();
    let v = vault(dir.path(), "4");
    let o = bench_trace(&v, &t, &["--sweep", "--ring-slots", "25", "--json"]);
    let j = json_of(&o);
    assert_eq!(j["mode"], "sweep");
    let rows = j["rows"].as_array().unwrap();
    let at = |n: u64| {
        rows.iter()
            .find(|r| r["ring_slots"].as_u64() == Some(n))
            .unwrap_or_else(|| panic!("no row for {n} slots"))
            .clone()
    };
    for (n, lru, belady) in [
        (25, 0.0, 0.327),
        (64, 0.320, 0.604),
        (128, 0.557, 0.818),
        (256, 0.993, 0.993),
    ] {
        let r = at(n);
        assert!((r["lru"].as_f64().unwrap() - lru).abs() <= 0.001, "{r}");
        assert!(
            (r["belady"].as_f64().unwrap() - belady).abs() <= 0.001,
            "{r}"
        );
        assert!(
            r.get("lru_policy").is_none(),
            "no simulated curve but LRU and Belady"
        );
    }
    assert_eq!(rows.first().unwrap()["ring_slots"], 13);
    // The text table has a row per size.
    let o = bench_trace(&v, &t, &["--sweep"]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    assert!(out.contains("Belady") && out.contains("  100.0%"), "{out}");
}

#[test]
fn measured_coverage_equals_simulated_lru_and_the_baseline_and_plot_are_reported() {
    let Some(t) = trace() else { return };
    let dir = tempfile::tempdir().unwrap();
    let v = vault(dir.path(), "4");
    for slots in ["25", "64", "100"] {
        let o = bench_trace(&v, &t, &["--ring-slots", slots, "--json"]);
        let j = json_of(&o);
        let coverage = j["coverage"].as_f64().unwrap();
        let lru = j["sim"]["lru"].as_f64().unwrap();
        assert!(
            (coverage - lru).abs() <= 0.01,
            "{slots} slots: measured {coverage}, simulated LRU {lru}"
        );
        assert!(j["sim"]["belady"].as_f64().unwrap() >= lru);
        assert_eq!(j["policy"], "lru");
        assert!(j["mem_cap_bytes"].is_null());
        assert!(j.get("baseline").is_none());
        for key in [
            "tokens",
            "claims",
            "hits",
            "bytes_read",
            "seconds",
            "gb_per_s",
            "wait_mean_ms",
            "wait_p99_ms",
            "ring_slots",
            "direct_io",
        ] {
            assert!(j.get(key).is_some(), "missing {key}: {j}");
        }
    }
    let svg = dir.path().join("plot.svg");
    let o = bench_trace(
        &v,
        &t,
        &[
            "--ring-slots",
            "100",
            "--max-tokens",
            "40",
            "--baseline",
            "mmap",
            "--plot",
            svg.to_str().unwrap(),
            "--json",
        ],
    );
    let j = json_of(&o);
    assert_eq!(j["tokens"], 40);
    assert_eq!(j["baseline"]["kind"], "mmap");
    for key in ["wait_mean_ms", "wait_p99_ms", "seconds"] {
        assert!(j["baseline"][key].as_f64().is_some(), "baseline.{key}: {j}");
    }
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.trim_start().starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    // Balanced: every opened element is closed (a cheap well-formedness check).
    assert_eq!(s.matches("<text").count(), s.matches("</text>").count());
    // Five series: LRU, Belady, the policy, smoe's and mmap's waits.
    assert!(
        s.matches("<polyline").count() >= 5,
        "{} polylines",
        s.matches("<polyline").count()
    );
    assert!(s.contains("<circle"), "the measured point");
    for label in [
        "LRU",
        "Belady (optimal)",
        "policy in use (lru)",
        "measured: 100 slots",
        "smoe",
        "mmap",
    ] {
        assert!(s.contains(label), "legend label {label:?} missing");
    }
    // Text output: smoe, mmap and Belady side by side with the ratio.
    let o = bench_trace(
        &v,
        &t,
        &[
            "--max-tokens",
            "20",
            "--ring-slots",
            "100",
            "--baseline",
            "mmap",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for w in ["smoe", "mmap", "Belady", "smoe/mmap wait ratio"] {
        assert!(out.contains(w), "{w} missing from {out}");
    }
}

#[test]
fn comparison_flags_need_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let v = vault(dir.path(), "4");
    for flag in [
        &["--sweep"][..],
        &["--baseline", "mmap"],
        &["--mem-cap", "1000000"],
    ] {
        let mut args = vec!["bench", v.to_str().unwrap()];
        args.extend_from_slice(flag);
        let o = smoe(&args);
        assert_eq!(o.status.code(), Some(2), "{flag:?}");
        assert_contains(&text(&o.stderr), "needs --trace");
    }
}

#[test]
fn mem_cap_is_refused_in_one_line_where_it_cannot_isolate() {
    let Some(t) = trace() else { return };
    let dir = tempfile::tempdir().unwrap();
    let v = vault(dir.path(), "4");
    let base = [
        "--max-tokens",
        "10",
        "--mem-cap",
        "67108864",
        "--baseline",
        "mmap",
    ];
    let env = [("SMOE_CGROUP_ROOT", "/nonexistent/smoe-cgroup")];
    let o = bench_trace_env(&v, &t, &base, &env);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("smoe: cannot cap memory: "), "{err}");
    assert!(err.contains("--no-isolation"), "{err}");
    // --no-isolation runs uncapped and warm, and says so.
    let mut args = base.to_vec();
    args.extend(["--no-isolation", "--json"]);
    let j = json_of(&bench_trace_env(&v, &t, &args, &env));
    assert_eq!(j["isolation"], "none");
    assert_eq!(j["mem_cap_bytes"], 67108864);
    assert_eq!(j["baseline"]["kind"], "mmap");
}

#[test]
fn mem_cap_runs_each_side_in_a_memory_cgroup_as_root() {
    let Some(t) = trace() else { return };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("note: not root; skipping the capped run");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let v = vault(dir.path(), "256");
    let o = bench_trace(
        &v,
        &t,
        &[
            "--max-tokens",
            "30",
            "--mem-cap",
            "67108864",
            "--baseline",
            "mmap",
            "--json",
        ],
    );
    let err = text(&o.stderr);
    if o.status.code() == Some(1) && err.contains("cannot cap memory") {
        println!("note: no memory cgroup here ({}); skipping", err.trim());
        return;
    }
    let j = json_of(&o);
    assert!(
        j["isolation"].as_str().unwrap().starts_with("cgroup v"),
        "{j}"
    );
    assert_eq!(j["mem_cap_bytes"], 67108864);
    // 64 MiB with 10% headroom holds 230 slots of 256 KiB.
    assert_eq!(j["ring_slots"], 230);
    assert_eq!(j["tokens"], 30);
    assert_eq!(j["baseline"]["kind"], "mmap");
    for key in ["wait_mean_ms", "wait_p99_ms", "seconds"] {
        assert!(j["baseline"][key].as_f64().is_some());
    }
    for key in ["lru", "belady"] {
        assert!(j["sim"][key].as_f64().is_some());
    }
}
