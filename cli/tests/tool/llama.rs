//! llama.cpp streaming its experts through smoe (issue 14, docs/llama.md):
//! the patched `llama-simple` that `scripts/llama.sh build` leaves in its
//! cache runs the committed MoE fixtures greedily for 32 tokens, once as
//! stock llama.cpp and once through smoe with a ring smaller than a layer's
//! experts: from a vault packed from the fixture (`SMOE_VAULT`), or from the
//! GGUF itself in place (`SMOE=1`, issue 34: a single file and a split one).
//! The tokens must be the same and the logits of every step bitwise equal
//! (both with repacking off: smoe's experts keep the GGUF's layout); against
//! stock with repacking on, the largest logit difference is printed.
//! Failures (a blob failing its checksum, a truncated vault, a vault of
//! another model, a GGUF without experts) must stop it with smoe's message
//! and a non-zero exit.
//!
//! The patch's CMake option off (`scripts/llama.sh build-off`, which the
//! last test runs), the same tree builds a `llama-simple` with nothing of
//! smoe in it, and that binary is stock llama.cpp.
//!
//! Without the build every test says why and what to build, and returns at
//! once, except under CI (`CI` set), where `.ci/run` builds it first and a
//! missing build is a failure ([`smoe_test_support::skip_or_fail`]). The
//! helpers that run llama.cpp return an Option, None when skipped, so no
//! test can assert on the result of a run that never happened.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PROMPT: &str = "Hello world";
/// A prompt long enough (well over 32 tokens) that each layer routes to
/// every one of a fixture's 16 experts, and that the glue's layer-ahead
/// reads run.
const LONG_PROMPT: &str = "the quick brown fox jumps over the lazy dog while seven wise owls \
                           count the stars above a quiet river that winds through old green \
                           hills and small towns where people sing songs of rain and bread and \
                           light";
const N_PREDICT: &str = "32";
/// Every fixture's vocabulary (tests/fixtures/models/README.md).
const N_VOCAB: usize = 384;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models")
}

/// scripts/llama.sh's cache, `$SMOE_LLAMA_DIR`.
fn llama_dir() -> PathBuf {
    std::env::var_os("SMOE_LLAMA_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/smoe-llama"))
}

/// The patched llama-simple, or None (after saying why, or failing under
/// CI) when it is not built.
fn llama_simple() -> Option<PathBuf> {
    let bin = llama_dir().join("build/bin/llama-simple");
    if bin.is_file() {
        return Some(bin);
    }
    smoe_test_support::skip_or_fail(&format!(
        "{} is not built: run scripts/llama.sh build (SMOE_LLAMA_DIR picks the cache)",
        bin.display()
    ));
    None
}

/// `smoe pack GGUF DIR/vault`, which must succeed.
fn pack(gguf: &Path, dir: &Path) -> PathBuf {
    let vault = dir.join("vault");
    let out = Command::new(env!("CARGO_BIN_EXE_smoe"))
        .arg("pack")
        .arg(gguf)
        .arg(&vault)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "smoe pack {}: {}",
        gguf.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    vault
}

struct Run {
    out: Output,
    logits: Vec<f32>,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
}

/// llama-simple on `gguf` with `env`, its logits dumped to a file in `dir`.
fn run(bin: &Path, gguf: &Path, dir: &Path, name: &str, env: &[(&str, &str)]) -> Run {
    run_prompt(bin, gguf, dir, name, PROMPT, env)
}

/// [`run`] with another prompt.
fn run_prompt(
    bin: &Path,
    gguf: &Path,
    dir: &Path,
    name: &str,
    prompt: &str,
    env: &[(&str, &str)],
) -> Run {
    // one thread: ggml's default (4) spins at every op's barrier, which on a
    // busy 2-core machine made these tiny models take ~1 s per token
    run_threads(bin, gguf, dir, name, prompt, 1, env)
}

/// [`run_prompt`] with `threads` threads (`-t`).
fn run_threads(
    bin: &Path,
    gguf: &Path,
    dir: &Path,
    name: &str,
    prompt: &str,
    threads: u32,
    env: &[(&str, &str)],
) -> Run {
    run_predicting(bin, gguf, dir, name, prompt, threads, N_PREDICT, env)
}

/// [`run_threads`] generating `n` tokens (`-n`).
#[allow(clippy::too_many_arguments)]
fn run_predicting(
    bin: &Path,
    gguf: &Path,
    dir: &Path,
    name: &str,
    prompt: &str,
    threads: u32,
    n: &str,
    env: &[(&str, &str)],
) -> Run {
    let dump = dir.join(format!("{name}.logits"));
    let mut cmd = Command::new(bin);
    cmd.args(["-t", &threads.to_string(), "-n", n, "-m"])
        .arg(gguf)
        .arg(prompt);
    for var in [
        "SMOE",
        "SMOE_VAULT",
        "SMOE_RING_SLOTS",
        "SMOE_NO_REPACK",
        "SMOE_VERIFY",
        "SMOE_LAYER_AHEAD",
        "SMOE_POLICY",
        "SMOE_ELASTIC",
        "SMOE_PREWARM",
        "SMOE_WORKERS",
        "SMOE_DIRECT_IO",
        "SMOE_TEST_SQUEEZE",
        "SMOE_UBATCH",
        "SMOE_SIMPLE_UBATCH",
        "SMOE_SIMPLE_SWA_FULL",
        "SMOE_TEST_REFUSE_ABOVE",
        "SMOE_TEST_FAIL_CLAIMS",
        "SMOE_POPULATE",
    ] {
        cmd.env_remove(var);
    }
    // a model opened in place keeps its histogram under the cache directory
    // (docs/c-api.md): the test's own, not the user's
    cmd.env("SMOE_CACHE_DIR", dir.join("cache"));
    cmd.env("SMOE_DUMP_LOGITS", &dump);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let logits = std::fs::read(&dump)
        .map(|b| {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        })
        .unwrap_or_default();
    Run { out, logits }
}

/// The `smoe: claims …` statistics line a run printed at its end.
fn smoe_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("smoe: claims "))
        .unwrap_or_else(|| panic!("no `smoe: claims` line in:\n{stderr}"))
}

/// The `smoe:` statistics line's `W waves per layer`.
fn waves_per_layer(stderr: &str) -> f64 {
    let line = smoe_line(stderr);
    let before = &line[..line.find(" waves per layer").expect(line)];
    before.rsplit(' ').next().unwrap().parse().unwrap()
}

/// The `smoe:` statistics line's `evictions N`.
fn evictions(stderr: &str) -> u64 {
    number_after(stderr, "evictions ")
}

/// The number just after `before` in the `smoe:` statistics line, as in
/// "claims N," or "evictions N (".
fn number_after(stderr: &str, before: &str) -> u64 {
    let line = smoe_line(stderr);
    let rest = &line[line
        .find(before)
        .unwrap_or_else(|| panic!("no {before:?} in {line}"))
        + before.len()..];
    rest.split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches(',')
        .parse()
        .unwrap()
}

/// The number just before `after` in the `smoe:` statistics line, as in
/// "(… N demand, M speculative, …)" or "K layer-ahead sets".
fn counter(stderr: &str, after: &str) -> u64 {
    let line = smoe_line(stderr);
    let before = &line[..line
        .find(after)
        .unwrap_or_else(|| panic!("no {after:?} in {line}"))];
    before.rsplit([' ', '(']).next().unwrap().parse().unwrap()
}

/// [`run_threads`] of the long prompt on `s`'s fixture, repacking off,
/// with `env` on top.
fn run_long(s: &Setup, name: &str, threads: u32, env: &[(&str, &str)]) -> Run {
    let mut all = vec![("SMOE_NO_REPACK", "1")];
    all.extend_from_slice(env);
    run_threads(
        &s.bin,
        &s.gguf,
        s.tmp.path(),
        name,
        LONG_PROMPT,
        threads,
        &all,
    )
}

/// Whether two runs' logits are bitwise equal (and there are some).
fn same_logits(a: &Run, b: &Run) -> bool {
    !a.logits.is_empty()
        && a.logits.len() == b.logits.len()
        && a.logits
            .iter()
            .zip(&b.logits)
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A test's start: the patched `llama-simple` (None when it is not built,
/// and the test is skipped), the fixture, a scratch directory, and the vault
/// packed from the fixture into it.
struct Setup {
    bin: PathBuf,
    gguf: PathBuf,
    tmp: tempfile::TempDir,
    vault: PathBuf,
}

fn setup(fixture: &str) -> Option<Setup> {
    let bin = llama_simple()?;
    let gguf = fixtures().join(fixture);
    let tmp = tempfile::tempdir().unwrap();
    let vault = pack(&gguf, tmp.path());
    Some(Setup {
        bin,
        gguf,
        tmp,
        vault,
    })
}

/// Stock (repack off), smoe through a ring of `slots`, stock (repack on):
/// same text, bitwise equal logits against the first; prints the largest
/// difference against the third. Returns smoe's waves per layer, or None
/// when llama.cpp is not built (and the test is skipped).
fn identical(fixture: &str, slots: u32) -> Option<f64> {
    identical_with(fixture, slots, PROMPT)
}

/// [`identical`] with another prompt.
fn identical_with(fixture: &str, slots: u32, prompt: &str) -> Option<f64> {
    identical_from(fixture, slots, prompt, Source::Vault)
}

/// Where a smoe run's experts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// A vault packed from the GGUF: `SMOE_VAULT=DIR`.
    Vault,
    /// The GGUF itself, in place: `SMOE=1` and no `SMOE_VAULT` (for a split
    /// GGUF the first part, the one llama.cpp is given).
    Model,
    /// The GGUF itself, named by `SMOE_VAULT`.
    Named,
}

impl Source {
    /// The variables that select it for a run of `gguf` (`vault`: the vault
    /// packed from it, used by [`Source::Vault`] alone).
    fn env<'a>(self, gguf: &'a Path, vault: &'a Path) -> Vec<(&'static str, &'a str)> {
        match self {
            Source::Vault => vec![("SMOE_VAULT", vault.to_str().unwrap())],
            Source::Model => vec![("SMOE", "1")],
            Source::Named => vec![("SMOE_VAULT", gguf.to_str().unwrap())],
        }
    }

    /// What the glue's load line names: `smoe: vault DIR:` or `smoe: model FILE:`.
    fn named(self, gguf: &Path, vault: &Path) -> String {
        match self {
            Source::Vault => format!("smoe: vault {}: ", vault.display()),
            Source::Model | Source::Named => format!("smoe: model {}: ", gguf.display()),
        }
    }
}

/// A test's start for a model streamed in place: the patched `llama-simple`
/// (None when it is not built), the fixture and a scratch directory; no
/// vault (`vault` is a path that does not exist).
fn setup_in_place(fixture: &str) -> Option<Setup> {
    let bin = llama_simple()?;
    let tmp = tempfile::tempdir().unwrap();
    let vault = tmp.path().join("no-vault");
    Some(Setup {
        bin,
        gguf: fixtures().join(fixture),
        tmp,
        vault,
    })
}

/// [`identical_with`] with the experts from `source`.
fn identical_from(fixture: &str, slots: u32, prompt: &str, source: Source) -> Option<f64> {
    let Setup {
        bin,
        gguf,
        tmp,
        vault,
    } = if source == Source::Vault {
        setup(fixture)?
    } else {
        setup_in_place(fixture)?
    };
    let slots = slots.to_string();
    let run = |bin: &Path, gguf: &Path, dir: &Path, name: &str, env: &[(&str, &str)]| {
        run_prompt(bin, gguf, dir, name, prompt, env)
    };
    let stock = run(&bin, &gguf, tmp.path(), "stock", &[("SMOE_NO_REPACK", "1")]);
    let mut env = vec![("SMOE_NO_REPACK", "1"), ("SMOE_RING_SLOTS", slots.as_str())];
    env.extend(source.env(&gguf, &vault));
    let smoe = run(&bin, &gguf, tmp.path(), "smoe", &env);
    let repack = run(&bin, &gguf, tmp.path(), "repack", &[]);
    for (name, r) in [("stock", &stock), ("smoe", &smoe), ("repack", &repack)] {
        assert!(
            r.out.status.success(),
            "{fixture} {name} ({source:?}): {}\n{}",
            r.out.status,
            r.stderr()
        );
        assert!(
            !r.logits.is_empty() && r.logits.len() % N_VOCAB == 0,
            "{fixture} {name}: {} logits",
            r.logits.len()
        );
    }
    assert!(
        !stock.stderr().contains("smoe:"),
        "stock run mentions smoe:\n{}",
        stock.stderr()
    );
    assert!(
        smoe.stderr().contains(&source.named(&gguf, &vault))
            && smoe.stderr().contains(&format!("ring of {slots} slots")),
        "{fixture} ({source:?}): {}",
        smoe.stderr()
    );
    let waves = waves_per_layer(&smoe.stderr());
    assert!(waves >= 1.0, "{fixture}: no waves in:\n{}", smoe.stderr());
    assert!(
        evictions(&smoe.stderr()) > 0,
        "{fixture}: a ring of {slots} slots evicted nothing:\n{}",
        smoe.stderr()
    );
    let text = stock.stdout();
    assert!(
        text.len() > prompt.len() + 10,
        "{fixture}: stock generated too little: {text:?}"
    );
    assert_eq!(
        smoe.stdout(),
        text,
        "{fixture} ({source:?}): smoe's tokens differ"
    );
    assert_eq!(
        repack.stdout(),
        text,
        "{fixture}: repacked stock's tokens differ"
    );
    assert_eq!(
        smoe.logits.len(),
        stock.logits.len(),
        "{fixture}: steps differ"
    );
    let differing = stock
        .logits
        .iter()
        .zip(&smoe.logits)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        differing,
        0,
        "{fixture} ({source:?}): {differing} of {} logits differ from stock (repack off)",
        stock.logits.len()
    );
    assert_eq!(repack.logits.len(), stock.logits.len());
    let max_diff = repack
        .logits
        .iter()
        .zip(&smoe.logits)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!(
        "{fixture} ({source:?}): {} steps x {N_VOCAB} logits bitwise equal to stock without \
         repacking; largest difference to stock with repacking {max_diff:e}; {}",
        stock.logits.len() / N_VOCAB,
        smoe_line(&smoe.stderr())
    );
    Some(waves)
}

#[test]
fn mixtral_q8_0_identical() {
    // 4 experts per layer, top-2: 3 slots
    identical("mixtral-q8_0.gguf", 3);
}

#[test]
fn mixtral256_q4_k_m_identical() {
    // Q4_K and Q6_K experts, which stock repacks when repacking is on
    identical("mixtral256-q4_k_m.gguf", 3);
}

#[test]
fn qwen3moe_q8_0_identical() {
    // 16 experts per layer
    identical("qwen3moe-q8_0.gguf", 8);
}

#[test]
fn qwen3moe_bf16_identical() {
    identical("qwen3moe-bf16.gguf", 8);
}

/// The waves and what they compute: the long prompt routes each layer of
/// qwen3moe to all 16 experts, through a ring of 8 slots (half a layer),
/// so prefill runs every layer in waves (it once shrank n_ubatch to 4
/// tokens instead and read each expert once per 4 tokens); the logits of
/// every step are stock's, bit for bit, and the statistics say waves ran.
#[test]
fn qwen3moe_half_a_layer_prefill_in_waves_identical() {
    let Some(waves) = identical_with("qwen3moe-q8_0.gguf", 8, LONG_PROMPT) else {
        return;
    };
    // a layer's 16 experts through 8 slots: prefill's layers take two waves
    // or more (a shrunk n_ubatch instead would show one)
    assert!(waves > 1.0, "{waves} waves per layer");
}

/// Many waves in a deeper model: the long prompt routes each of the 8
/// layers to all 16 experts through a ring of one slot, 16 waves a layer.
/// Each wave repeats the expert FFN's graph nodes; llama.cpp's node budget
/// for this model (1024) once overflowed and the context aborted in
/// `ggml_hash_insert` before the first token. Now the budget counts the
/// waves: stock's text and logits.
#[test]
fn qwen3moe_8_layers_one_slot_sixteen_waves_identical() {
    let Some(waves) = identical_with("derived/qwen3moe-q8_0-8layers.gguf", 1, LONG_PROMPT) else {
        return;
    };
    // prefill's layers in 16 waves, decode's in as many as a token's top-k
    assert!(waves > 2.0, "{waves} waves per layer");
}

/// One slot, fewer than a token's top-2: decode runs in waves of one
/// expert (it once stopped: "distinct experts but the ring has 1 slots").
#[test]
fn mixtral_one_slot_in_waves_identical() {
    identical("mixtral-q8_0.gguf", 1);
}

// In place (issue 34): `SMOE=1` streams the routed experts from the very
// GGUF llama.cpp is given, with no vault; `SMOE_VAULT` may name the model
// file too.

/// The slot offsets of a model's items as smoe's metadata gives them (SPEC
/// §6: positions in the slot, not necessarily multiples of 256).
fn in_place_offsets(gguf: &Path) -> Vec<u64> {
    let vault = smoe::vault::Vault::open(gguf).unwrap();
    let meta: serde_json::Value = serde_json::from_str(vault.meta()).unwrap();
    assert_eq!(meta["format"], "smoe-model", "{}", vault.meta());
    meta["layer_blob_layouts"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|items| items.as_array().unwrap().iter())
        .map(|item| item["offset"].as_u64().unwrap())
        .collect()
}

#[test]
fn mixtral_q8_0_in_place_identical() {
    identical_from("mixtral-q8_0.gguf", 3, PROMPT, Source::Model);
}

/// Q4_K and Q6_K experts whose items sit at slot offsets that are not
/// multiples of 256 (the tensors' file offsets mod 4096): the glue's views
/// take them as they are.
#[test]
fn mixtral256_q4_k_m_in_place_identical() {
    let gguf = fixtures().join("mixtral256-q4_k_m.gguf");
    let offsets = in_place_offsets(&gguf);
    assert!(
        offsets.iter().any(|o| o % 256 != 0),
        "no offset off 256 any more: {offsets:?}"
    );
    identical_from("mixtral256-q4_k_m.gguf", 3, PROMPT, Source::Model);
}

#[test]
fn qwen3moe_q8_0_in_place_identical() {
    identical_from("qwen3moe-q8_0.gguf", 8, PROMPT, Source::Model);
}

#[test]
fn qwen3moe_bf16_in_place_identical() {
    let offsets = in_place_offsets(&fixtures().join("qwen3moe-bf16.gguf"));
    assert!(offsets.iter().any(|o| o % 256 != 0), "{offsets:?}");
    identical_from("qwen3moe-bf16.gguf", 8, PROMPT, Source::Model);
}

/// The other fixtures llama.cpp runs, in place through one slot (every
/// batch in waves): per-expert biases and items off 256 (gpt-oss), a fused
/// `gate_up` weight (cohere2moe), a dense first layer and shared experts
/// (deepseekv3, qwen2moe), F16 experts (mixtral).
#[test]
fn other_fixtures_in_place_one_slot_identical() {
    for fixture in [
        "gptoss-f32.gguf",
        "cohere2moe-q8_0-fused.gguf",
        "deepseekv3-q8_0.gguf",
        "qwen2moe-q8_0.gguf",
        "mixtral-f16.gguf",
    ] {
        if identical_from(fixture, 1, PROMPT, Source::Model).is_none() {
            return;
        }
    }
}

/// A split GGUF: llama.cpp is given the first of its 4 parts and finds the
/// others beside it; smoe, given the same path, reads the experts from the
/// parts that hold them. Stock's logits on the split model, bit for bit.
#[test]
fn split_gguf_in_place_identical() {
    identical_from(SPLIT, 8, PROMPT, Source::Model);
}

/// The first part of the split fixture.
const SPLIT: &str = "qwen3moe-q8_0-split/qwen3moe-q8_0-split-00001-of-00004.gguf";

/// `SMOE_VAULT` naming the model file itself (what `SMOE=1` does without
/// it): a single GGUF whose items are off 256, and the split one's first
/// part.
#[test]
fn smoe_vault_naming_the_gguf_identical() {
    identical_from("mixtral256-q4_k_m.gguf", 3, PROMPT, Source::Named);
    identical_from(SPLIT, 8, PROMPT, Source::Named);
}

/// The long prompt through half a layer's slots, in place: prefill's layers
/// run in waves, the logits are stock's.
#[test]
fn in_place_half_a_layer_prefill_in_waves_identical() {
    let Some(waves) = identical_from("qwen3moe-q8_0.gguf", 8, LONG_PROMPT, Source::Model) else {
        return;
    };
    assert!(waves > 1.0, "{waves} waves per layer");
}

/// One slot for the 8-layer model, in place: 16 waves a layer in prefill.
#[test]
fn in_place_8_layers_one_slot_sixteen_waves_identical() {
    let Some(waves) = identical_from(
        "derived/qwen3moe-q8_0-8layers.gguf",
        1,
        LONG_PROMPT,
        Source::Model,
    ) else {
        return;
    };
    assert!(waves > 2.0, "{waves} waves per layer");
}

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
            &[("LD_PRELOAD", preload), ("SMOE_TEST_REFUSE_ABOVE", refuse_above)],
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
    let run = |env: &[(&str, &str)]| {
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
    let stock = run(&[]);
    assert!(stock.status.success(), "{}", String::from_utf8_lossy(&stock.stderr));
    let streamed = run(&[("SMOE", "1"), ("SMOE_RING_SLOTS", "8"), ("SMOE_PREWARM", "0")]);
    let err = String::from_utf8_lossy(&streamed.stderr);
    assert!(streamed.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "smoe: {} has no routed experts (a dense model): loaded as stock llama.cpp",
            draft.display()
        )),
        "{err}"
    );
    assert!(evictions(&err) > 0, "the MoE model streamed through 8 slots: {err}");
    assert!(!stock.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&streamed.stdout),
        String::from_utf8_lossy(&stock.stdout),
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

/// `SMOE=0` is stock llama.cpp, also with `SMOE_VAULT` set (it says that it
/// does not use it); `SMOE` unset with `SMOE_VAULT` set streams from the
/// vault as before (every vault test above).
#[test]
fn smoe_0_is_stock() {
    let Some(Setup {
        bin,
        gguf,
        tmp,
        vault,
    }) = setup("mixtral-q8_0.gguf")
    else {
        return;
    };
    let stock = run(&bin, &gguf, tmp.path(), "stock", &[]);
    let off = run(&bin, &gguf, tmp.path(), "off", &[("SMOE", "0")]);
    let off_vault = run(
        &bin,
        &gguf,
        tmp.path(),
        "off-vault",
        &[("SMOE", "0"), ("SMOE_VAULT", vault.to_str().unwrap())],
    );
    for (name, r) in [
        ("stock", &stock),
        ("SMOE=0", &off),
        ("SMOE=0 SMOE_VAULT", &off_vault),
    ] {
        assert!(r.out.status.success(), "{name}: {}", r.stderr());
        assert_eq!(r.stdout(), stock.stdout(), "{name}");
        assert!(same_logits(&stock, r), "{name}: logits differ from stock");
        assert!(
            !r.stderr().contains("smoe: claims"),
            "{name}: {}",
            r.stderr()
        );
    }
    assert!(!off.stderr().contains("smoe:"), "{}", off.stderr());
    assert!(
        off_vault.stderr().contains(&format!(
            "smoe: SMOE=0: off, SMOE_VAULT={} is not used",
            vault.display()
        )),
        "{}",
        off_vault.stderr()
    );
}

/// One run of [`in_place_errors_name_the_variable_and_file`].
type Case<'a> = (&'a Path, Vec<(&'a str, &'a str)>, String);

/// What the in-place settings refuse: each stops the load with a message
/// that names the variable and the file, exit 1 (never a signal), and no
/// token generated.
#[test]
fn in_place_errors_name_the_variable_and_file() {
    let Some(Setup { bin, gguf, tmp, .. }) = setup_in_place("qwen3moe-q8_0.gguf") else {
        return;
    };
    // a GGUF whose expert tensors are renamed (same length, so the header
    // stays valid): llama.cpp reads its header and hyperparameters, then smoe
    // finds no experts in it
    let bare = tmp.path().join("no-experts.gguf");
    let mut renamed = std::fs::read(&gguf).unwrap();
    let mut n = 0;
    for i in 0..renamed.len() - 6 {
        if &renamed[i..i + 6] == b"_exps." {
            renamed[i + 4] = b'z'; // "_expz."
            n += 1;
        }
    }
    assert_eq!(n, 6, "expert tensor names found");
    std::fs::write(&bare, &renamed).unwrap();
    let mixtral = fixtures().join("mixtral-q8_0.gguf");
    let same_table = tmp.path().join("same-table.gguf");
    std::fs::copy(&gguf, &same_table).unwrap();
    // (the model given to -m, the environment, what stderr must say)
    let cases: Vec<Case> = vec![
        (
            &bare,
            vec![("SMOE", "1")],
            format!(
                "smoe: smoe_open: SMOE_ERR_FORMAT: {}: no expert tensors found",
                bare.display()
            ),
        ),
        (
            &bare,
            vec![("SMOE", "1")],
            format!("(SMOE=1: the model file {})", bare.display()),
        ),
        (
            &gguf,
            vec![("SMOE", "1"), ("SMOE_VAULT", "/nonexistent/model.gguf")],
            "smoe_open: SMOE_ERR_IO".to_owned(),
        ),
        (
            &gguf,
            vec![("SMOE", "1"), ("SMOE_VAULT", "/nonexistent/model.gguf")],
            "(SMOE_VAULT=/nonexistent/model.gguf)".to_owned(),
        ),
        (
            &gguf,
            vec![("SMOE", "yes")],
            "SMOE=yes is neither 0 (stock llama.cpp) nor 1".to_owned(),
        ),
        (
            &gguf,
            vec![("SMOE_VAULT", mixtral.to_str().unwrap())],
            format!(
                "smoe: SMOE_VAULT={} is not the file llama.cpp loads",
                mixtral.display()
            ),
        ),
        // a copy has the same tensor table, so every layout check would
        // pass: it is refused for not being the file loaded
        (
            &gguf,
            vec![("SMOE_VAULT", same_table.to_str().unwrap())],
            format!(
                "smoe: SMOE_VAULT={} is not the file llama.cpp loads",
                same_table.display()
            ),
        ),
    ];
    for (model, env, expect) in &cases {
        let r = run(&bin, model, tmp.path(), "failing", env);
        assert_eq!(
            r.out.status.code(),
            Some(1),
            "{env:?} on {}: {}\n{}",
            model.display(),
            r.out.status,
            r.stderr()
        );
        assert!(
            r.stderr().contains(expect.as_str()),
            "{env:?}: no {expect:?} in:\n{}",
            r.stderr()
        );
        assert!(r.logits.is_empty(), "{env:?}: it decoded");
    }
    // not an error: a model read in place has no checksums, and the glue
    // says that SMOE_VERIFY=1 verifies nothing
    let r = run(
        &bin,
        &gguf,
        tmp.path(),
        "verify",
        &[("SMOE", "1"), ("SMOE_VERIFY", "1")],
    );
    assert!(r.out.status.success(), "{}", r.stderr());
    assert!(
        r.stderr().contains("verify is on, but")
            && r.stderr().contains("no checksums: nothing is verified"),
        "{}",
        r.stderr()
    );
}

/// A run that must fail: non-zero exit, `expect` in stderr, and no token
/// generated past the prompt (stock's stdout starts with what it printed).
fn fails(bin: &Path, gguf: &Path, dir: &Path, env: &[(&str, &str)], expect: &str) {
    let stock = run(bin, gguf, dir, "stock", &[]);
    assert!(stock.out.status.success(), "{}", stock.stderr());
    let r = run(bin, gguf, dir, "failing", env);
    assert!(
        !r.out.status.success(),
        "succeeded with {env:?}:\n{}",
        r.stderr()
    );
    assert!(
        r.stderr().contains(expect),
        "{env:?}: no {expect:?} in:\n{}",
        r.stderr()
    );
    assert!(
        r.stdout().len() < stock.stdout().len() && stock.stdout().starts_with(&r.stdout()),
        "{env:?}: generated {:?}",
        r.stdout()
    );
}

#[test]
fn corrupt_blob_stops_generation_with_smoes_error() {
    let Some(Setup {
        bin,
        gguf,
        tmp,
        vault,
    }) = setup("mixtral-q8_0.gguf")
    else {
        return;
    };
    // 8 blobs of 19,840 bytes, each in a 32 KiB padded region at the end of
    // the file (docs/format.md §2.1): flip a byte inside every payload
    let path = vault.join("experts.smoe");
    let mut bytes = std::fs::read(&path).unwrap();
    let data = bytes.len() - 8 * 32768;
    assert!(data >= 16384, "{} bytes", bytes.len());
    for i in 0..8 {
        bytes[data + i * 32768 + 100] ^= 0x55;
    }
    std::fs::write(&path, bytes).unwrap();
    let v = vault.to_str().unwrap();
    fails(
        &bin,
        &gguf,
        tmp.path(),
        &[
            ("SMOE_VAULT", v),
            ("SMOE_VERIFY", "1"),
            ("SMOE_RING_SLOTS", "3"),
        ],
        "SMOE_ERR_FORMAT",
    );
}

#[test]
fn truncated_vault_is_refused() {
    let Some(Setup {
        bin,
        gguf,
        tmp,
        vault,
    }) = setup("mixtral-q8_0.gguf")
    else {
        return;
    };
    let path = vault.join("experts.smoe");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 40000)
        .unwrap();
    fails(
        &bin,
        &gguf,
        tmp.path(),
        &[("SMOE_VAULT", vault.to_str().unwrap())],
        "smoe_open: SMOE_ERR_FORMAT",
    );
}

#[test]
fn vault_of_another_model_is_refused() {
    let Some(Setup {
        bin, tmp, vault, ..
    }) = setup("qwen3moe-q8_0.gguf")
    else {
        return;
    };
    fails(
        &bin,
        &fixtures().join("mixtral-q8_0.gguf"),
        tmp.path(),
        &[("SMOE_VAULT", vault.to_str().unwrap())],
        "pack the vault from this GGUF",
    );
}

/// A vault with fewer expert layers than the model (a 2-layer model's vault
/// under the same model deepened to 8 layers): the load stops with the
/// message naming the first tensor the vault lacks. The glue's tensor
/// context was sized from the vault's layers, so the model's 24 expert
/// tensors overflowed it: GGML_ASSERT(obj_new), an abort.
#[test]
fn vault_with_fewer_layers_than_the_model_is_refused() {
    let Some(Setup {
        bin, tmp, vault, ..
    }) = setup("qwen3moe-q8_0.gguf")
    else {
        return;
    };
    fails(
        &bin,
        &fixtures().join("derived/qwen3moe-q8_0-8layers.gguf"),
        tmp.path(),
        &[("SMOE_VAULT", vault.to_str().unwrap())],
        "has no layer 2, which the model's blk.2.ffn_gate_exps.weight needs: pack the vault from \
         this GGUF",
    );
}

/// The elastic ring shrunk by memory pressure before the first batch: a
/// 16-slot ring under a fake /proc/meminfo (bind-mounted in a mount
/// namespace of the run's own, so only it sees 100 MiB available) keeps 8
/// active slots, fewer than the 16 distinct experts a long prompt routes
/// each layer to. The glue sized its batches from the reserved 16 slots,
/// and its claims answered RING_FULL, retried in a tight loop for 600 s.
/// Now it runs each layer in waves that fit the active slots: same text as
/// stock, at once.
#[test]
fn elastic_ring_shrunk_under_pressure_never_hangs() {
    elastic_ring_shrunk(
        "elastic_ring_shrunk_under_pressure_never_hangs",
        Source::Vault,
    );
}

/// [`elastic_ring_shrunk_under_pressure_never_hangs`] with the experts read
/// from the GGUF in place (`SMOE=1`).
#[test]
fn in_place_elastic_ring_shrunk_under_pressure_never_hangs() {
    elastic_ring_shrunk(
        "in_place_elastic_ring_shrunk_under_pressure_never_hangs",
        Source::Model,
    );
}

fn elastic_ring_shrunk(name: &str, source: Source) {
    if !crate::support::root_tests(name, "a mount namespace") {
        return;
    }
    let fixture = "qwen3moe-q8_0.gguf";
    let Some(Setup {
        bin,
        gguf,
        tmp,
        vault,
    }) = (if source == Source::Vault {
        setup(fixture)
    } else {
        setup_in_place(fixture)
    })
    else {
        return;
    };
    let prompt = LONG_PROMPT;
    let meminfo = tmp.path().join("meminfo");
    std::fs::write(
        &meminfo,
        "MemTotal: 4194304 kB\nMemFree: 102400 kB\nMemAvailable: 102400 kB\n",
    )
    .unwrap();
    let simple = |smoe: bool| {
        let mut cmd = Command::new("timeout");
        cmd.arg("60");
        if smoe {
            cmd.args(["unshare", "-m", "--propagation", "private", "sh", "-c"])
                .arg("mount --bind \"$0\" /proc/meminfo && exec \"$@\"")
                .arg(&meminfo);
            cmd.envs(source.env(&gguf, &vault))
                .env("SMOE_RING_SLOTS", "16")
                .env("SMOE_CACHE_DIR", tmp.path().join("cache"));
        }
        cmd.arg(&bin)
            .args(["-t", "1", "-n", "8", "-m"])
            .arg(&gguf)
            .arg(prompt)
            .env("SMOE_NO_REPACK", "1");
        cmd.output().unwrap()
    };
    let stock = simple(false);
    assert!(
        stock.status.success(),
        "{}",
        String::from_utf8_lossy(&stock.stderr)
    );
    let t0 = std::time::Instant::now();
    let smoe = simple(true);
    let stderr = String::from_utf8_lossy(&smoe.stderr);
    assert!(
        smoe.status.success(),
        "exit {:?} after {:?}:\n{stderr}",
        smoe.status.code(),
        t0.elapsed()
    );
    // 16 experts through 8 active slots: prefill ran its layers in waves.
    assert!(
        waves_per_layer(&stderr) > 1.0,
        "no waves, so the ring did not shrink first:\n{stderr}"
    );
    assert_eq!(
        String::from_utf8_lossy(&smoe.stdout),
        String::from_utf8_lossy(&stock.stdout),
        "tokens differ from stock"
    );
}

#[test]
fn bad_settings_are_refused() {
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
    fails(
        &bin,
        &gguf,
        tmp.path(),
        &[("SMOE_VAULT", v), ("SMOE_RING_SLOTS", "three")],
        "SMOE_RING_SLOTS=three is not an integer",
    );
    fails(
        &bin,
        &gguf,
        tmp.path(),
        &[("SMOE_VAULT", "/nonexistent/vault")],
        "smoe_open: SMOE_ERR_IO",
    );
    fails(
        &bin,
        &gguf,
        tmp.path(),
        &[("SMOE_VAULT", v), ("SMOE_SPECULATE", "1")],
        "SMOE_SPECULATE is gone",
    );
}

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
    // 24 slots: a layer's 16 experts and 8 read ahead for the next.
    let smoe_env = |ahead: &'static str| {
        [
            ("SMOE_NO_REPACK", "1"),
            ("SMOE_VAULT", vault.to_str().unwrap()),
            ("SMOE_RING_SLOTS", "24"),
            ("SMOE_LAYER_AHEAD", ahead),
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
    assert!(
        counter(&ahead, " speculative") > 0,
        "no read ahead: {}",
        ahead.stderr()
    );
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

/// The files under `dir` whose name is `name`.
fn find_named(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                pending.push(path);
            } else if entry.file_name() == name {
                found.push(path);
            }
        }
    }
    found
}

/// Whether `needle` occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `-DLLAMA_SMOE=OFF`, the option's default, with find_package(smoe)
/// disabled: the patched tree configures and builds llama-simple without
/// smoe (no llama-smoe.cpp compiled, no smoe symbol linked), and it runs as
/// stock llama.cpp: `SMOE_VAULT` changes nothing, the text and every logit
/// are those of the smoe build without a vault.
#[test]
fn option_off_builds_stock_llama_simple() {
    let Some(Setup {
        bin,
        gguf,
        tmp,
        vault,
    }) = setup("mixtral-q8_0.gguf")
    else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("build-off")
        .env("SMOE_LLAMA_DIR", llama_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/llama.sh build-off: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let off = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert_eq!(off, llama_dir().join("build-off/bin/llama-simple"));

    let build_off = llama_dir().join("build-off");
    for object in ["llama-smoe.cpp.o", "llama-smoe.cpp.o.d"] {
        let found = find_named(&build_off, object);
        assert!(found.is_empty(), "option off, yet compiled: {found:?}");
    }
    assert!(
        contains(&std::fs::read(&bin).unwrap(), b"smoe_open"),
        "the smoe build links no smoe_open"
    );
    assert!(
        !contains(&std::fs::read(&off).unwrap(), b"smoe_open"),
        "{} links smoe",
        off.display()
    );

    let stock = run(&bin, &gguf, tmp.path(), "stock", &[]);
    let plain = run(
        &off,
        &gguf,
        tmp.path(),
        "off",
        &[("SMOE_VAULT", vault.to_str().unwrap())],
    );
    for (name, r) in [("smoe build", &stock), ("option off", &plain)] {
        assert!(
            r.out.status.success(),
            "{name}: {}\n{}",
            r.out.status,
            r.stderr()
        );
        assert!(!r.stderr().contains("smoe:"), "{name}:\n{}", r.stderr());
    }
    assert_eq!(plain.stdout(), stock.stdout());
    assert!(
        !stock.logits.is_empty()
            && stock.logits.len() == plain.logits.len()
            && stock
                .logits
                .iter()
                .zip(&plain.logits)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the option-off build's logits differ from stock"
    );
}

/// `NAME` beside llama-simple (scripts/llama.sh builds llama-cli,
/// llama-server and llama-bench too).
fn tool(bin: &Path, name: &str) -> PathBuf {
    let path = bin.with_file_name(name);
    assert!(
        path.is_file(),
        "{} is not built: run scripts/llama.sh build",
        path.display()
    );
    path
}

/// One HTTP/1.1 request to 127.0.0.1:`port` (the connection closed after
/// it): the status code and the body.
fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(120)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut reply = Vec::new();
    s.read_to_end(&mut reply)?;
    let text = String::from_utf8_lossy(&reply).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    // A chunked body: the chunks' bytes, without their sizes.
    let body = if text
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || after.len() < n {
                break;
            }
            out.push_str(&after[..n]);
            rest = after[n..].trim_start_matches("\r\n");
        }
        out
    } else {
        body.to_owned()
    };
    Ok((code, body))
}

/// A llama-server on `gguf` with 4 parallel slots, `env` set; stopped (and
/// its stderr returned) by [`Server::stop`].
struct Server {
    child: std::process::Child,
    port: u16,
    err: PathBuf,
}

impl Server {
    fn start(bin: &Path, gguf: &Path, dir: &Path, name: &str, env: &[(&str, &str)]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = dir.join(format!("{name}.err"));
        let mut cmd = Command::new(tool(bin, "llama-server"));
        cmd.args(["-m"])
            .arg(gguf)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-np", "4", "-c", "2048", "-t", "1", "--no-webui"])
            .env("SMOE_NO_REPACK", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let mut s = Server { child, port, err };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Ok((200, _)) = http(port, "GET", "/health", "") {
                return s;
            }
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("{name}: llama-server exited {status}:\n{}", s.stderr());
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: not up in 60 s:\n{}",
                s.stderr()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Four `/completion` requests at once (temperature 0): their texts,
    /// and each generated token's 4 most probable tokens with their log
    /// probabilities (`n_probs`: a log-softmax of the step's raw logits),
    /// as the server wrote them.
    fn complete_all(&self, prompts: &[&str]) -> Vec<(String, String)> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = prompts
                .iter()
                .map(|p| scope.spawn(move || self.complete(p)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// The same requests one after another.
    fn complete_each(&self, prompts: &[&str]) -> Vec<(String, String)> {
        prompts.iter().map(|p| self.complete(p)).collect()
    }

    fn complete(&self, prompt: &str) -> (String, String) {
        let body = serde_json::json!({
            "prompt": prompt, "n_predict": 16, "temperature": 0.0,
            "cache_prompt": false, "seed": 1, "n_probs": 4,
        })
        .to_string();
        let (code, reply) = http(self.port, "POST", "/completion", &body).unwrap();
        assert_eq!(code, 200, "{reply}");
        let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
        let probs = &v["completion_probabilities"];
        // (one entry a piece of text: a character of several tokens' bytes
        // is one)
        assert!(
            probs.as_array().is_some_and(|a| !a.is_empty()),
            "no probabilities: {reply}"
        );
        (v["content"].as_str().unwrap().to_owned(), probs.to_string())
    }

    /// SIGTERM, then its stderr once it has exited.
    fn stop(mut self) -> String {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("llama-server did not stop on SIGTERM:\n{}", self.stderr());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.stderr()
    }
}

/// llama-server with 4 parallel slots and 4 concurrent `/completion`
/// requests (temperature 0): each completion's text equals stock
/// llama-server's. The same requests one after another: text and the log
/// probabilities of every step's top 4 tokens as printed (the shortest
/// decimal that reads back as the same float: equal strings are equal
/// bits). The `smoe:` statistics line is printed at shutdown. Both with a
/// vault and with the experts streamed from the GGUF in place (`SMOE=1`).
#[test]
fn llama_server_serves_four_slots_as_stock_does() {
    let Some(Setup {
        bin,
        gguf,
        tmp,
        vault,
    }) = setup("qwen3moe-q8_0.gguf")
    else {
        return;
    };
    let prompts = [
        "Hello world",
        "the quick brown fox",
        LONG_PROMPT,
        "seven wise owls count",
    ];
    let stock = Server::start(&bin, &gguf, tmp.path(), "stock", &[]);
    let want = stock.complete_all(&prompts);
    let want_each = stock.complete_each(&prompts);
    stock.stop();
    let smoe = Server::start(
        &bin,
        &gguf,
        tmp.path(),
        "smoe",
        &[
            ("SMOE_VAULT", vault.to_str().unwrap()),
            ("SMOE_RING_SLOTS", "12"),
        ],
    );
    let got = smoe.complete_all(&prompts);
    let got_each = smoe.complete_each(&prompts);
    let err = smoe.stop();
    // the same server streaming from the GGUF in place
    let in_place = Server::start(
        &bin,
        &gguf,
        tmp.path(),
        "in-place",
        &[
            ("SMOE", "1"),
            ("SMOE_RING_SLOTS", "12"),
            ("SMOE_CACHE_DIR", tmp.path().join("cache").to_str().unwrap()),
        ],
    );
    let got_in_place = in_place.complete_all(&prompts);
    let got_each_in_place = in_place.complete_each(&prompts);
    let err_in_place = in_place.stop();
    for (i, (g, w)) in got_in_place.iter().zip(&want).enumerate() {
        assert_eq!(g.0, w.0, "in place, prompt {i}: completion differs");
    }
    assert_eq!(
        got_each_in_place, want_each,
        "in place, one after another: completions or log probabilities differ"
    );
    assert!(
        err_in_place.contains(&format!("smoe: model {}: ", gguf.display()))
            && err_in_place.lines().any(|l| l.starts_with("smoe: claims ")),
        "in place:\n{err_in_place}"
    );
    // Concurrent requests: the same text. (Not the same bits: which
    // requests share a batch, and where their KV cells go, depends on when
    // each arrives, and stock's own log probabilities for the long prompt
    // differ between two such runs in the last digits.)
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.0, w.0,
            "prompt {i} ({:?}): completion differs",
            prompts[i]
        );
    }
    // One after another (each batch its own): the same bits.
    for (i, (g, w)) in got_each.iter().zip(&want_each).enumerate() {
        assert_eq!(
            g, w,
            "prompt {i} ({:?}), alone: completion or log probabilities differ",
            prompts[i]
        );
    }
    assert!(want.iter().all(|w| !w.0.is_empty()), "{want:?}");
    assert!(
        err.lines().any(|l| l.starts_with("smoe: claims ")),
        "no smoe statistics at shutdown:\n{err}"
    );
}

/// A copy of the deepseek2 GGUF `src` with a next-token prediction layer,
/// as GLM-4.5's and DeepSeek-V3's GGUFs carry one: `block_count` one more,
/// `nextn_predict_layers` 1, and the last layer's expert tensors copied as
/// the new layer's (all llama.cpp needs of a layer it skips).
fn with_nextn_layer(src: &Path, dst: &Path) {
    use smoe::internals::model::gguf::{header_bytes, Gguf, KeyValue, TensorInfo};
    let file = std::fs::File::open(src).unwrap();
    let g = Gguf::read(&file, src, &|| false).unwrap();
    let bytes = std::fs::read(src).unwrap();
    let arch = g.architecture().unwrap().to_owned();
    let count_key = format!("{arch}.block_count");
    let n = g.kv(&count_key).unwrap().as_u64().unwrap();
    let mut kvs = g.kvs.clone();
    for kv in kvs.iter_mut().filter(|kv| kv.key == count_key) {
        assert_eq!(kv.value_type, 4, "block_count is a u32");
        kv.raw = (n as u32 + 1).to_le_bytes().to_vec();
    }
    kvs.push(KeyValue {
        key: format!("{arch}.nextn_predict_layers"),
        value_type: 4,
        raw: 1u32.to_le_bytes().to_vec(),
    });
    let data = |t: &TensorInfo| {
        let at = (g.data_offset + t.offset) as usize;
        bytes[at..at + t.bytes as usize].to_vec()
    };
    let mut tensors: Vec<(TensorInfo, Vec<u8>)> =
        g.tensors.iter().map(|t| (t.clone(), data(t))).collect();
    let last = format!("blk.{}.", n - 1);
    for t in g
        .tensors
        .iter()
        .filter(|t| t.name.starts_with(&last) && t.name.contains("_exps."))
    {
        let mut copy = t.clone();
        copy.name = t.name.replacen(&last, &format!("blk.{n}."), 1);
        tensors.push((copy, data(t)));
    }
    let mut infos: Vec<TensorInfo> = tensors.iter().map(|(t, _)| t.clone()).collect();
    let mut out = header_bytes(&kvs, &mut infos, g.alignment);
    let base = out.len();
    for (t, (_, d)) in infos.iter().zip(&tensors) {
        out.resize(base + t.offset as usize, 0);
        out.extend_from_slice(d);
    }
    out.resize(out.len().next_multiple_of(g.alignment as usize), 0);
    std::fs::write(dst, out).unwrap();
}

/// A layer llama.cpp skips (a next-token prediction layer when it is not
/// loaded) is not streamed: its experts are never bound, read or counted
/// in the ring, and the model's last layer stays the last one with experts
/// (it used to be the skipped one, which no graph computes, so pre-warm
/// stayed paused after the first graph). The text is stock's.
#[test]
fn a_skipped_nextn_layer_is_not_streamed() {
    let Some(Setup { bin, tmp, .. }) = setup_in_place("deepseekv3-q8_0.gguf") else {
        return;
    };
    let gguf = tmp.path().join("deepseekv3-nextn.gguf");
    with_nextn_layer(&fixtures().join("deepseekv3-q8_0.gguf"), &gguf);
    let stock = run(&bin, &gguf, tmp.path(), "stock", &[("SMOE_NO_REPACK", "1")]);
    assert!(stock.out.status.success(), "{}", stock.stderr());
    assert!(
        stock.stderr().contains("ffn_down_exps.weight") && stock.stderr().contains("ignoring"),
        "stock does not skip the added layer:\n{}",
        stock.stderr()
    );
    let cache = tmp.path().join("cache");
    let smoe = run(
        &bin,
        &gguf,
        tmp.path(),
        "smoe",
        &[
            ("SMOE", "1"),
            ("SMOE_NO_REPACK", "1"),
            ("SMOE_CACHE_DIR", cache.to_str().unwrap()),
        ],
    );
    assert!(smoe.out.status.success(), "{}", smoe.stderr());
    assert_eq!(smoe.stdout(), stock.stdout(), "{}", smoe.stderr());
    assert!(same_logits(&smoe, &stock), "logits differ");
    let err = smoe.stderr();
    assert!(
        err.contains("expert tensors in 2 layers streamed"),
        "the skipped layer was streamed (or the fixture changed):\n{err}"
    );
}

/// A claim that fails ends with its ubatch: llama-server, whose decode was
/// refused, halves its batch and tries again, and the request completes
/// with stock's text; the next request too. (The flag that stopped the
/// graph used to stay set: every later decode failed at once, and the
/// server, halving its batch to nothing, aborted.)
#[test]
fn llama_server_goes_on_after_a_failed_claim() {
    let Some(Setup { bin, gguf, tmp, .. }) = setup("qwen3moe-q8_0.gguf") else {
        return;
    };
    let prompts = [LONG_PROMPT, "Hello world"];
    let stock = Server::start(&bin, &gguf, tmp.path(), "stock-once", &[]);
    let want = stock.complete_each(&prompts);
    stock.stop();
    let smoe = Server::start(
        &bin,
        &gguf,
        tmp.path(),
        "fail-once",
        &[
            ("SMOE", "1"),
            ("SMOE_RING_SLOTS", "12"),
            ("SMOE_TEST_FAIL_CLAIMS", "1"),
            ("SMOE_CACHE_DIR", tmp.path().join("cache").to_str().unwrap()),
        ],
    );
    let got = smoe.complete_each(&prompts);
    let err = smoe.stop();
    assert!(
        err.contains("SMOE_TEST_FAIL_CLAIMS: layer 0's claim failed"),
        "the failure did not happen:\n{err}"
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.0, w.0, "prompt {i}: completion differs:\n{err}");
    }
    assert!(
        err.lines().any(|l| l.starts_with("smoe: claims ")),
        "no smoe statistics at shutdown:\n{err}"
    );
}

/// `llama-bench -p 512 -n 64` with SMOE_VAULT set and a ring of half a
/// layer's experts: both tests run (a pp512 row and a tg64 row, each with
/// a rate), through waves that evict, and the smoe statistics line is
/// printed.
#[test]
fn llama_bench_runs_with_smoe() {
    llama_bench(Source::Vault);
}

/// [`llama_bench_runs_with_smoe`] with `SMOE=1`: the experts streamed from
/// the GGUF in place.
#[test]
fn llama_bench_runs_in_place() {
    llama_bench(Source::Model);
}

fn llama_bench(source: Source) {
    let fixture = "qwen3moe-q8_0.gguf";
    // `tmp` holds the vault: it must outlive the run
    let Some(Setup {
        bin,
        gguf,
        vault,
        tmp,
    }) = (if source == Source::Vault {
        setup(fixture)
    } else {
        setup_in_place(fixture)
    })
    else {
        return;
    };
    let out = Command::new(tool(&bin, "llama-bench"))
        .arg("-m")
        .arg(&gguf)
        .args(["-p", "512", "-n", "64", "-t", "1", "-r", "1", "-o", "csv"])
        .args(["--repack", "0"])
        .envs(source.env(&gguf, &vault))
        .env("SMOE_RING_SLOTS", "8")
        .env("SMOE_CACHE_DIR", tmp.path().join("cache"))
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    // csv: a header, then a row per test; pp512 has n_prompt 512 and n_gen
    // 0, tg64 the other way round
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().expect(&stdout).split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| h.trim_matches('"') == name)
            .unwrap_or_else(|| panic!("no {name} column: {stdout}"))
    };
    let (n_prompt, n_gen, avg_ts) = (column("n_prompt"), column("n_gen"), column("avg_ts"));
    let rows: Vec<(String, String, f64)> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(|f| f.trim_matches('"')).collect();
            (
                f[n_prompt].to_owned(),
                f[n_gen].to_owned(),
                f[avg_ts].parse().expect(l),
            )
        })
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1.as_str()),
        ("512", "0"),
        "{stdout}"
    );
    assert_eq!(
        (rows[1].0.as_str(), rows[1].1.as_str()),
        ("0", "64"),
        "{stdout}"
    );
    assert!(rows.iter().all(|r| r.2 > 0.0), "{stdout}");
    assert!(
        stderr.contains(&source.named(&gguf, &vault)) && stderr.contains("ring of 8 slots"),
        "{stderr}"
    );
    assert!(waves_per_layer(&stderr) > 1.0, "{stderr}");
    assert!(evictions(&stderr) > 0, "{stderr}");
}

/// llama-cli, one turn (`-st`, plain I/O), replies as stock does, with a
/// vault and with the experts streamed from the GGUF in place (`SMOE=1`).
#[test]
fn llama_cli_prints_stocks_text() {
    let Some(Setup {
        bin,
        gguf,
        vault,
        tmp,
    }) = setup("mixtral-q8_0.gguf")
    else {
        return;
    };
    let cli = |smoe: Option<Source>| {
        let mut cmd = Command::new(tool(&bin, "llama-cli"));
        cmd.arg("-m")
            .arg(&gguf)
            .args([
                "-p",
                PROMPT,
                "-n",
                "24",
                "-t",
                "1",
                "--temp",
                "0",
                "-st",
                "--simple-io",
            ])
            .env("SMOE_NO_REPACK", "1")
            .stdin(std::process::Stdio::null());
        if let Some(source) = smoe {
            cmd.envs(source.env(&gguf, &vault))
                .env("SMOE_RING_SLOTS", "3")
                .env("SMOE_CACHE_DIR", tmp.path().join("cache"));
        }
        cmd.output().unwrap()
    };
    // The reply: what it prints after echoing the prompt, up to its timings.
    let reply = |out: &Output| {
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let start = text
            .find(&format!("> {PROMPT}"))
            .unwrap_or_else(|| panic!("no prompt echo in {text:?}"));
        let rest = &text[start..];
        rest[..rest.find("[ Prompt:").unwrap_or(rest.len())].to_owned()
    };
    let stock = cli(None);
    assert!(
        stock.status.success(),
        "{}",
        String::from_utf8_lossy(&stock.stderr)
    );
    let want = reply(&stock);
    assert!(want.len() > PROMPT.len() + 4, "no reply: {want:?}");
    for source in [Source::Vault, Source::Model] {
        let smoe = cli(Some(source));
        let stderr = String::from_utf8_lossy(&smoe.stderr);
        assert!(smoe.status.success(), "{source:?}: {stderr}");
        assert_eq!(reply(&smoe), want, "{source:?}");
        assert!(
            stderr.contains(&source.named(&gguf, &vault)) && stderr.contains("smoe: claims "),
            "{source:?}: {stderr}"
        );
    }
}

/// A running `ggml-rpc-server` on 127.0.0.1, killed when dropped.
struct RpcServer {
    child: std::process::Child,
    endpoint: String,
}

impl RpcServer {
    /// Starts the patched build's RPC server on a free port and waits until
    /// it accepts connections (10 s at most).
    fn start(bin_dir: &Path) -> RpcServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(bin_dir.join("ggml-rpc-server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "2"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("ggml-rpc-server starts");
        let endpoint = format!("127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(&endpoint).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "ggml-rpc-server never listened on {endpoint}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        RpcServer { child, endpoint }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The MiB of experts smoe's op offload line says it copied to the device, and
/// of them copied ahead.
fn copied_mib(line: &str) -> (f64, f64) {
    let before = |end: &str| -> f64 {
        let head = &line[..line
            .find(end)
            .unwrap_or_else(|| panic!("no '{end}' in {line}"))];
        head.rsplit(' ').next().unwrap().parse().unwrap()
    };
    (
        before(" MiB of experts copied"),
        before(" MiB of them ahead"),
    )
}

/// Op offload of a big batch's experts (issue 37), checked without a GPU:
/// ggml's RPC backend, served on this machine, stands for one (the patch's
/// test aid `SMOE_TEST_RPC_OFFLOAD=1` makes it ask for MUL_MAT_ID batches of
/// 32 tokens or more, as CUDA does). With `-ngl 99` a long prompt's first
/// layer computes its experts there: stock copies them from its mmap
/// (`--cpu-moe`), smoe each claimed one from its ring slot. The greedy text
/// is stock's, op offload on or off, and smoe says what it copied; the
/// ring views' ops never go to the device (the claim and release ops, custom
/// ops, stay on the CPU, which the patched RPC device now insists on).
#[test]
fn op_offload_through_an_rpc_device_keeps_stock_text() {
    let Some(s) = setup_in_place("qwen3moe-q8_0.gguf") else {
        return;
    };
    let bin_dir = s.bin.parent().unwrap().to_path_buf();
    for t in ["llama-completion", "ggml-rpc-server"] {
        if !bin_dir.join(t).is_file() {
            smoe_test_support::skip_or_fail(&format!(
                "{} is not built: run scripts/llama.sh build",
                bin_dir.join(t).display()
            ));
            return;
        }
    }
    let server = RpcServer::start(&bin_dir);
    let cache = s.tmp.path().join("cache");
    let complete = |name: &str, args: &[&str], env: &[(&str, &str)]| -> (String, String) {
        let out = Command::new(bin_dir.join("llama-completion"))
            .args([
                "-m",
                s.gguf.to_str().unwrap(),
                "--rpc",
                &server.endpoint,
                "-ngl",
                "99",
            ])
            .args([
                "-n",
                "16",
                "--temp",
                "0",
                "--seed",
                "1",
                "-no-cnv",
                "-t",
                "2",
                "-p",
                LONG_PROMPT,
            ])
            .args(args)
            .env_remove("SMOE")
            .env_remove("SMOE_VAULT")
            .env_remove("SMOE_OP_OFFLOAD")
            .env_remove("SMOE_RING_SLOTS")
            .env_remove("SMOE_UBATCH")
            .env_remove("SMOE_PIN")
            .env_remove("SMOE_COPY_AHEAD")
            .env_remove("GGML_CUDA_REGISTER_HOST")
            .env("SMOE_TEST_RPC_OFFLOAD", "1")
            .env("SMOE_CACHE_DIR", &cache)
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{name} failed:\n{err}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), err)
    };
    let (stock, _) = complete("stock", &["--cpu-moe"], &[]);
    let (smoe, err) = complete("smoe", &[], &[("SMOE", "1")]);
    assert!(!stock.trim().is_empty());
    assert_eq!(
        smoe, stock,
        "smoe's text with op offload differs from stock's\n{err}"
    );
    assert!(err.contains("smoe: op offload on RPC"), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("smoe: op offload: "))
        .unwrap_or_else(|| panic!("no op offload statistics\n{err}"));
    let batches: u64 = line["smoe: op offload: ".len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        batches >= 1,
        "no layer batch was computed on the device: {line}"
    );
    assert!(!line.contains(" 0.00 MiB of experts copied"), "{line}");
    // gate and down are copied ahead (on the device's second backend) while up and gate
    // compute: two of each layer's three weights, which are the same size here (the line
    // rounds each figure to 0.01 MiB)
    let (copied, ahead) = copied_mib(line);
    assert!(
        (ahead - copied * 2.0 / 3.0).abs() <= 0.01 + 0.01 * copied,
        "not two thirds of the bytes copied ahead: {line}"
    );
    let (smoe_in_order, err) = complete(
        "smoe-in-order",
        &[],
        &[("SMOE", "1"), ("SMOE_COPY_AHEAD", "0")],
    );
    assert_eq!(smoe_in_order, stock, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("smoe: op offload: "))
        .unwrap_or_else(|| panic!("no op offload statistics\n{err}"));
    assert_eq!(copied_mib(line), (copied, 0.0), "{line}");

    // A ring of 20 slots (a layer's 16 experts and a few) and batches of 32 tokens: each
    // batch's device claims are released by the next claim op and their slots loaded
    // again with other experts, batch after batch
    let (stock_small, _) = complete("stock-ub32", &["--cpu-moe", "-ub", "32"], &[]);
    let (smoe_small, err) = complete(
        "smoe-ub32",
        &["-ub", "32"],
        &[
            ("SMOE", "1"),
            ("SMOE_RING_SLOTS", "20"),
            ("SMOE_UBATCH", "0"),
        ],
    );
    assert_eq!(smoe_small, stock_small, "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("smoe: op offload: ") && !l.starts_with("smoe: op offload: 0 ")),
        "{err}"
    );

    let (stock_off, _) = complete("stock-nopo", &["--cpu-moe", "--no-op-offload"], &[]);
    let (smoe_off, err) = complete("smoe-nopo", &[], &[("SMOE", "1"), ("SMOE_OP_OFFLOAD", "0")]);
    assert_eq!(smoe_off, stock_off, "{err}");
    assert!(
        err.contains("smoe: op offload is off (SMOE_OP_OFFLOAD=0)"),
        "{err}"
    );
    assert!(!err.contains("smoe: op offload: "), "{err}");
}

/// scripts/llama.sh replaces parts of its cache: pointed (SMOE_LLAMA_DIR)
/// at a directory it did not make, a llama.cpp checkout say (named as its
/// cache's own tree is), it stops before touching it, naming what is there.
#[test]
fn the_build_script_refuses_a_directory_it_did_not_make() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama.sh");
    for (what, made) in [("notes.txt", true), (".git", false), ("llama.cpp", false)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(what);
        if made {
            std::fs::write(&path, "mine").unwrap();
        } else {
            std::fs::create_dir(&path).unwrap();
            std::fs::write(path.join("mine"), "mine").unwrap();
        }
        let before = listing(dir.path());
        let out = Command::new("bash")
            .arg(&script)
            .arg("build")
            .env("SMOE_LLAMA_DIR", dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && stderr.contains(&format!(
                    "holds {what}, and this script did not make the directory"
                )),
            "{what}: {}\n{stderr}",
            out.status
        );
        assert_eq!(listing(dir.path()), before, "{what}: the directory changed");
    }
}

/// Every path under `dir` with its bytes (a directory's are empty).
fn listing(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path.clone());
                out.push((path, Vec::new()));
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.push((path, bytes));
            }
        }
    }
    out.sort();
    out
}
