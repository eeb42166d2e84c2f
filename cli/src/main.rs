//! `smoe`: the command-line tool for vaults.
//!
//! - `smoe pack SOURCE OUT_DIR [--force]`: a vault from a GGUF or
//!   safetensors model.
//! - `smoe inspect VAULT [--json]`: what a vault holds.
//! - `smoe verify VAULT`: reads every blob (direct I/O where the filesystem
//!   allows) and checks its checksum and zero padding.
//! - `smoe synth DIR ...`: writes a synthetic vault.
//! - `smoe budget VAULT [--json]`: how the ring would be sized on this
//!   machine (docs/c-api.md, "Ring sizing"), with every input, intermediate value and source.
//! - `smoe bench VAULT`: streams a vault (synthetic decode, trace replay or
//!   cold scan).
//! - `smoe demo`: writes a ~1 GB synthetic vault, reads it back, checks every
//!   byte and reports the throughput.
//! - `smoe completions SHELL`: a completion script for the shell.
//!
//! Wherever a command takes a VAULT it also takes a model, opened in place
//! (SPEC §6): a GGUF file (the first part of a split one), a safetensors
//! file, a model directory or its index. Nothing is ever written beside a
//! model; its expert bytes are read only through the library's one read
//! path for a model, `smoe::vault::InPlace::load`.
//!
//! Exit codes: 0 success, 1 an invalid vault, a bad blob, an I/O error, an
//! allocation that failed, or a flag value the vault cannot take (one line
//! on stderr, `smoe: <message>`), 2 a usage error: clap's, and a flag value
//! out of its range (also one `smoe: ` line, naming the flag, the value and
//! the range). Nothing the input holds makes it panic or abort.
//! This binary only drives the library and the packer (`smoe_pack`, the
//! workspace member `pack/`); the format rules live in `smoe::vault`. It is
//! a package of its own (`smoe-cli`) so that a library user never compiles
//! clap, indicatif or serde_json; what it needs beyond
//! the library's public API (ring sizing, the router, platform calls) comes
//! from `smoe::internals`, which carries no stability promise, hence the
//! exact version pin in `cli/Cargo.toml`.

mod baseline;
mod bench;
mod budget;
mod demo;
mod flags;
mod inspect;
mod interrupt;
mod output;
mod pack;
mod plot;
mod progress;
mod reader;
mod replay;
mod sim;
mod stream;
mod synth;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};

use crate::output::Failure;

/// Streams Mixture-of-Experts expert weights from SSD: vault tools.
#[derive(Debug, Parser)]
#[command(name = "smoe", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a vault's header, shape, sizes and metadata; or a model's
    /// kind, files, shape and per-layer slot layout, opened in place.
    Inspect {
        /// The vault (its directory or experts.smoe), or a model opened in
        /// place: a GGUF file (the first part of a split one), a safetensors
        /// file, a model directory or its model.safetensors.index.json.
        vault: PathBuf,
        /// Print one JSON object instead of the human summary.
        #[arg(long)]
        json: bool,
    },
    /// Read every blob and check its xxh3 and its zero padding; of a model
    /// (no checksums), read every expert through the library's read path
    /// and check each read is complete and each item inside its slot.
    Verify {
        /// The vault (its directory or experts.smoe), or a model opened in
        /// place: a GGUF file (the first part of a split one), a safetensors
        /// file, a model directory or its model.safetensors.index.json.
        vault: PathBuf,
    },
    /// Write a synthetic vault with deterministic payloads.
    Synth(synth::SynthArgs),
    /// Write a ~1 GB synthetic vault and stream synthetic tokens through it;
    /// report coverage, GB/s and the wait per token.
    Demo(demo::DemoArgs),
    /// Stream an existing vault or a model opened in place: a synthetic
    /// decode, a routing trace replayed (and compared with mmap), or a cold
    /// scan of every blob.
    Bench(bench::BenchArgs),
    /// Pack a GGUF or safetensors model into a vault: the experts into
    /// experts.smoe, everything else into the scout.
    Pack(pack::PackArgs),
    /// Show how the ring would be sized on this machine (docs/c-api.md,
    /// "Ring sizing", in smoe's source): every input, intermediate value and
    /// source.
    Budget(budget::BudgetArgs),
    /// Print a completion script for SHELL on stdout, e.g. `smoe completions
    /// bash > /etc/bash_completion.d/smoe`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let result = match cli.command {
        Command::Inspect { vault, json } => inspect::run(&vault, json),
        Command::Verify { vault } => verify::run(&vault),
        Command::Synth(args) => synth::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Budget(args) => budget::run(&args),
        Command::Pack(args) => pack::run(&args),
        Command::Completions { shell } => completions(shell),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::BrokenPipe) => ExitCode::SUCCESS,
        Err(Failure::Reported) => ExitCode::FAILURE,
        Err(Failure::Usage(message)) => {
            output::error_line(&message);
            ExitCode::from(2)
        }
        Err(Failure::Message(message)) => {
            output::error_line(&message);
            ExitCode::FAILURE
        }
    }
}

/// `smoe completions SHELL`: the script clap_complete writes from the same
/// definitions the parser uses, so it never goes stale.
fn completions(shell: clap_complete::Shell) -> Result<(), Failure> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "smoe", &mut script);
    output::out(&String::from_utf8_lossy(&script))
}

/// A command line clap refused. A bad flag value is one `smoe: ` line (what
/// clap says first: the flag, the value, the range) and exit 2; the rest
/// (help, version, a missing or unknown argument) is clap's own output.
fn usage_error(e: clap::Error) -> ExitCode {
    match e.kind() {
        ErrorKind::ValueValidation | ErrorKind::InvalidValue => {
            let rendered = e.to_string();
            let first = rendered.lines().next().unwrap_or_default();
            output::error_line(first.strip_prefix("error: ").unwrap_or(first));
            ExitCode::from(2)
        }
        _ => e.exit(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// The tool's modules, one per file (`bench/args.rs` is `bench::args`,
    /// `bench/mod.rs` is `bench`), with the modules each names in its code
    /// (`crate::x`, `super::x`, `self::x`; comments and unit tests left out).
    fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                let dir = path.file_name().unwrap().to_string_lossy().into_owned();
                for sub in std::fs::read_dir(&path).unwrap() {
                    let sub = sub.unwrap().path();
                    let stem = sub.file_stem().unwrap().to_string_lossy().into_owned();
                    let name = if stem == "mod" {
                        dir.clone()
                    } else {
                        format!("{dir}::{stem}")
                    };
                    files.push((name, sub));
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
                files.push((stem, path));
            }
        }
        let nodes: BTreeSet<String> = files.iter().map(|(n, _)| n.clone()).collect();
        let mut graph = BTreeMap::new();
        for (name, path) in &files {
            let code: String = std::fs::read_to_string(path)
                .unwrap()
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            // A file's unit tests (`use super::*`) are the file itself.
            let code = match code.find("#[cfg(test)]\nmod tests") {
                Some(at) => code[..at].to_owned(),
                None => code,
            };
            let parent = name.split("::").next().unwrap().to_owned();
            let children: Vec<String> = nodes
                .iter()
                .filter_map(|n| n.strip_prefix(&format!("{name}::")).map(str::to_owned))
                .collect();
            let mut uses = BTreeSet::new();
            let mut named = |prefix: &str, base: &str| {
                for (at, _) in code.match_indices(prefix) {
                    let rest = &code[at + prefix.len()..];
                    let seg: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    let full = if base.is_empty() {
                        seg.clone()
                    } else {
                        format!("{base}::{seg}")
                    };
                    if nodes.contains(&full) {
                        uses.insert(full);
                    } else if !base.is_empty() && nodes.contains(base) {
                        uses.insert(base.to_owned());
                    }
                }
            };
            named("crate::", "");
            if name.contains("::") {
                named("super::", &parent);
            }
            named("self::", name);
            for child in &children {
                if code.contains(&format!("{child}::")) {
                    uses.insert(format!("{name}::{child}"));
                }
            }
            uses.remove(name);
            graph.insert(name.clone(), uses);
        }
        graph
    }

    /// Issue 24: no module imports one that imports it back, directly or
    /// around a longer cycle.
    #[test]
    fn no_module_imports_one_that_imports_it_back() {
        let graph = module_graph();
        assert!(graph["bench"].contains("bench::trace"), "{graph:?}");
        assert!(graph["bench::trace"].contains("replay"), "{graph:?}");
        fn visit(
            node: &str,
            graph: &BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) {
            if let Some(at) = path.iter().position(|n| n == node) {
                panic!("import cycle: {} -> {node}", path[at..].join(" -> "));
            }
            if done.contains(node) {
                return;
            }
            path.push(node.to_owned());
            for next in graph.get(node).into_iter().flatten() {
                visit(next, graph, path, done);
            }
            path.pop();
            done.insert(node.to_owned());
        }
        let mut done = BTreeSet::new();
        for node in graph.keys() {
            visit(node, &graph, &mut Vec::new(), &mut done);
        }
    }
}
