//! The CMake option off, and llama.cpp's other tools: llama-server,
//! llama-bench, llama-cli, a skipped next-token prediction layer.

use super::*;

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
/// smoe (none of the glue's sources compiled, no smoe symbol linked), and it runs as
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
    for object in [
        "llama-smoe.cpp.o",
        "llama-smoe-lookahead.cpp.o",
        "llama-smoe-offload.cpp.o",
        "llama-smoe-tier.cpp.o",
    ] {
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
            && err_in_place
                .lines()
                .any(|l| smoe_tail(l, "smoe: claims ").is_some()),
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
        err.lines().any(|l| smoe_tail(l, "smoe: claims ").is_some()),
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
        err.lines().any(|l| smoe_tail(l, "smoe: claims ").is_some()),
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
/// vault, with the experts streamed from the GGUF in place (`SMOE=1`), and
/// with `--smoe`, the common argument that stands for `SMOE=1`.
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
    let cli = |smoe: Option<Source>, args: &[&str]| {
        let mut cmd = Command::new(tool(&bin, "llama-cli"));
        cmd.args(args);
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
            .env_remove("SMOE")
            .env_remove("SMOE_VAULT")
            .env("SMOE_RING_SLOTS", "3")
            .env("SMOE_CACHE_DIR", tmp.path().join("cache"))
            .stdin(std::process::Stdio::null());
        if let Some(source) = smoe {
            cmd.envs(source.env(&gguf, &vault));
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
    let stock = cli(None, &[]);
    assert!(
        stock.status.success(),
        "{}",
        String::from_utf8_lossy(&stock.stderr)
    );
    let want = reply(&stock);
    assert!(want.len() > PROMPT.len() + 4, "no reply: {want:?}");
    for source in [Source::Vault, Source::Model] {
        let smoe = cli(Some(source), &[]);
        let stderr = String::from_utf8_lossy(&smoe.stderr);
        assert!(smoe.status.success(), "{source:?}: {stderr}");
        assert_eq!(reply(&smoe), want, "{source:?}");
        assert!(
            stderr.contains(&source.named(&gguf, &vault)) && stderr.contains("smoe: claims "),
            "{source:?}: {stderr}"
        );
    }
    // `--smoe`, llama.cpp's common argument, is SMOE=1: the model streams
    // from its own file
    let flag = cli(None, &["--smoe"]);
    let stderr = String::from_utf8_lossy(&flag.stderr);
    assert!(flag.status.success(), "--smoe: {stderr}");
    assert_eq!(reply(&flag), want, "--smoe");
    assert!(
        stderr.contains(&Source::Model.named(&gguf, &vault)) && stderr.contains("smoe: claims "),
        "--smoe: {stderr}"
    );
}
