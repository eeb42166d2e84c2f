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

mod failures;
mod identical;
mod lookahead;
mod offload;
mod reads;
mod script;
mod tools;
mod ubatch;

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
/// CI) when it is not built, or built from another patch or glue than this
/// checkout's (`scripts/llama.sh current` says: a test never runs a stale
/// build).
fn llama_simple() -> Option<PathBuf> {
    let bin = llama_dir().join("build/bin/llama-simple");
    if !bin.is_file() {
        smoe_test_support::skip_or_fail(&format!(
            "{} is not built: run scripts/llama.sh build (SMOE_LLAMA_DIR picks the cache)",
            bin.display()
        ));
        return None;
    }
    let current = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama.sh"))
        .arg("current")
        .env("SMOE_LLAMA_DIR", llama_dir())
        .output()
        .unwrap();
    if !current.status.success() {
        smoe_test_support::skip_or_fail(String::from_utf8_lossy(&current.stderr).trim());
        return None;
    }
    Some(bin)
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
        "SMOE_LOOKAHEAD",
        "SMOE_LOOKAHEAD_WIDTH",
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
        "SMOE_TRACE",
        "SMOE_VRAM",
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

/// The output of a llama.cpp tool that writes its text through common/log.cpp's
/// logger (llama-completion, llama-speculative): its queue and thread are leaked
/// at exit on purpose (llama.cpp #22142), so under load its last entries, or
/// all of them, can be lost, stock's as well as smoe's. They are lost as a
/// suffix, in order, and the text ends before the `common_perf_print:` lines:
/// a run whose stderr lacks them is run again (4 times at most).
fn logged_output(name: &str, run: impl Fn() -> Output) -> Output {
    for _ in 0..4 {
        let out = run();
        if !out.status.success()
            || String::from_utf8_lossy(&out.stderr).contains("common_perf_print:")
        {
            return out;
        }
        eprintln!("{name}: the tool's log lost its last lines; running it again");
    }
    panic!("{name}: the tool's log lost its last lines 4 times in a row");
}

/// `line` from `prefix` on, where the line holds it: the glue writes its
/// lines straight to stderr, and a tool's logger thread (llama.cpp's
/// common/log.cpp) may have written a timestamp prefix of its own just before.
fn smoe_tail<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    line.find(prefix).map(|i| &line[i..])
}

/// The `smoe: claims …` statistics line a run printed at its end.
fn smoe_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find_map(|l| smoe_tail(l, "smoe: claims "))
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
