//! The Python package (`python/`, docs/python.md): builds it with maturin
//! into a virtual environment under `target/python-test/` and runs its
//! pytest suite (`python/tests/`), so the README's `cargo test --release`
//! runs the Python tests too.
//!
//! The environment (maturin, pytest and numpy at pinned versions, from
//! PyPI) is made once and kept between runs; it is made again when the
//! pins or the interpreter change. torch, transformers and safetensors
//! (for `Lease.torch` and `smoe.transformers`) are installed into it as a
//! second step, kept the same way: PyPI's torch for Linux x86_64 is the
//! CUDA build, whose NVIDIA wheels come along (about 5.5 GB installed, a
//! minute or two to fetch, one package at a time so that the disk needs
//! little more than that); the tests run it on the CPU. The package is built in a target
//! directory of its own (`target/python-test/cargo`): a cargo inside this
//! `cargo test` must not wait for the outer one's lock on `target/`, nor
//! rebuild the outer one's artifacts with other flags. Built with the
//! `test-hooks` feature, which only adds the gated reader the waiting tests
//! need (`smoe._native._testing`).
//!
//! Without Python ≥ 3.11, its `venv` module (Debian: python3-venv) or PyPI,
//! the test says why and returns, except under CI, where it fails
//! (`smoe_test_support::skip_or_fail`). When only the second step fails
//! (torch cannot be installed), the other tests run and pytest skips the
//! torch and transformers ones, saying why; under CI it fails instead.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use smoe_test_support::native::manifest_dir;
use smoe_test_support::skip_or_fail;

/// What the environment holds, pinned: the build backend and the test
/// runner, and numpy for the views under test.
const REQUIREMENTS: &[&str] = &["maturin==1.16.0", "pytest==9.2.0", "numpy==2.4.6"];

/// The second step, pinned: torch for `Lease.torch` (≥ 2.9 reads DLPack
/// 1.0), transformers (≥ 5: the experts interface) for `smoe.transformers`,
/// and safetensors, which the tests read the checkpoints with. The versions
/// scripts/make-model-fixtures.sh wrote the model fixtures with.
const TORCH_REQUIREMENTS: &[&str] = &[
    "torch==2.15.0",
    "transformers==5.24.0",
    "safetensors==0.8.0",
];

/// The interpreter: `SMOE_PYTHON`, or `python3` on the PATH.
fn interpreter() -> String {
    std::env::var("SMOE_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_owned())
}

/// Runs `command`; its output, or why it could not start.
fn output(command: &mut Command) -> Result<Output, String> {
    command
        .output()
        .map_err(|e| format!("cannot run {command:?}: {e}"))
}

/// The output's last lines, for a message.
fn tail(output: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The interpreter's version line, when it is 3.11 or newer.
fn python_version(python: &str) -> Result<String, String> {
    let out = output(Command::new(python).args([
        "-c",
        "import sys; print(sys.version.split()[0]); sys.exit(sys.version_info < (3, 11))",
    ]))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() {
        Ok(version)
    } else {
        Err(format!(
            "{python} is Python {version}; the package needs 3.11 or newer"
        ))
    }
}

/// The virtual environment at `venv`, made (or made again) unless it holds
/// [`REQUIREMENTS`] for `version` already. Its `bin` directory.
fn environment(python: &str, version: &str, venv: &Path) -> Result<PathBuf, String> {
    let bin = venv.join("bin");
    let stamp = venv.join("smoe-requirements.txt");
    let wanted = format!("python {version}\n{}\n", REQUIREMENTS.join("\n"));
    if bin.join("python").exists() && fs::read_to_string(&stamp).ok().as_deref() == Some(&wanted) {
        return Ok(bin);
    }
    if venv.exists() {
        fs::remove_dir_all(venv).map_err(|e| format!("cannot remove {}: {e}", venv.display()))?;
    }
    let made = output(Command::new(python).args(["-m", "venv"]).arg(venv))?;
    if !made.status.success() {
        return Err(format!(
            "{python} -m venv failed (Debian: install python3-venv; .ci/run does):\n{}",
            tail(&made)
        ));
    }
    let installed = output(
        Command::new(bin.join("pip"))
            .args(PIP_FETCH)
            .args(REQUIREMENTS),
    )?;
    if !installed.status.success() {
        return Err(format!(
            "cannot install {} from PyPI (no network?):\n{}",
            REQUIREMENTS.join(" "),
            tail(&installed)
        ));
    }
    fs::write(&stamp, wanted).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    Ok(bin)
}

/// The options every `pip install` from PyPI takes: a retry for a slow
/// mirror, and no cache, which would hold a second copy of every wheel.
const PIP_FETCH: &[&str] = &[
    "install",
    "--quiet",
    "--no-cache-dir",
    "--retries",
    "2",
    "--timeout",
    "60",
];

/// What the disk holding `dir` has free, as `df -h` prints it, for a message.
fn free_space(dir: &Path) -> String {
    match output(Command::new("df").arg("-h").arg(dir)) {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .to_owned(),
        Err(why) => why,
    }
}

/// The packages (name, version) a `pip install --dry-run --report` at
/// `report` would install.
fn reported_packages(report: &Path) -> Result<Vec<(String, String)>, String> {
    let text =
        fs::read_to_string(report).map_err(|e| format!("cannot read {}: {e}", report.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not JSON: {e}", report.display()))?;
    let install = json["install"]
        .as_array()
        .ok_or_else(|| format!("{} has no \"install\" list", report.display()))?;
    install
        .iter()
        .map(|item| {
            let metadata = &item["metadata"];
            match (metadata["name"].as_str(), metadata["version"].as_str()) {
                (Some(name), Some(version)) => Ok((name.to_owned(), version.to_owned())),
                _ => Err(format!(
                    "{} lists a package without a name or version: {item}",
                    report.display()
                )),
            }
        })
        .collect()
}

/// Installs [`TORCH_REQUIREMENTS`] into the environment at `venv`, unless
/// it holds them already; why not, when it cannot.
///
/// One package at a time, so that the disk holds at most one downloaded
/// wheel beside what is installed: one `pip install` of the lot downloads
/// every wheel (about 3 GB) before it unpacks any (5.5 GB), and a CI
/// machine ran out of disk that way. pip resolves the set first from the
/// metadata PyPI serves beside each wheel, downloading none.
fn torch_environment(bin: &Path, venv: &Path) -> Result<(), String> {
    let stamp = venv.join("smoe-torch-requirements.txt");
    let wanted = format!("{}\n", TORCH_REQUIREMENTS.join("\n"));
    if fs::read_to_string(&stamp).ok().as_deref() == Some(&wanted) {
        return Ok(());
    }
    let pip = bin.join("pip");
    let failed = |what: &str, out: &Output| {
        format!(
            "cannot install {} from PyPI (no network, no wheel for this platform, or no disk): \
             {what} failed; the disk: {}\n{}",
            TORCH_REQUIREMENTS.join(" "),
            free_space(venv),
            tail(out)
        )
    };
    let report = venv.join("smoe-torch-report.json");
    let resolved = output(
        Command::new(&pip)
            .args(PIP_FETCH)
            .arg("--dry-run")
            .arg("--report")
            .arg(&report)
            .args(TORCH_REQUIREMENTS),
    )?;
    if !resolved.status.success() {
        return Err(failed("resolving them", &resolved));
    }
    for (name, version) in reported_packages(&report)? {
        let installed = output(
            Command::new(&pip)
                .args(PIP_FETCH)
                .arg("--no-deps")
                .arg(format!("{name}=={version}")),
        )?;
        if !installed.status.success() {
            return Err(failed(&format!("installing {name} {version}"), &installed));
        }
    }
    // The pins once more, from nothing but what is installed (pip names
    // what is missing), and every installed package's requirements met.
    let checked = output(
        Command::new(&pip)
            .args(["install", "--quiet", "--no-index"])
            .args(TORCH_REQUIREMENTS),
    )?;
    if !checked.status.success() {
        return Err(failed("checking them", &checked));
    }
    let consistent = output(Command::new(&pip).arg("check"))?;
    if !consistent.status.success() {
        return Err(failed("pip check", &consistent));
    }
    fs::write(&stamp, wanted).map_err(|e| format!("cannot write {}: {e}", stamp.display()))
}

/// `PATH` with `bin` first: maturin's build backend runs `maturin` from it.
fn path_with(bin: &Path) -> std::ffi::OsString {
    let mut paths = vec![bin.to_path_buf()];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(paths).expect("PATH entries hold no separator")
}

#[test]
fn the_python_package_passes_its_tests() {
    let root = manifest_dir();
    let python = interpreter();
    let version = match python_version(&python) {
        Ok(version) => version,
        Err(why) => {
            skip_or_fail(&format!("the Python package's tests: {why}"));
            return;
        }
    };
    let work = root.join("target/python-test");
    let venv = work.join("venv");
    let bin = match environment(&python, &version, &venv) {
        Ok(bin) => bin,
        Err(why) => {
            skip_or_fail(&format!("the Python package's tests: {why}"));
            return;
        }
    };
    // Without torch the other tests still run; pytest skips the torch and
    // transformers ones with this reason (python/tests/conftest.py).
    let torch_missing = match torch_environment(&bin, &venv) {
        Ok(()) => None,
        Err(why) => {
            skip_or_fail(&format!("the Python package's torch tests: {why}"));
            Some(why)
        }
    };
    // The package as a user installs it (`pip install ./python`), from the
    // environment's maturin and nothing else from PyPI.
    let install = output(
        Command::new(bin.join("pip"))
            .current_dir(root)
            .args([
                "install",
                "--quiet",
                "--no-index",
                "--no-build-isolation",
                "--no-deps",
                "--force-reinstall",
                "./python",
            ])
            .env("PATH", path_with(&bin))
            .env("MATURIN_PEP517_ARGS", "--features test-hooks")
            .env("CARGO_TARGET_DIR", work.join("cargo")),
    )
    .unwrap();
    assert!(
        install.status.success(),
        "pip install ./python failed:\n{}",
        tail(&install)
    );
    let mut command = Command::new(bin.join("python"));
    command
        .current_dir(root)
        .args([
            "-m",
            "pytest",
            "python/tests",
            "-q",
            "-rfEsp",
            "-p",
            "no:cacheprovider",
        ])
        .env("PATH", path_with(&bin))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // No Hugging Face hub: every model is built by the tests.
        .env("HF_HUB_OFFLINE", "1");
    if let Some(why) = &torch_missing {
        command.env("SMOE_TEST_TORCH_MISSING", why.lines().next().unwrap_or(why));
    }
    let pytest = output(&mut command).unwrap();
    let report = tail(&pytest);
    assert!(
        pytest.status.success(),
        "pytest python/tests failed:\n{report}"
    );
    // The logits comparisons and the counts, in the test's output
    // (`--nocapture` shows them).
    let stdout = String::from_utf8_lossy(&pytest.stdout);
    for line in stdout.lines().filter(|l| l.contains("::test_logits")) {
        println!("{line}");
    }
    println!("{}", report.lines().last().unwrap_or(""));
}
