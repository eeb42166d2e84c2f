//! Op offload through ggml's RPC device, the tests' stand-in for a GPU.

use super::*;

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

/// The qwen3moe fixture read in place, the build's folder, and an RPC server
/// of that build; None (having said why) when llama-completion or the server
/// is not built.
fn rpc_setup() -> Option<(Setup, PathBuf, RpcServer)> {
    let s = setup_in_place("qwen3moe-q8_0.gguf")?;
    let bin_dir = s.bin.parent().unwrap().to_path_buf();
    for t in ["llama-completion", "ggml-rpc-server"] {
        if !bin_dir.join(t).is_file() {
            smoe_test_support::skip_or_fail(&format!(
                "{} is not built: run scripts/llama.sh build",
                bin_dir.join(t).display()
            ));
            return None;
        }
    }
    let server = RpcServer::start(&bin_dir);
    Some((s, bin_dir, server))
}

/// llama-completion on `gguf` through the RPC device at `endpoint`, `-ngl 99`,
/// greedy, `n` tokens after `prompt`, 2 threads: its text and its stderr
/// ([`logged_output`]: run again when its log lost its tail).
#[allow(clippy::too_many_arguments)]
fn completion(
    bin_dir: &Path,
    endpoint: &str,
    gguf: &Path,
    cache: &Path,
    name: &str,
    n: &str,
    prompt: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, String) {
    let out = logged_output(name, || {
        Command::new(bin_dir.join("llama-completion"))
            .arg("-m")
            .arg(gguf)
            .args(["--rpc", endpoint, "-ngl", "99", "-n", n, "--temp", "0"])
            .args(["--seed", "1", "-no-cnv", "-t", "2", "-p", prompt])
            .args(args)
            .env_remove("SMOE")
            .env_remove("SMOE_VAULT")
            .env_remove("SMOE_OP_OFFLOAD")
            .env_remove("SMOE_RING_SLOTS")
            .env_remove("SMOE_UBATCH")
            .env_remove("SMOE_PIN")
            .env_remove("SMOE_COPY_AHEAD")
            .env_remove("SMOE_VRAM")
            .env_remove("GGML_CUDA_REGISTER_HOST")
            .env("SMOE_TEST_RPC_OFFLOAD", "1")
            .env("SMOE_CACHE_DIR", cache)
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    });
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{name} failed:\n{err}");
    // the text, less the newlines printed after it: the tool's logger thread, leaked at exit
    // (llama.cpp #22142), can lose that last write to stdout while stderr is whole
    let text = String::from_utf8_lossy(&out.stdout);
    (text.trim_end_matches('\n').to_owned(), err)
}

/// The figure before `what` in smoe's device tier line ("N hits", ...).
fn tier_figure(line: &str, what: &str) -> u64 {
    let head = &line[..line
        .find(what)
        .unwrap_or_else(|| panic!("no '{what}' in {line}"))];
    head.trim_end()
        .rsplit([' ', '(', ';'])
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("no figure before '{what}' in {line}"))
}

/// The device tier (issue 50, `SMOE_VRAM`), checked without a GPU through
/// the RPC device: in decode each layer's experts the tier holds are
/// computed there from its VRAM slots, the rest from the ring, and the text
/// is stock `--cpu-moe`'s. A tier of a quarter of the experts fills, evicts
/// by its rule and hits; a budget too small for one slot, or none, builds
/// no tier, and the output is the same.
#[test]
fn a_device_tier_through_an_rpc_device_keeps_stock_text() {
    let Some((s, bin_dir, server)) = rpc_setup() else {
        return;
    };
    let cache = s.tmp.path().join("cache");
    let prompt = "the quick brown fox jumps over the lazy dog";
    let complete = |name: &str, args: &[&str], env: &[(&str, &str)]| {
        completion(
            &bin_dir,
            &server.endpoint,
            &s.gguf,
            &cache,
            name,
            "64",
            prompt,
            args,
            env,
        )
    };
    let (stock, _) = complete("stock", &["--cpu-moe"], &[]);
    assert!(!stock.trim().is_empty());
    // 2 layers x 16 experts of 6,528 bytes: 61,440 bytes hold 8 slots and the zeros
    let (tiered, err) = complete("tier", &[], &[("SMOE", "1"), ("SMOE_VRAM", "60K")]);
    assert_eq!(tiered, stock, "the device tier changed the text\n{err}");
    assert!(
        err.contains("smoe: device tier on RPC0: 8 slots of"),
        "{err}"
    );
    let line = err
        .lines()
        .find_map(|l| smoe_tail(l, "smoe: device tier: "))
        .unwrap_or_else(|| panic!("no device tier statistics\n{err}"));
    let (lookups, hits) = (tier_figure(line, " lookups"), tier_figure(line, " hits"));
    let (promotions, evictions) = (
        tier_figure(line, " promotions"),
        tier_figure(line, " evictions"),
    );
    // 63 decoded tokens, 2 layers, top-2: the decode's experts are looked up
    assert!(lookups >= 63 * 2 * 2, "{line}");
    assert!(hits > 0 && hits < lookups, "{line}");
    assert!(
        promotions >= 8 && evictions > 0,
        "a full tier evicts by its rule: {line}"
    );
    assert_eq!(tier_figure(line, " failed"), 0, "{line}");
    // the experts the GPU computed were neither claimed nor read from the ring; it computes
    // those of the map it reads, which holds a hit's expert, and an expert whose slot the
    // rule gave to another in the same token (its bytes stay until the copy)
    let device = tier_figure(line, " computed on the device");
    assert!(device >= hits, "{line}");
    let (_, untiered) = complete("no tier", &[], &[("SMOE", "1")]);
    let claims = |e: &str| number_after(e, "smoe: claims ");
    assert_eq!(
        claims(&err) + device,
        claims(&untiered),
        "{} claims with the tier, {} without, {device} computed on the device",
        claims(&err),
        claims(&untiered)
    );
    for (name, vram, says) in [
        ("no budget", None, None),
        ("zero", Some("0"), None),
        (
            "too small",
            Some("10000"),
            Some("smoe: no device tier: SMOE_VRAM=10000 (10000 bytes) holds no expert"),
        ),
    ] {
        let mut env = vec![("SMOE", "1")];
        env.extend(vram.map(|v| ("SMOE_VRAM", v)));
        let (text, err) = complete(name, &[], &env);
        assert_eq!(text, stock, "{name}\n{err}");
        assert!(!err.contains("smoe: device tier"), "{name}: {err}");
        if let Some(says) = says {
            assert!(err.contains(says), "{name}: {err}");
        }
    }
    // a share of the device's free memory (the RPC server's: this machine's, room for every
    // expert): a tier of all 32 experts, said with the share, the text stock's
    let (shared, err) = complete("share", &[], &[("SMOE", "1"), ("SMOE_VRAM", "50%")]);
    assert_eq!(shared, stock, "a tier from a share\n{err}");
    assert!(
        err.contains("smoe: device tier on RPC0: 32 slots of")
            && err.contains("of SMOE_VRAM=50%, "),
        "{err}"
    );
    // a ring of 3 slots, less than a token's 4 experts, and a tier that could take every
    // expert: the claims kept for the tier's copies (an eighth of the ring at most) leave
    // the later layers room, and the text holds (two layers are too few to show the ring
    // running out without that bound: the later layer's waves take the one slot left in turn)
    let (small, err) = complete(
        "small ring",
        &[],
        &[("SMOE", "1"), ("SMOE_VRAM", "1M"), ("SMOE_RING_SLOTS", "3")],
    );
    assert_eq!(small, stock, "a small ring with a tier\n{err}");
    let line = err
        .lines()
        .find_map(|l| smoe_tail(l, "smoe: device tier: "))
        .unwrap_or_else(|| panic!("no device tier statistics\n{err}"));
    assert!(tier_figure(line, " hits") > 0, "{line}");
    // a value that is not a size stops the load, naming it, GPU or not (llama-simple: its
    // log is written at once, where llama-completion's leaked logger may lose the line)
    let bad = run(
        &s.bin,
        &s.gguf,
        s.tmp.path(),
        "bad",
        &[("SMOE", "1"), ("SMOE_VRAM", "lots")],
    );
    assert!(!bad.out.status.success(), "{}", bad.stderr());
    assert!(
        bad.stderr()
            .contains("SMOE_VRAM=lots is not a size in bytes"),
        "{}",
        bad.stderr()
    );
    for share in ["0%", "91%", "5%%"] {
        let bad = run(
            &s.bin,
            &s.gguf,
            s.tmp.path(),
            "bad share",
            &[("SMOE", "1"), ("SMOE_VRAM", share)],
        );
        assert!(!bad.out.status.success(), "{share}: {}", bad.stderr());
        assert!(
            bad.stderr().contains(&format!("SMOE_VRAM={share} is not")),
            "{share}: {}",
            bad.stderr()
        );
    }
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
    let Some((s, bin_dir, server)) = rpc_setup() else {
        return;
    };
    let cache = s.tmp.path().join("cache");
    let complete = |name: &str, args: &[&str], env: &[(&str, &str)]| -> (String, String) {
        completion(
            &bin_dir,
            &server.endpoint,
            &s.gguf,
            &cache,
            name,
            "16",
            LONG_PROMPT,
            args,
            env,
        )
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
        .find_map(|l| smoe_tail(l, "smoe: op offload: "))
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
        .find_map(|l| smoe_tail(l, "smoe: op offload: "))
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
            .filter_map(|l| smoe_tail(l, "smoe: op offload: "))
            .any(|l| !l.starts_with("smoe: op offload: 0 ")),
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
