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
//! - `smoe bench VAULT`: streams a vault (synthetic decode or cold scan).
//! - `smoe demo`: writes a ~1 GB synthetic vault, reads it back, checks every
//!   byte and reports the throughput.
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
mod output;
mod pack;
mod plot;
mod progress;
mod reader;
mod sim;
mod stream;
mod synth;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};

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
    /// Print a vault's header, shape, sizes and metadata.
    Inspect {
        /// The vault directory or its experts.smoe.
        vault: PathBuf,
        /// Print one JSON object instead of the human summary.
        #[arg(long)]
        json: bool,
    },
    /// Read every blob and check its xxh3 and its zero padding.
    Verify {
        /// The vault directory or its experts.smoe.
        vault: PathBuf,
    },
    /// Write a synthetic vault with deterministic payloads.
    Synth(synth::SynthArgs),
    /// Write a ~1 GB synthetic vault and stream synthetic tokens through it;
    /// report coverage, GB/s and the wait per token.
    Demo(demo::DemoArgs),
    /// Stream an existing vault: a synthetic decode, or a cold scan of every blob.
    Bench(bench::BenchArgs),
    /// Pack a GGUF or safetensors model into a vault: the experts into
    /// experts.smoe, everything else into the scout.
    Pack(pack::PackArgs),
    /// Show how the ring would be sized on this machine (docs/c-api.md, "Ring sizing"): every
    /// input, intermediate value and source.
    Budget(budget::BudgetArgs),
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
