//! The context's `n_ubatch`: a prompt in one ubatch, a raise that cannot be
//! allocated, the ring's pages, sliding-window models, dense draft models.

use super::*;

/// The `n_ubatch` the context ran, as the patched `llama-simple` reports
/// it (`main: n_ubatch N`, from `llama_n_ubatch`).
fn ubatch_run(stderr: &str) -> u32 {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("main: n_ubatch ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `main: n_ubatch` line in:\n{stderr}"))
}

/// The environment of a smoe run of the `n_ubatch` tests: the model read in
/// place through `slots` ring slots, `SMOE_SIMPLE_UBATCH=32` standing in for
/// llama.cpp's 512, no pre-warm (a run after the first would start with the
/// experts its histogram names), then `extra`.
fn ubatch_env<'a>(slots: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("SMOE", "1"),
        ("SMOE_RING_SLOTS", slots),
        ("SMOE_SIMPLE_UBATCH", "32"),
        ("SMOE_PREWARM", "0"),
    ];
    env.extend_from_slice(extra);
    env
}

/// Issue 35: a prompt longer than `n_ubatch` through a ring smaller than the
/// model runs in one ubatch, reading each expert once instead of once per
/// ubatch, with stock's logits at that `n_ubatch` (bitwise); the default
/// raise is kept only when its compute buffers fit, and `SMOE_UBATCH=0`
/// keeps llama.cpp's. `SMOE_SIMPLE_UBATCH=32` stands in for llama.cpp's 512
/// so that the fixture's prompt is several ubatches.
#[test]
fn a_prompt_in_one_ubatch_reads_each_expert_once() {
    let Some(s) = setup_in_place("qwen3moe-q8_0.gguf") else {
        return;
    };
    // 16 slots, one layer's experts of the fixture's two layers: each
    // ubatch reads both layers' experts again.
    let small = ubatch_env("16", &[]);
    let with = |extra: &[(&'static str, &'static str)]| ubatch_env("16", extra);
    let stock_32 = run_long(&s, "stock-32", 1, &[("SMOE_SIMPLE_UBATCH", "32")]);
    let stock_one = run_long(&s, "stock-one", 1, &[("SMOE_SIMPLE_UBATCH", "4096")]);

    // SMOE_UBATCH=N: N, at most n_batch (the prompt), unchecked.
    let one = run_long(&s, "smoe-one", 1, &with(&[("SMOE_UBATCH", "4096")]));
    let err = String::from_utf8_lossy(&one.out.stderr);
    assert!(err.contains("(SMOE_UBATCH=4096, n_batch "), "{err}");
    let whole = ubatch_run(&err);
    assert!(whole > 32, "SMOE_UBATCH=4096 ran n_ubatch {whole}");
    assert!(
        same_logits(&one, &stock_one),
        "SMOE_UBATCH: not stock's logits at n_batch\n{err}"
    );

    // SMOE_UBATCH=0: llama.cpp's n_ubatch, stock's logits, each ubatch
    // reading the experts again.
    let asked = run_long(&s, "smoe-asked", 1, &with(&[("SMOE_UBATCH", "0")]));
    let asked_err = String::from_utf8_lossy(&asked.out.stderr);
    assert!(!asked_err.contains("smoe: n_ubatch"), "{asked_err}");
    assert_eq!(ubatch_run(&asked_err), 32, "{asked_err}");
    assert!(
        same_logits(&asked, &stock_32),
        "SMOE_UBATCH=0: not stock's logits\n{asked_err}"
    );
    // The prompt's reads alone (one token generated), through a ring of 8
    // slots (the prompt routes to about 9 of each layer's 16 experts), and
    // without layer-ahead (what it reads depends on the ring's room at each
    // layer, which differs with each ubatch's routing): in one ubatch each
    // expert the prompt routes to is claimed once and read once; in
    // ubatches of 32 tokens each ubatch reads the experts the other layer
    // evicted again.
    let prompt_reads = |name: &str, ubatch: &'static str| {
        let run = run_predicting(
            &s.bin,
            &s.gguf,
            s.tmp.path(),
            name,
            LONG_PROMPT,
            1,
            "1",
            &ubatch_env("8", &[("SMOE_UBATCH", ubatch), ("SMOE_LAYER_AHEAD", "0")]),
        );
        let err = run.stderr();
        assert!(run.out.status.success(), "{name}: {err}");
        (
            number_after(&err, "smoe: claims "),
            counter(&err, " demand") + counter(&err, " speculative"),
        )
    };
    let (claims, once) = prompt_reads("prompt-one", "4096");
    let (_, again) = prompt_reads("prompt-asked", "0");
    eprintln!(
        "the prompt's reads: one ubatch {once} ({claims} claims); ubatches of 32 tokens {again}"
    );
    assert_eq!(once, claims, "one ubatch: {once} reads for {claims} claims");
    assert!(
        again >= once + 16,
        "one ubatch read {once} experts, ubatches of 32 tokens {again}"
    );

    // Unset: raised to n_batch, kept only when the compute buffers it adds
    // fit in a quarter of the ring; with this ring of a few hundred KiB
    // they do not, and it is halved down to what fits (or llama.cpp's). The
    // logits are stock's at the n_ubatch kept.
    let auto = run_long(&s, "smoe-auto", 1, &small);
    let auto_err = String::from_utf8_lossy(&auto.out.stderr);
    assert!(
        auto_err.contains("smoe: n_ubatch ") && auto_err.contains(" too big"),
        "{auto_err}"
    );
    let kept = ubatch_run(&auto_err);
    assert!(
        kept < whole,
        "the raise was refused, yet n_ubatch {kept} ran"
    );
    let kept_s = kept.to_string();
    let reference = match kept {
        32 => stock_32,
        _ => run_long(&s, "stock-kept", 1, &[("SMOE_SIMPLE_UBATCH", &kept_s)]),
    };
    assert!(
        same_logits(&auto, &reference),
        "n_ubatch {kept}: not stock's logits\n{auto_err}"
    );
}

/// `cli/tests/tool/c/refuse_big_alloc.c` built into `dir`: an `LD_PRELOAD`
/// library whose `posix_memalign` refuses requests above
/// `SMOE_TEST_REFUSE_ABOVE` bytes, as a host at its memory limit does.
fn refuse_big_alloc(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tool/c/refuse_big_alloc.c");
    let lib = dir.join("refuse_big_alloc.so");
    smoe_test_support::native::run(
        Command::new(smoe_test_support::native::default_c_compiler())
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&lib)
            .arg(&source)
            .arg("-ldl"),
    );
    lib
}

/// A raised `n_ubatch` whose compute buffers cannot be allocated (a GPU's
/// memory, a host at its limit: here `posix_memalign` refuses them, through
/// `refuse_big_alloc`) is halved as one too big for the ring is: the
/// context runs the largest size whose buffers were allocated and fit, or
/// llama.cpp's `n_ubatch` when none did, says so, and its logits are
/// stock's at that size. (A failure once gave every raise up at once.)
#[test]
fn a_raise_that_cannot_be_allocated_is_halved() {
    let Some(s) = setup_in_place("qwen3moe-q8_0.gguf") else {
        return;
    };
    let lib = refuse_big_alloc(s.tmp.path());
    let preload = lib.to_str().unwrap();
    // Through 16 slots the long prompt's 142 tokens are raised to one
    // ubatch; its compute buffers are 440,256 bytes, 71 tokens' 220 KB and
    // llama.cpp's 32 tokens' 97 KB (the fixture's sizes at the pinned
    // llama.cpp).
    for (refuse_above, expected) in [("300000", 71), ("100000", 32)] {
        let env = ubatch_env(
            "16",
            &[
                ("LD_PRELOAD", preload),
                ("SMOE_TEST_REFUSE_ABOVE", refuse_above),
            ],
        );
        let run = run_long(&s, &format!("smoe-refused-{refuse_above}"), 1, &env);
        let err = String::from_utf8_lossy(&run.out.stderr);
        assert!(run.out.status.success(), "{err}");
        assert!(
            err.contains("smoe: n_ubatch 142: failed to allocate compute pp buffers: trying 71"),
            "{err}"
        );
        assert_eq!(ubatch_run(&err), expected, "{err}");
        let stock = run_long(
            &s,
            &format!("stock-{expected}"),
            1,
            &[("SMOE_SIMPLE_UBATCH", &expected.to_string())],
        );
        assert!(same_logits(&run, &stock), "not stock's logits\n{err}");
    }
}

/// A dense draft model beside a streamed MoE model (speculative decoding:
/// `llama-speculative -md`, `llama-server -md`) loads as stock llama.cpp
/// under `SMOE=1`, saying so, while the MoE model streams: the text is
/// stock's. (It once failed to load, and llama-speculative crashed on the
/// missing draft.) The draft is `derived/qwen3-q8_0-dense.gguf`, a dense
/// Qwen3 with the MoE fixture's vocabulary.
#[test]
fn a_dense_draft_model_loads_as_stock() {
    let Some(s) = setup_in_place("qwen3moe-q8_0.gguf") else {
        return;
    };
    let draft = fixtures().join("derived/qwen3-q8_0-dense.gguf");
    let run_speculative = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(tool(&s.bin, "llama-speculative"));
        cmd.arg("-m")
            .arg(&s.gguf)
            .arg("-md")
            .arg(&draft)
            .args(["-p", "Hello world", "-n", "16", "--temp", "0", "-t", "1"])
            .env_remove("SMOE")
            .env_remove("SMOE_VAULT")
            .env("SMOE_CACHE_DIR", s.tmp.path().join("cache"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let run = |env: &[(&str, &str)]| logged_output("llama-speculative", || run_speculative(env));
    let stock = run(&[]);
    assert!(
        stock.status.success(),
        "{}",
        String::from_utf8_lossy(&stock.stderr)
    );
    let streamed = run(&[
        ("SMOE", "1"),
        ("SMOE_RING_SLOTS", "8"),
        ("SMOE_PREWARM", "0"),
    ]);
    let err = String::from_utf8_lossy(&streamed.stderr);
    assert!(streamed.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "smoe: {} has no routed experts (a dense model): loaded as stock llama.cpp",
            draft.display()
        )),
        "{err}"
    );
    assert!(
        evictions(&err) > 0,
        "the MoE model streamed through 8 slots: {err}"
    );
    assert!(!stock.stdout.is_empty());
    // the text, less the newlines the tool prints after it: its logger thread, leaked at
    // exit (llama.cpp #22142), can lose that last write to stdout while stderr is whole
    assert_eq!(
        String::from_utf8_lossy(&streamed.stdout).trim_end_matches('\n'),
        String::from_utf8_lossy(&stock.stdout).trim_end_matches('\n'),
        "{err}"
    );
}

/// The ring's pages are committed at open by default (the library's
/// `SMOE_POPULATE_OPEN`, the load says so and how long the open took),
/// `SMOE_POPULATE=1` in the background from the load on, `=0` as slots are
/// first loaded: each gives stock's logits through a ring of half the
/// fixture's experts; a value other than 0, 1 or 2 fails the load, naming it.
#[test]
fn populate_keeps_stock_logits() {
    let Some(s) = setup_in_place("qwen3moe-q8_0.gguf") else {
        return;
    };
    let stock = run_long(&s, "stock", 1, &[("SMOE_SIMPLE_UBATCH", "32")]);
    for value in [None, Some("0"), Some("1"), Some("2")] {
        let mut extra = vec![("SMOE_UBATCH", "0")];
        extra.extend(value.map(|v| ("SMOE_POPULATE", v)));
        let env = ubatch_env("16", &extra);
        let name = format!("smoe-populate-{}", value.unwrap_or("default"));
        let run = run_long(&s, &name, 1, &env);
        let err = String::from_utf8_lossy(&run.out.stderr);
        assert!(run.out.status.success(), "{name}: {err}");
        assert!(
            same_logits(&run, &stock),
            "{name}: not stock's logits\n{err}"
        );
        let committed =
            err.contains("smoe: opened in ") && err.contains(", the ring's pages committed");
        assert_eq!(
            committed,
            matches!(value, None | Some("2")),
            "{name}: the load does not say how the ring was committed\n{err}"
        );
    }
    let bad = ubatch_env("16", &[("SMOE_UBATCH", "0"), ("SMOE_POPULATE", "3")]);
    let refused = run_long(&s, "smoe-populate-3", 1, &bad);
    let err = String::from_utf8_lossy(&refused.out.stderr);
    assert!(!refused.out.status.success(), "{err}");
    assert!(err.contains("SMOE_POPULATE"), "{err}");
}

/// A model with a sliding-window KV cache (gpt-oss) of `n_swa + n_ubatch`
/// cells a layer (`swa_full` off, as in llama-cli and llama-server; the
/// patched llama-simple's `SMOE_SIMPLE_SWA_FULL=0`), sized before the
/// compute buffers can be weighed: by default it keeps llama.cpp's
/// `n_ubatch`, saying why, and its logits are stock's; `SMOE_UBATCH=N`
/// still raises it. With a full-size cache (llama-simple's default) it is
/// raised like any model.
#[test]
fn a_sliding_window_model_keeps_its_ubatch() {
    let Some(s) = setup_in_place("gptoss-f32.gguf") else {
        return;
    };
    let small = ubatch_env("4", &[("SMOE_SIMPLE_SWA_FULL", "0")]);
    let stock = run_long(
        &s,
        "stock-32",
        1,
        &[("SMOE_SIMPLE_UBATCH", "32"), ("SMOE_SIMPLE_SWA_FULL", "0")],
    );
    let kept = run_long(&s, "smoe-kept", 1, &small);
    let err = String::from_utf8_lossy(&kept.out.stderr);
    assert!(
        err.contains("smoe: n_ubatch 32 kept (the model's sliding-window KV cache"),
        "{err}"
    );
    assert_eq!(ubatch_run(&err), 32, "{err}");
    assert!(same_logits(&kept, &stock), "not stock's logits\n{err}");
    let asked = ubatch_env("4", &[("SMOE_SIMPLE_SWA_FULL", "0"), ("SMOE_UBATCH", "64")]);
    let raised = run_long(&s, "smoe-asked", 1, &asked);
    let raised_err = String::from_utf8_lossy(&raised.out.stderr);
    assert_eq!(ubatch_run(&raised_err), 64, "{raised_err}");
    let full = run_long(&s, "smoe-full", 1, &ubatch_env("4", &[]));
    let full_err = String::from_utf8_lossy(&full.out.stderr);
    assert!(
        !full_err.contains("sliding-window") && ubatch_run(&full_err) > 32,
        "a full-size SWA cache: not raised\n{full_err}"
    );
}
