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

use crate::support;

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
        smoe_test_support::skip::skip(&format!("{} is absent (the shared traces)", p.display()));
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
    for (n, lru, belady, tier) in [
        (25, 0.0, 0.327, 0.150),
        (64, 0.320, 0.604, 0.335),
        (128, 0.557, 0.818, 0.591),
        (256, 0.993, 0.993, 0.993),
    ] {
        let r = at(n);
        // the device tier's rule keeps what one-off experts flush from an LRU
        assert!(
            (r["device_tier"].as_f64().unwrap() - tier).abs() <= 0.001,
            "{r}"
        );
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
    assert!(
        out.contains("Belady") && out.contains("tier") && out.contains("  100.0%"),
        "{out}"
    );
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
    // Four curves: LRU, Belady, smoe's and mmap's waits (LRU once).
    assert!(
        s.matches("<polyline").count() >= 4,
        "{} polylines",
        s.matches("<polyline").count()
    );
    assert!(s.contains("<circle"), "the measured point");
    for label in [
        "LRU",
        "optimum (the limit)",
        "measured by this run (lru)",
        "100 slots: ",
        "smoe",
        "mmap",
    ] {
        assert!(s.contains(label), "legend label {label:?} missing");
    }
    assert!(!s.contains("policy in use"), "the LRU curve is drawn once");
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
    if !support::root_tests(
        "mem_cap_runs_each_side_in_a_memory_cgroup_as_root",
        "a memory cgroup",
    ) {
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
        smoe_test_support::skip_or_fail_root(&format!("no memory cgroup here ({})", err.trim()));
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

// ------------------------------------------- what a run says (issue 23)

/// A Mixtral-shaped vault (32 × 8 experts of 4 KiB) whose metadata says
/// `top_k` 2, as a packed Mixtral's does.
fn top2_vault(dir: &Path) -> PathBuf {
    let v = dir.join("vault");
    let o = synth_shape(&v, "32", "8", "4", &["--top-k", "2"]);
    assert!(o.status.success(), "synth: {}", text(&o.stderr));
    v
}

/// A trace of `tokens` tokens over 32 layers: token t routes layer l to
/// experts (t + l) % 8 and (t + l + 1) % 8, a working set of 64 claims.
fn small_trace(dir: &Path, tokens: u32) -> PathBuf {
    let mut csv = String::from("token,layer,r0,r1,r2,r3\n");
    for t in 0..tokens {
        for l in 0..32 {
            let e = |i: u32| (t + l + i) % 8;
            csv.push_str(&format!("{t},{l},{},{},{},{}\n", e(0), e(1), e(2), e(3)));
        }
    }
    let p = dir.join("trace.csv");
    std::fs::write(&p, csv).unwrap();
    p
}

#[test]
fn top_k_comes_from_the_vaults_metadata_unless_given() {
    let dir = tempfile::tempdir().unwrap();
    let v = top2_vault(dir.path());
    let vs = v.to_str().unwrap();
    let j = json_of(&smoe(&["bench", vs, "--tokens", "4", "--json"]));
    assert_eq!(
        (j["top_k"].as_u64(), j["top_k_from"].as_str()),
        (Some(2), Some("metadata"))
    );
    // 4 tokens × 32 layers × top-2, not every expert of every layer.
    assert_eq!(j["claims"], 256, "{j}");
    let j = json_of(&smoe(&[
        "bench", vs, "--tokens", "4", "--top-k", "3", "--json",
    ]));
    assert_eq!(
        (j["top_k"].as_u64(), j["top_k_from"].as_str()),
        (Some(3), Some("flag"))
    );
    assert_eq!(j["claims"], 384, "{j}");
    // The text says which one is used.
    let o = smoe(&["bench", vs, "--tokens", "4"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_contains(&text(&o.stdout), "× top-2 (from the vault's metadata)");
    let o = smoe(&["bench", vs, "--tokens", "4", "--top-k", "3"]);
    assert_contains(&text(&o.stdout), "× top-3 (from --top-k)");
    // A trace replay and a sweep take it too: only 2 of the trace's 4 ranks.
    let t = small_trace(dir.path(), 3);
    let ts = t.to_str().unwrap();
    let j = json_of(&smoe(&["bench", vs, "--trace", ts, "--json"]));
    assert_eq!(
        (j["top_k"].as_u64(), j["claims"].as_u64()),
        (Some(2), Some(192)),
        "{j}"
    );
    let o = smoe(&["bench", vs, "--trace", ts, "--sweep"]);
    let out = text(&o.stdout);
    assert!(
        out.starts_with("sweep: 3 tokens, 192 demand claims at top-2 (from the vault's metadata)"),
        "{out}"
    );
    assert_contains(
        &out,
        "one token's working set: 32 layers × top-2 = 64 experts",
    );
    // A vault whose metadata has no top_k: the default, said so.
    let bare = dir.path().join("bare");
    let opts = smoe::vault::WriterOptions {
        alignment: 4096,
        checksums: false,
        meta: None,
        vault_id: None,
    };
    let mut w = smoe::vault::VaultWriter::create(&bare, 1, 4, opts).unwrap();
    for e in 0..4 {
        w.add_blob(0, e, &[7u8; 10]).unwrap();
    }
    w.finish().unwrap();
    let o = smoe(&["bench", bare.to_str().unwrap(), "--tokens", "2", "--json"]);
    let j = json_of(&o);
    assert_eq!(
        (j["top_k"].as_u64(), j["top_k_from"].as_str()),
        (Some(4), Some("default"))
    );
}

#[test]
fn a_ring_of_every_expert_or_below_one_token_is_said_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let v = top2_vault(dir.path());
    let vs = v.to_str().unwrap();
    let notes = |o: &Output| -> Vec<String> {
        assert!(o.status.success(), "{}", text(&o.stderr));
        text(&o.stdout)
            .lines()
            .filter(|l| l.starts_with("note: "))
            .map(String::from)
            .collect()
    };
    // The library's ring holds all 256 experts of this small vault.
    let n = notes(&smoe(&["bench", vs, "--tokens", "4"]));
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(
        n[0].contains("hold all 256 experts") && n[0].contains("--ring-slots 64"),
        "{}",
        n[0]
    );
    // 40 slots for 64 claims per token: LRU's worst case, adaptive suggested.
    let t = small_trace(dir.path(), 6);
    let ts = t.to_str().unwrap();
    let n = notes(&smoe(&["bench", vs, "--trace", ts, "--ring-slots", "40"]));
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(
        n[0].contains(
            "40 slots are fewer than one token's working set (32 layers × top-2 = 64 experts)"
        ) && n[0].contains("--policy adaptive"),
        "{}",
        n[0]
    );
    // A ring between the two says nothing.
    assert!(notes(&smoe(&["bench", vs, "--trace", ts, "--ring-slots", "100"])).is_empty());
    // The JSON carries the same notes.
    let j = json_of(&smoe(&[
        "bench",
        vs,
        "--trace",
        ts,
        "--ring-slots",
        "40",
        "--json",
    ]));
    let notes = j["notes"].as_array().unwrap();
    assert_eq!(notes.len(), 1);
    assert!(notes[0].as_str().unwrap().contains("--policy adaptive"));
    assert_eq!(j["working_set"]["layers"], 32);
    assert_eq!(j["working_set"]["top_k"], 2);
}

#[test]
fn an_uncapped_comparison_says_what_each_side_could_hold() {
    let dir = tempfile::tempdir().unwrap();
    let v = top2_vault(dir.path());
    let vs = v.to_str().unwrap();
    let t = small_trace(dir.path(), 4);
    let ts = t.to_str().unwrap();
    let args = [
        "bench",
        vs,
        "--trace",
        ts,
        "--ring-slots",
        "64",
        "--baseline",
        "mmap",
    ];
    let o = smoe(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.starts_with("smoe/mmap wait ratio "))
        .unwrap_or_else(|| panic!("no ratio line in {out}"));
    for needle in [
        "not like for like",
        "mmap could keep the whole vault (4.03 MiB) in the page cache",
        "smoe held 64 slots (1.00 MiB)",
        "--mem-cap SIZE",
    ] {
        assert_contains(line, needle);
    }
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let j = json_of(&smoe(&json_args));
    assert_eq!(j["baseline"]["like_for_like"], false);
    assert_eq!(j["baseline"]["vault_bytes"], 4227072);
    assert_eq!(j["ring_bytes"], 64 * 16384);
    // With --mem-cap not enforced (--no-isolation) it is not like for like
    // either, and the cap is named as written.
    let env = [("SMOE_CGROUP_ROOT", "/nonexistent/smoe-cgroup")];
    let mut capped = args.to_vec();
    capped.extend(["--mem-cap", "200M", "--no-isolation"]);
    let o = smoe_env(&capped, &env);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert_contains(&out, "not like for like");
    assert_contains(
        &out,
        "memory: uncapped, warm page cache (--mem-cap 200M not enforced)",
    );
    let err = text(&o.stderr);
    assert!(
        err.starts_with("smoe: warning: --mem-cap 200M is not enforced"),
        "{err}"
    );
}

#[test]
fn size_flags_take_units() {
    let dir = tempfile::tempdir().unwrap();
    let v = top2_vault(dir.path());
    let vs = v.to_str().unwrap();
    let t = small_trace(dir.path(), 2);
    let ts = t.to_str().unwrap();
    let env = [("SMOE_CGROUP_ROOT", "/nonexistent/smoe-cgroup")];
    for (cap, bytes) in [
        ("200M", 200u64 << 20),
        ("1.5G", 3 << 29),
        ("1536MiB", 1536 << 20),
        ("2GB", 2_000_000_000),
        ("67108864", 1 << 26),
    ] {
        let o = smoe_env(
            &[
                "bench",
                vs,
                "--trace",
                ts,
                "--mem-cap",
                cap,
                "--no-isolation",
                "--json",
            ],
            &env,
        );
        assert_eq!(json_of(&o)["mem_cap_bytes"], bytes, "{cap}");
    }
    for bad in ["12parsecs", "-5", "0", "18446744073709551616"] {
        let o = smoe(&["bench", vs, "--trace", ts, "--mem-cap", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        let err = text(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("smoe: ") && err.contains("--mem-cap") && err.contains(bad),
            "{err}"
        );
    }
}

/// Runs `smoe ARGS` under a pseudo-terminal (script(1)), so that stderr is
/// a terminal; what the terminal showed, or None without script(1).
fn on_a_terminal(args: &[&str]) -> Option<String> {
    let quoted: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_smoe"))
        .chain(args.iter().copied())
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    // stdout goes to /dev/null: the terminal shows stderr alone.
    let command = format!("{} >/dev/null", quoted.join(" "));
    let o = Command::new("script")
        .args(["-qefc", &command, "/dev/null"])
        .output()
        .ok()?;
    assert!(o.status.success(), "script: {}", text(&o.stderr));
    Some(text(&o.stdout))
}

#[test]
fn progress_bars_show_on_a_terminal_only_and_not_with_json() {
    let dir = tempfile::tempdir().unwrap();
    let v = top2_vault(dir.path());
    let vs = v.to_str().unwrap();
    let t = small_trace(dir.path(), 200);
    let ts = t.to_str().unwrap();
    let run = [
        "bench",
        vs,
        "--trace",
        ts,
        "--ring-slots",
        "40",
        "--baseline",
        "mmap",
    ];
    let Some(shown) = on_a_terminal(&run) else {
        smoe_test_support::skip_or_fail("no script(1) here (Debian's bsdutils has it)");
        return;
    };
    for bar in ["  replay [", "    mmap [", "/200"] {
        assert_contains(&shown, bar);
    }
    let shown = on_a_terminal(&["bench", vs, "--trace", ts, "--sweep"]).unwrap();
    assert_contains(&shown, "   sweep [");
    // Not with --json, and never into a pipe.
    let mut json = run.to_vec();
    json.push("--json");
    let shown = on_a_terminal(&json).unwrap();
    assert!(!shown.contains('['), "{shown:?}");
    let o = smoe(&run);
    assert!(o.status.success());
    assert!(o.stderr.is_empty(), "{}", text(&o.stderr));
}

/// The text elements of an SVG as a renderer reads them (usvg, resvg's
/// parser), with the font database it renders them with.
fn svg_texts(svg: &str) -> (Vec<String>, resvg::usvg::Tree) {
    let mut opt = resvg::usvg::Options::default();
    let db = opt.fontdb_mut();
    db.load_system_fonts();
    // plotters asks for "sans-serif"; give it a sans face this machine has.
    let sans = db
        .faces()
        .flat_map(|f| f.families.iter().map(|(name, _)| name.clone()))
        .find(|name| name.contains("Sans"));
    if let Some(sans) = sans {
        db.set_sans_serif_family(sans);
    }
    let tree = resvg::usvg::Tree::from_str(svg, &opt).expect("usvg parses the plot");
    fn walk(group: &resvg::usvg::Group, out: &mut Vec<String>) {
        for node in group.children() {
            match node {
                resvg::usvg::Node::Group(g) => walk(g, out),
                resvg::usvg::Node::Text(t) => out.push(
                    t.chunks()
                        .iter()
                        .map(|c| c.text())
                        .collect::<String>()
                        .trim()
                        .to_owned(),
                ),
                _ => {}
            }
        }
    }
    let mut texts = Vec::new();
    walk(tree.root(), &mut texts);
    if opt.fontdb.is_empty() {
        // Without a font usvg drops every text: read them from the SVG.
        println!("note: no system font; the plot's texts are read from the SVG itself");
        texts = raw_svg_texts(svg);
    } else {
        // The fallback reads what the renderer reads.
        assert_eq!(raw_svg_texts(svg), texts);
    }
    (texts, tree)
}

/// The contents of the `<text>` elements of `svg` (plotters writes each on
/// a line of its own), entities decoded.
fn raw_svg_texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..t.find("</text>")?];
            let body = body
                .replace("&apos;", "'")
                .replace("&#39;", "'")
                .replace("&quot;", "\"")
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&");
            Some(body.trim().to_owned())
        })
        .collect()
}

/// Renders `tree` to a PNG at `png`; the pixels.
fn render_png(tree: &resvg::usvg::Tree, png: &Path) -> resvg::tiny_skia::Pixmap {
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(
        tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    pixmap.save_png(png).unwrap();
    pixmap
}

/// The plot rendered to PNG as a viewer would: each series once in the
/// legend, tick labels without `.0`, the names, the working set and the
/// measured point labelled. `SMOE_PLOT_PNG_DIR=DIR` keeps the PNGs there
/// to look at.
#[test]
fn the_plot_renders_with_each_series_once_and_plain_ticks() {
    let dir = tempfile::tempdir().unwrap();
    let v = top2_vault(dir.path());
    let vs = v.to_str().unwrap();
    let t = match trace() {
        Some(t) => t,
        None => small_trace(dir.path(), 60),
    };
    let ts = t.to_str().unwrap();
    let keep = std::env::var_os("SMOE_PLOT_PNG_DIR").map(PathBuf::from);
    let png_dir = keep.clone().unwrap_or_else(|| dir.path().to_path_buf());
    for (name, extra) in [
        (
            "replay",
            &[
                "--ring-slots",
                "64",
                "--max-tokens",
                "120",
                "--baseline",
                "mmap",
            ][..],
        ),
        ("sweep", &["--sweep"][..]),
    ] {
        let svg = dir.path().join(format!("{name}.svg"));
        let mut args = vec![
            "bench",
            vs,
            "--trace",
            ts,
            "--plot",
            svg.to_str().unwrap(),
            "--json",
        ];
        args.extend_from_slice(extra);
        json_of(&smoe(&args));
        let (texts, tree) = svg_texts(&std::fs::read_to_string(&svg).unwrap());
        let count = |wanted: &str| texts.iter().filter(|t| t.as_str() == wanted).count();
        let starting = |prefix: &str| texts.iter().filter(|t| t.starts_with(prefix)).count();
        let mut legend = vec![
            ("LRU", count("LRU")),
            ("Belady", count("Belady's optimum (the limit)")),
            (
                "out of reach",
                count("above Belady: out of any policy's reach"),
            ),
            (
                "working set",
                count("one token's working set: 32 layers × top-2 = 64 experts"),
            ),
        ];
        if name == "replay" {
            legend.extend([
                ("measured", count("measured by this run (lru)")),
                ("smoe", count("smoe, 64 slots")),
                ("mmap", count("mmap, page cache")),
            ]);
            assert_eq!(
                starting("64 slots: "),
                1,
                "the measured point's label: {texts:?}"
            );
        } else {
            assert_eq!(
                starting("measured"),
                0,
                "a sweep measures nothing: {texts:?}"
            );
        }
        for (series, n) in legend {
            assert_eq!(n, 1, "{name}: legend entry {series} {n} times: {texts:?}");
        }
        assert_eq!(starting("Hit rate against ring size: "), 1, "{texts:?}");
        let title = texts.iter().find(|t| t.starts_with("Hit rate")).unwrap();
        assert!(
            title.contains(&format!(
                "trace {}, vault vault",
                t.file_name().unwrap().to_str().unwrap()
            )),
            "{title}"
        );
        // Tick labels: numbers, none with a pointless ".0".
        let ticks: Vec<&String> = texts.iter().filter(|t| t.parse::<f64>().is_ok()).collect();
        assert!(ticks.len() >= 20, "{name}: ticks {ticks:?}");
        for t in &ticks {
            assert!(
                !t.ends_with(".0") && !t.contains(".0 "),
                "{name}: tick {t:?}"
            );
        }
        for pct in ["0", "20", "50", "100"] {
            assert!(
                ticks.iter().any(|t| t.as_str() == pct),
                "{name}: no tick {pct}: {ticks:?}"
            );
        }
        let png = png_dir.join(format!("{name}.png"));
        let pixmap = render_png(&tree, &png);
        let pixels = pixmap.pixels();
        let inked = pixels
            .iter()
            .filter(|p| p.red() < 200 || p.green() < 200 || p.blue() < 200)
            .count();
        assert!(
            inked * 100 > pixels.len(),
            "{name}: the PNG is almost blank ({inked} pixels)"
        );
        // The LRU curve's colour is there: drawn, not only declared.
        let lru = pixels
            .iter()
            .filter(|p| (p.red(), p.green(), p.blue()) == (76, 114, 176))
            .count();
        assert!(lru > 100, "{name}: {lru} LRU-coloured pixels");
    }
}

// ------------------------------------ --mem-cap's memory cgroups (issue 33)

/// A memory cgroup of one test's own, made under this process's (v1's
/// memory hierarchy, else cgroup v2's), where the test's capped runs make
/// theirs (`SMOE_CGROUP_ROOT`). On drop, the processes left in its children
/// are killed (the test started them) and the children and it removed.
struct TestCgroup {
    dir: PathBuf,
}

impl TestCgroup {
    /// `None`, with a note, where no memory cgroup can be made here.
    fn new(name: &str) -> Option<TestCgroup> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mount = |kind: &str, option: Option<&str>| {
            mounts.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let matches = f.len() > 3
                    && f[2] == kind
                    && option.is_none_or(|o| f[3].split(',').any(|x| x == o));
                matches.then(|| PathBuf::from(f[1]))
            })
        };
        let own_path = |wanted: &dyn Fn(&str) -> bool| {
            own.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                wanted(controllers).then(|| path.trim_start_matches('/').to_owned())
            })
        };
        let (mount, own) = match mount("cgroup", Some("memory")) {
            Some(m) => (m, own_path(&|c| c.split(',').any(|c| c == "memory"))),
            None => match mount("cgroup2", None) {
                Some(m) => (m, own_path(&|c| c.is_empty())),
                None => {
                    smoe_test_support::skip_or_fail_root("no memory cgroup is mounted");
                    return None;
                }
            },
        };
        let parent = mount.join(own.unwrap_or_default());
        if parent.join("cgroup.subtree_control").is_file() {
            // v2: children get the memory controller only when it is
            // delegated (impossible where this cgroup holds processes).
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory");
        }
        let dir = parent.join(format!("smoe-test-{name}-{}", std::process::id()));
        if let Err(e) = std::fs::create_dir(&dir) {
            smoe_test_support::skip_or_fail_root(&format!("cannot make {}: {e}", dir.display()));
            return None;
        }
        let cg = TestCgroup { dir };
        let controllers = std::fs::read_to_string(cg.dir.join("cgroup.controllers"));
        if controllers.is_ok_and(|c| !c.split_whitespace().any(|c| c == "memory")) {
            smoe_test_support::skip_or_fail_root(&format!(
                "{} has no memory controller",
                cg.dir.display()
            ));
            return None;
        }
        Some(cg)
    }

    /// The cgroups made under it.
    fn children(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        dirs.sort();
        dirs
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for child in self.children() {
            let procs = std::fs::read_to_string(child.join("cgroup.procs")).unwrap_or_default();
            // cgroup.procs lists 0 for a process outside this pid
            // namespace, and kill(0) would kill this test's own group.
            let pids = procs.lines().filter_map(|p| p.trim().parse::<i32>().ok());
            for pid in pids.filter(|&pid| pid > 0) {
                // SAFETY: kill has no memory preconditions; these are
                // processes this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            for _ in 0..250 {
                if std::fs::remove_dir(&child).is_ok() || !child.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A trace of `tokens` tokens over layers 1 to 3 of [`support::synth`]'s
/// vault, top-2, each row two experts the previous one did not name.
fn rotating_trace(path: &Path, tokens: u32) {
    let mut csv = String::from("token,layer,r0,r1\n");
    for t in 0..tokens {
        for l in 1..4 {
            csv.push_str(&format!("{t},{l},{},{}\n", (t + l) % 6, (t + l + 3) % 6));
        }
    }
    std::fs::write(path, csv).unwrap();
}

/// SIGINT (Ctrl-C) or SIGTERM during a capped run stops it, removes the
/// memory cgroup of the side that was running, and exits 1 with one line;
/// the cgroup was once left behind, and nothing ever removed it.
#[test]
fn mem_cap_removes_its_cgroup_on_a_signal() {
    let name = "mem_cap_removes_its_cgroup_on_a_signal";
    if !support::root_tests(name, "a memory cgroup") {
        return;
    }
    let Some(cg) = TestCgroup::new("signal") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let v = support::synth(dir.path(), &[]);
    let t = dir.path().join("long.csv");
    // Long enough that the run is still in its first side when signalled
    // (a whole run takes over a minute); the cap of 1G holds the side's
    // parsed trace (some 75 MB), so the kernel never kills it first.
    rotating_trace(&t, 300_000);
    // Into a file, not a pipe: a side the run left behind would hold a
    // pipe open, and reading it would wait for that side to end.
    let log = dir.path().join("stderr.txt");
    let said = || std::fs::read_to_string(&log).unwrap();
    for (signal, signal_name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let mut run = Command::new(env!("CARGO_BIN_EXE_smoe"))
            .args(["bench", v.to_str().unwrap(), "--trace", t.to_str().unwrap()])
            .args(["--top-k", "2", "--ring-slots", "2", "--mem-cap", "1G"])
            .args(["--baseline", "mmap", "--json"])
            .env("SMOE_CGROUP_ROOT", &cg.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let side = cg.dir.join(format!("smoe-bench-{}-smoe", run.id()));
        let start = std::time::Instant::now();
        // Until the side's process is in its cgroup.
        while std::fs::read_to_string(side.join("cgroup.procs")).map_or(true, |p| p.is_empty()) {
            if let Some(status) = run.try_wait().unwrap() {
                panic!("{signal_name}: the run ended ({status}) first: {}", said());
            }
            assert!(
                start.elapsed().as_secs() < 60,
                "no cgroup at {}",
                side.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // SAFETY: kill has no memory preconditions; `run` is this test's
        // child, not yet waited for.
        assert_eq!(unsafe { libc::kill(run.id() as i32, signal) }, 0);
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(status) = run.try_wait().unwrap() {
                break status;
            }
            if start.elapsed().as_secs() >= 10 {
                let _ = run.kill();
                panic!("{signal_name}: the run did not stop within 10 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let err = said();
        assert!(!side.exists(), "{signal_name}: {} is left", side.display());
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), None, "{signal_name}: killed: {err}");
        }
        assert_eq!(status.code(), Some(1), "{signal_name}: {err}");
        // The side may have said the streamer's warnings first.
        let said: Vec<&str> = err
            .lines()
            .filter(|l| !l.starts_with("smoe: warning: "))
            .collect();
        assert_eq!(said.len(), 1, "{signal_name}: {err}");
        assert!(
            said[0].starts_with("smoe: interrupted"),
            "{signal_name}: {err}"
        );
        assert!(cg.children().is_empty(), "{:?}", cg.children());
    }
}

/// A capped run first removes the cgroups earlier runs left: named
/// `smoe-bench-<pid>-<side>`, whose pid is no live process and which hold
/// no process. One named after a live process, or holding one, is kept.
#[test]
fn mem_cap_removes_stale_cgroups_of_dead_runs_only() {
    let name = "mem_cap_removes_stale_cgroups_of_dead_runs_only";
    if !support::root_tests(name, "a memory cgroup") {
        return;
    }
    let Some(cg) = TestCgroup::new("stale") else {
        return;
    };
    let dead = {
        let mut gone = Command::new("true").spawn().unwrap();
        let pid = gone.id();
        gone.wait().unwrap();
        pid
    };
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let stale = [
        format!("smoe-bench-{dead}-smoe"),
        format!("smoe-bench-{dead}-mmap"),
    ];
    let kept = [
        format!("smoe-bench-{}-smoe", std::process::id()),
        format!("smoe-bench-{}-mmap", sleeper.id()),
        format!("smoe-bench-{dead}-busy"),
        "smoe-bench-x-smoe".to_owned(),
        "other".to_owned(),
    ];
    for n in stale.iter().chain(&kept) {
        std::fs::create_dir(cg.dir.join(n)).unwrap();
    }
    let busy = cg.dir.join(&kept[2]).join("cgroup.procs");
    std::fs::write(&busy, sleeper.id().to_string()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let v = support::synth(dir.path(), &[]);
    let t = dir.path().join("t.csv");
    rotating_trace(&t, 20);
    let o = smoe_env(
        &[
            "bench",
            v.to_str().unwrap(),
            "--trace",
            t.to_str().unwrap(),
            "--top-k",
            "2",
            "--ring-slots",
            "2",
            "--mem-cap",
            "64M",
            "--json",
        ],
        &[("SMOE_CGROUP_ROOT", cg.dir.to_str().unwrap())],
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let j = json_of(&o);
    assert!(
        j["isolation"].as_str().unwrap().starts_with("cgroup v"),
        "{j}"
    );
    let mut want: Vec<PathBuf> = kept.iter().map(|n| cg.dir.join(n)).collect();
    want.sort();
    assert_eq!(cg.children(), want);
}
