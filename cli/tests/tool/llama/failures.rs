//! What stops a load or a generation, each with smoe's message: bad
//! settings, vaults of other models, corrupt blobs, the elastic ring under
//! pressure.

use super::*;

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
    fails(
        &bin,
        &gguf,
        tmp.path(),
        &[("SMOE_VAULT", v), ("SMOE_LOOKAHEAD", "9")],
        "SMOE_LOOKAHEAD=9 is not an integer from 0 to 8",
    );
    fails(
        &bin,
        &gguf,
        tmp.path(),
        &[("SMOE_VAULT", v), ("SMOE_LOOKAHEAD_WIDTH", "wide")],
        "SMOE_LOOKAHEAD_WIDTH=wide is not an integer",
    );
}
