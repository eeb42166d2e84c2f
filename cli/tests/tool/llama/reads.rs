//! How the reads are ordered: the adaptive policy, layer-ahead in
//! prefill, a ring that holds the model, a ring shrunk mid-batch.

use super::*;

/// The adaptive eviction policy changes which experts stay, never what is
/// computed: the same logits as stock, and as many claims as with LRU.
#[test]
fn adaptive_policy_keeps_output_identical() {
    let Some(Setup {
        bin,
        gguf,
        tmp,
        vault,
    }) = setup("mixtral-q8_0.gguf")
    else {
        return;
    };
    let v = vault.to_str().unwrap();
    let stock = run(&bin, &gguf, tmp.path(), "stock", &[("SMOE_NO_REPACK", "1")]);
    let adaptive = run(
        &bin,
        &gguf,
        tmp.path(),
        "adaptive",
        &[
            ("SMOE_NO_REPACK", "1"),
            ("SMOE_VAULT", v),
            ("SMOE_RING_SLOTS", "3"),
            ("SMOE_POLICY", "1"),
        ],
    );
    assert!(adaptive.out.status.success(), "{}", adaptive.stderr());
    assert_eq!(adaptive.stdout(), stock.stdout());
    assert!(!stock.logits.is_empty() && stock.logits.len() == adaptive.logits.len());
    assert!(
        stock
            .logits
            .iter()
            .zip(&adaptive.logits)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "logits differ under the adaptive policy"
    );
    let bad = run(
        &bin,
        &gguf,
        tmp.path(),
        "bad-policy",
        &[("SMOE_VAULT", v), ("SMOE_POLICY", "2")],
    );
    assert!(!bad.out.status.success());
    assert!(bad.stderr().contains("SMOE_POLICY"), "{}", bad.stderr());
}

/// Layer-ahead (prefill): while a batch that routes to more than half of
/// layer L's experts computes it, the glue reads layer L+1's experts as
/// speculation (a decoded token's 2 of 16 never do). The logits stay
/// bitwise equal to stock's, with it and without (`SMOE_LAYER_AHEAD=0`).
/// SMOE_SPECULATE, the same-ids guess it replaces, is refused by name
/// (`bad_settings_are_refused`).
#[test]
fn layer_ahead_reads_keep_output_identical() {
    let Some(Setup {
        bin,
        gguf,
        tmp,
        vault,
    }) = setup("qwen3moe-q8_0.gguf")
    else {
        return;
    };
    let stock = run_prompt(
        &bin,
        &gguf,
        tmp.path(),
        "stock",
        LONG_PROMPT,
        &[("SMOE_NO_REPACK", "1")],
    );
    // 24 slots: a layer's 16 experts and 8 read ahead for the next. No
    // lookahead (decode's guesses: tests in lookahead.rs), so that every
    // speculative read is prefill's.
    let smoe_env = |ahead: &'static str| {
        [
            ("SMOE_NO_REPACK", "1"),
            ("SMOE_VAULT", vault.to_str().unwrap()),
            ("SMOE_RING_SLOTS", "24"),
            ("SMOE_LAYER_AHEAD", ahead),
            ("SMOE_LOOKAHEAD", "0"),
        ]
    };
    let ahead = run_prompt(
        &bin,
        &gguf,
        tmp.path(),
        "ahead",
        LONG_PROMPT,
        &smoe_env("1"),
    );
    let plain = run_prompt(
        &bin,
        &gguf,
        tmp.path(),
        "plain",
        LONG_PROMPT,
        &smoe_env("0"),
    );
    for (name, r) in [("layer-ahead", &ahead), ("no layer-ahead", &plain)] {
        assert!(r.out.status.success(), "{name}: {}", r.stderr());
        assert_eq!(r.stdout(), stock.stdout(), "{name}: tokens differ");
        assert!(same_logits(&stock, r), "{name}: logits differ from stock");
    }
    let counter = |r: &Run, after: &str| counter(&r.stderr(), after);
    // one set: the prompt's batch, from the first of the fixture's 2
    // layers to the second; none from the 31 decoded tokens
    assert_eq!(
        counter(&ahead, " layer-ahead sets"),
        1,
        "{}",
        ahead.stderr()
    );
    // (whether its reads start before layer 1's own claims settle it depends on
    // timing: bets begin only while no demand read is in progress, and a bet the
    // real set makes stale is dropped unread)
    assert_eq!(counter(&plain, " layer-ahead sets"), 0);
    assert_eq!(counter(&plain, " speculative"), 0);
}

/// Layer-ahead reads as deep as the ring holds: on the 8-layer model
/// (16 experts a layer; the long prompt routes to more than half of each
/// layer's, S of them), a ring of 64 slots holds a layer's set and 64 - S
/// more: three layers' experts and, when S < 16, part of a fourth, so a
/// broad prompt batch reads 3 or 4 layers ahead; `SMOE_LAYER_AHEAD=2`
/// stops at 2, and a ring of 24 slots (8 to 15 beside a layer's set) reads
/// part of the next layer only. Stock's tokens and logits, bit for bit,
/// every time: speculation only changes what is read when. (That a load
/// nobody claimed yet goes only after every idle claimed slot, which makes
/// the ring's room the bound, is the library's victim order:
/// `unclaimed_loads_go_last_until_stale` in src/streamer/slots/victim.rs.)
#[test]
fn layer_ahead_reads_as_many_layers_as_the_ring_holds() {
    let Some(s) = setup("derived/qwen3moe-q8_0-8layers.gguf") else {
        return;
    };
    let stock = run_long(&s, "stock", 2, &[]);
    assert!(stock.out.status.success(), "{}", stock.stderr());
    for (slots, ahead, deepest) in [
        ("64", None, 3..=4),
        ("64", Some("1"), 1..=1),
        ("64", Some("2"), 2..=2),
        ("24", None, 1..=1),
    ] {
        let name = format!("smoe-{slots}-{}", ahead.unwrap_or("default"));
        let mut env = Source::Vault.env(&s.gguf, &s.vault);
        env.push(("SMOE_RING_SLOTS", slots));
        if let Some(ahead) = ahead {
            env.push(("SMOE_LAYER_AHEAD", ahead));
        }
        let smoe = run_long(&s, &name, 2, &env);
        let err = smoe.stderr();
        assert!(smoe.out.status.success(), "{name}: {err}");
        assert_eq!(smoe.stdout(), stock.stdout(), "{name}: tokens differ");
        assert!(
            same_logits(&stock, &smoe),
            "{name}: logits differ from stock"
        );
        assert!(
            deepest.contains(&counter(&err, " layers ahead at most")),
            "{name}: not {deepest:?} layers ahead: {err}"
        );
        assert!(counter(&err, " speculative") > 0, "{name}: {err}");
        println!("{name}: {}", smoe_line(&err));
    }
}

/// A ring that holds the whole model (128 slots for the 8-layer model's
/// 128 experts): one wave a layer, no spare wave for misses. With one
/// thread and with two, prompt and decode: stock's text and bitwise logits
/// (stock at the same thread count), no eviction, and no expert read
/// twice: at most 128 reads (the long prompt and the decoded tokens use
/// most of them; which exactly depends on the routing, and on whether a
/// layer's batch was broad enough to read the next layer ahead).
#[test]
fn ring_holding_the_model_reads_each_expert_once_identical() {
    ring_holding_the_model(Source::Vault);
}

/// [`ring_holding_the_model_reads_each_expert_once_identical`] with the
/// experts read from the GGUF in place (`SMOE=1`).
#[test]
fn in_place_ring_holding_the_model_reads_each_expert_once_identical() {
    ring_holding_the_model(Source::Model);
}

fn ring_holding_the_model(source: Source) {
    let fixture = "derived/qwen3moe-q8_0-8layers.gguf";
    let Some(s) = (if source == Source::Vault {
        setup(fixture)
    } else {
        setup_in_place(fixture)
    }) else {
        return;
    };
    for threads in [1, 2] {
        let stock = run_long(&s, &format!("stock-{threads}"), threads, &[]);
        let mut env = source.env(&s.gguf, &s.vault);
        env.push(("SMOE_RING_SLOTS", "128"));
        let smoe = run_long(&s, &format!("smoe-{threads}"), threads, &env);
        let err = smoe.stderr();
        assert!(
            stock.out.status.success(),
            "stock -t {threads}: {}",
            stock.stderr()
        );
        assert!(smoe.out.status.success(), "-t {threads}: {err}");
        assert_eq!(smoe.stdout(), stock.stdout(), "-t {threads}: tokens differ");
        assert!(
            same_logits(&stock, &smoe),
            "-t {threads}: logits differ from stock"
        );
        assert_eq!(waves_per_layer(&err), 1.0, "-t {threads}: {err}");
        assert_eq!(evictions(&err), 0, "-t {threads}: {err}");
        let reads = counter(&err, " demand")
            + counter(&err, " speculative")
            + counter(&err, " pre-warm reads");
        assert!(reads <= 128, "-t {threads}: {reads} reads: {err}");
        assert!(reads >= 64, "-t {threads}: only {reads} reads: {err}");
    }
}

/// The ring shrinking in the middle of a batch (`SMOE_TEST_SQUEEZE=N`: from
/// the long prompt's second layer on, the glue sees at most N active slots,
/// as after the elastic ring shrank to N there). Where the spare wave can
/// take it, the next wave is smaller and nothing else changes; where it
/// cannot (a ring that held the model, one wave a layer; or a squeeze below
/// half the layer's 16 experts), the claim stops the graph, and llama.cpp
/// builds it again with waves sized from the ring now and computes the
/// batch again, once. Either way stock's tokens and logits, bit for bit:
/// never a failure, and (under the test's timeout) never a wait.
#[test]
fn ring_shrunk_mid_batch_takes_more_waves_identical() {
    ring_shrunk_mid_batch(Source::Vault);
}

/// [`ring_shrunk_mid_batch_takes_more_waves_identical`] with the experts
/// read from the GGUF in place (`SMOE=1`).
#[test]
fn in_place_ring_shrunk_mid_batch_takes_more_waves_identical() {
    ring_shrunk_mid_batch(Source::Model);
}

fn ring_shrunk_mid_batch(source: Source) {
    let fixture = "derived/qwen3moe-q8_0-8layers.gguf";
    let Some(s) = (if source == Source::Vault {
        setup(fixture)
    } else {
        setup_in_place(fixture)
    }) else {
        return;
    };
    let stock = run_long(&s, "stock", 2, &[]);
    assert!(stock.out.status.success(), "{}", stock.stderr());
    // (ring slots, squeeze, graphs built again, what the first squeezed
    // wave that ran says): the ring that held the model gets 4 waves of 4
    // (16 experts) in the graph built again; 16 slots squeezed to 8 keep
    // the 2 waves built for 16 and the first takes 8 of the layer's 16,
    // leaving 8 for the spare; squeezed to 4, the graph built again has
    // 4 + 1 spare
    for (slots, squeeze, rebuilt, told) in [
        (128, 4, 1, "wave 0 of 4 claimed "),
        (16, 8, 0, "layer 1 wave 0 of 2 claimed 8 experts, 8 left"),
        (16, 4, 1, "wave 0 of 5 claimed "),
    ] {
        let name = format!("smoe-{slots}-{squeeze}");
        let (slots_s, squeeze_s) = (slots.to_string(), squeeze.to_string());
        let mut env = source.env(&s.gguf, &s.vault);
        env.extend([
            ("SMOE_RING_SLOTS", slots_s.as_str()),
            ("SMOE_TEST_SQUEEZE", squeeze_s.as_str()),
        ]);
        let smoe = run_long(&s, &name, 2, &env);
        let err = smoe.stderr();
        assert!(smoe.out.status.success(), "{name}: {err}");
        assert!(
            !err.contains("failed to compute graph") && !err.contains("failed with error"),
            "{name}: a stopped graph was reported as an error:\n{err}"
        );
        assert_eq!(smoe.stdout(), stock.stdout(), "{name}: tokens differ");
        assert!(
            same_logits(&stock, &smoe),
            "{name}: logits differ from stock"
        );
        assert_eq!(
            counter(&err, " graphs built again"),
            rebuilt,
            "{name}: {err}"
        );
        let line = err
            .lines()
            .find(|l| l.starts_with(&format!("smoe: SMOE_TEST_SQUEEZE={squeeze}: ")))
            .unwrap_or_else(|| panic!("{name}: the squeeze never ran:\n{err}"));
        assert!(line.contains(told), "{name}: {line}");
    }
}

/// `SMOE_TRACE` writes the run's routing as a trace `smoe bench` reads
/// (issue 50's routing table): one row a (token, layer), every claim once,
/// and refuses, with a warning, to write over a file that is not a trace.
#[test]
fn smoe_trace_records_every_claim_of_a_run() {
    let Some(s) = setup_in_place("qwen3moe-q8_0.gguf") else {
        return;
    };
    let trace = s.tmp.path().join("routing.csv");
    let t = trace.to_str().unwrap();
    let stock = run(&s.bin, &s.gguf, s.tmp.path(), "stock", &[]);
    let traced = run(
        &s.bin,
        &s.gguf,
        s.tmp.path(),
        "traced",
        &[("SMOE", "1"), ("SMOE_TRACE", t)],
    );
    assert!(traced.out.status.success(), "{}", traced.stderr());
    assert_eq!(traced.logits, stock.logits, "a trace changes no logit");
    let claims = number_after(&traced.stderr(), "smoe: claims ");
    // read with this test's own parser: header, then token,layer,experts...
    let text = std::fs::read_to_string(&trace).expect("the trace was written");
    let mut lines = text.lines();
    assert!(lines.next().unwrap().starts_with("token,layer,r0,r1"));
    let mut entries = 0u64;
    let mut decode_rows = 0;
    let mut last_token = 0u64;
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        let token: u64 = f[0].parse().unwrap();
        let layer: u32 = f[1].parse().unwrap();
        let experts: Vec<u32> = f[2..]
            .iter()
            .filter(|x| !x.is_empty())
            .map(|x| x.parse().unwrap())
            .collect();
        assert!(layer < 2 && experts.iter().all(|&e| e < 16), "{line}");
        assert!(token == last_token || token == last_token + 1, "{line}");
        last_token = token;
        entries += experts.len() as u64;
        if token > 0 {
            // a decoded token claims the router's top-2 of each layer
            assert_eq!(experts.len(), 2, "{line}");
            decode_rows += 1;
        }
    }
    assert_eq!(entries, claims, "every claim once:\n{text}");
    let decoded: u64 = N_PREDICT.parse().unwrap();
    assert_eq!(last_token + 1, decoded, "the prompt, then a token a step");
    assert_eq!(decode_rows as u64, 2 * (decoded - 1));
    // smoe bench replays it (the routing table's sweep)
    let vault = s.tmp.path().join("sweep-vault");
    let smoe = env!("CARGO_BIN_EXE_smoe");
    let synth = Command::new(smoe)
        .args([
            "synth",
            "--layers",
            "2",
            "--experts",
            "16",
            "--blob-kib",
            "4",
        ])
        .arg(&vault)
        .output()
        .unwrap();
    assert!(synth.status.success(), "{synth:?}");
    let sweep = Command::new(smoe)
        .arg("bench")
        .arg(&vault)
        .args(["--trace", t, "--top-k", "2", "--sweep"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&sweep.stdout);
    assert!(sweep.status.success() && out.contains("tier"), "{sweep:?}");

    // a file that is not a trace is never replaced: the model itself here
    let before = std::fs::read(&s.gguf).unwrap();
    let refused = run(
        &s.bin,
        &s.gguf,
        s.tmp.path(),
        "refused",
        &[("SMOE", "1"), ("SMOE_TRACE", s.gguf.to_str().unwrap())],
    );
    assert!(refused.out.status.success(), "{}", refused.stderr());
    assert!(
        refused.stderr().contains("so no trace is recorded"),
        "{}",
        refused.stderr()
    );
    assert_eq!(
        std::fs::read(&s.gguf).unwrap(),
        before,
        "the model untouched"
    );
    assert_eq!(refused.logits, stock.logits);
}
