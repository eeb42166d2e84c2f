//! Lookahead in decode (issue 48, docs/llama.md "Lookahead"): while a
//! layer computes, the glue guesses the next layers' experts from its state
//! and queues them as speculation. Only reads change: the logits stay
//! stock's, bit for bit, and the `smoe: decode:` line counts the guesses.

use super::*;

/// What the `smoe: decode:` line says: (tokens, guessed, routed, guesses,
/// stale reads dropped).
fn decode_line(stderr: &str) -> (u64, u64, u64, u64, u64) {
    let line = stderr
        .lines()
        .find_map(|l| smoe_tail(l, "smoe: decode: "))
        .unwrap_or_else(|| panic!("no `smoe: decode:` line in:\n{stderr}"));
    let before = |after: &str| -> u64 {
        let head = &line[..line
            .find(after)
            .unwrap_or_else(|| panic!("no {after:?} in {line}"))];
        head.rsplit([' ', '(']).next().unwrap().parse().unwrap()
    };
    let tokens = line["smoe: decode: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    (
        tokens,
        before(" of "),
        before(" routed experts guessed"),
        before(" guesses"),
        before(" stale reads dropped"),
    )
}

/// The still fixture (`derived/qwen3moe-q8_0-still.gguf`: every layer
/// layer 0's copy, no attention output, no experts' down projection) never
/// moves the hidden state, so the next layer's router applied to a layer's
/// state is that layer's routing: every guess is right. Through a ring
/// smaller than a token's experts the counters are exact (each decoded
/// token: 7 guessed layers of 2 experts), the logits bitwise stock's, and
/// `SMOE_LOOKAHEAD=0` guesses nothing. (`SMOE_LOOKAHEAD_ADAPT=0`: guesses
/// in every token; adapting, see `lookahead_adapts_by_probes`.)
#[test]
fn lookahead_counts_exactly_on_a_model_whose_routing_is_known() {
    let Some(s) = setup_in_place("derived/qwen3moe-q8_0-still.gguf") else {
        return;
    };
    let run = |name: &str, env: &[(&str, &str)]| {
        let mut all = vec![("SMOE_NO_REPACK", "1")];
        all.extend_from_slice(env);
        run_predicting(&s.bin, &s.gguf, s.tmp.path(), name, PROMPT, 1, "16", &all)
    };
    let stock = run("stock", &[]);
    for (depth, guessed_per_token) in [("1", 7), ("2", 13)] {
        let env = [
            ("SMOE", "1"),
            ("SMOE_RING_SLOTS", "12"),
            ("SMOE_PREWARM", "0"),
            ("SMOE_LOOKAHEAD", depth),
            ("SMOE_LOOKAHEAD_ADAPT", "0"),
        ];
        let smoe = run(&format!("smoe-lookahead-{depth}"), &env);
        let err = smoe.stderr();
        assert!(smoe.out.status.success(), "{err}");
        assert!(
            same_logits(&smoe, &stock),
            "lookahead {depth}: not stock's logits\n{err}"
        );
        let (tokens, guessed, routed, guesses, _) = decode_line(&err);
        assert!(tokens >= 15, "{err}");
        // 7 layers after the first, top-2 each: every routed expert was guessed
        assert_eq!((guessed, routed), (tokens * 7 * 2, tokens * 7 * 2), "{err}");
        // a guess a layer ahead: 7 a token; two ahead: 6 of 2 layers and the last of 1
        assert_eq!(guesses, tokens * guessed_per_token, "{err}");
        assert!(err.contains("recall 100.0%"), "{err}");
    }
    let off = run(
        "smoe-lookahead-0",
        &[
            ("SMOE", "1"),
            ("SMOE_RING_SLOTS", "12"),
            ("SMOE_PREWARM", "0"),
            ("SMOE_LOOKAHEAD", "0"),
        ],
    );
    let err = off.stderr();
    assert!(same_logits(&off, &stock), "{err}");
    let (_, guessed, routed, guesses, dropped) = decode_line(&err);
    assert_eq!((guessed, routed, guesses, dropped), (0, 0, 0, 0), "{err}");
}

/// On a model whose layers differ (the 8-layer fixture), guesses go wrong
/// too; wider and deeper guesses, and the stale reads they leave, still
/// change only reads: the logits of every step are stock's.
#[test]
fn wrong_guesses_keep_stocks_logits() {
    let Some(s) = setup_in_place("derived/qwen3moe-q8_0-8layers.gguf") else {
        return;
    };
    let run = |name: &str, env: &[(&str, &str)]| {
        let mut all = vec![("SMOE_NO_REPACK", "1")];
        all.extend_from_slice(env);
        run_predicting(&s.bin, &s.gguf, s.tmp.path(), name, PROMPT, 1, "24", &all)
    };
    let stock = run("stock", &[]);
    for (depth, width) in [("1", "0"), ("2", "6"), ("3", "16")] {
        let env = [
            ("SMOE", "1"),
            ("SMOE_RING_SLOTS", "20"),
            ("SMOE_PREWARM", "0"),
            ("SMOE_LOOKAHEAD", depth),
            ("SMOE_LOOKAHEAD_WIDTH", width),
            ("SMOE_LOOKAHEAD_ADAPT", "0"),
        ];
        let smoe = run(&format!("smoe-{depth}-{width}"), &env);
        let err = smoe.stderr();
        assert!(smoe.out.status.success(), "{err}");
        assert!(
            same_logits(&smoe, &stock),
            "lookahead {depth} x {width}: not stock's logits\n{err}"
        );
        let (_, guessed, routed, guesses, _) = decode_line(&err);
        assert!(guesses > 0 && routed > 0 && guessed <= routed, "{err}");
    }
}

/// Lookahead is off by default (`SMOE_LOOKAHEAD=0`: measured, it did not
/// pay on decode the drive bounds). On, the glue guesses only while guessing
/// pays: decoded tokens
/// are timed in a probe that alternates guessing and not, 8 tokens each,
/// and the next 112 follow the faster. The line says how many probes ran
/// and how many tokens guessed; the logits stay stock's.
#[test]
fn lookahead_adapts_by_probes() {
    let Some(s) = setup_in_place("derived/qwen3moe-q8_0-still.gguf") else {
        return;
    };
    let run = |name: &str, env: &[(&str, &str)]| {
        let mut all = vec![("SMOE_NO_REPACK", "1")];
        all.extend_from_slice(env);
        run_predicting(&s.bin, &s.gguf, s.tmp.path(), name, PROMPT, 1, "40", &all)
    };
    let stock = run("stock", &[]);
    let env = [
        ("SMOE", "1"),
        ("SMOE_RING_SLOTS", "12"),
        ("SMOE_PREWARM", "0"),
        ("SMOE_LOOKAHEAD", "1"),
    ];
    let smoe = run("smoe-adapt", &env);
    // off by default: no guess, no probe
    let off = run("smoe-default", &env[..3]);
    assert!(same_logits(&off, &stock), "{}", off.stderr());
    assert_eq!(decode_line(&off.stderr()).3, 0, "{}", off.stderr());
    let err = smoe.stderr();
    assert!(same_logits(&smoe, &stock), "{err}");
    let line = err
        .lines()
        .find_map(|l| smoe_tail(l, "smoe: decode: "))
        .unwrap_or_else(|| panic!("{err}"));
    let (tokens, _, _, guesses, _) = decode_line(&err);
    assert!(tokens >= 39, "{line}");
    // the probe's 8 tokens with guesses, 7 guessed layers each, and the
    // rest of the tokens either all guessing (the probe found it faster) or
    // none
    assert!(line.contains(" of 1 probes found them faster"), "{line}");
    let guessed_tokens: u64 = line[line.find("guesses queued in ").unwrap() + 18..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        guessed_tokens == 8 || guessed_tokens == tokens - 8,
        "{line}"
    );
    assert_eq!(guesses, guessed_tokens * 7, "{line}");
}
