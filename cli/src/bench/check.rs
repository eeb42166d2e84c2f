//! `smoe bench`'s checks of its command line: flags the rest of the line
//! leaves without effect (before anything is opened), then the flags whose
//! range depends on the vault, the outputs that would replace the run's own
//! files, and the top-k the run uses (against the vault, then the trace).

use std::path::Path;

use smoe::internals::files::same_file;
use smoe::internals::trace::TraceTokens;
use smoe::vault::{Vault, FREQ_FILE};

use super::args::{BenchArgs, Mode};
use super::report::{TopK, TopKFrom};
use crate::output::{warning_line, Failure};
use crate::replay::WorkingSet;

/// The top-k when neither `--top-k` nor the vault's metadata gives one
/// (Qwen3's), lowered to the vault's n_experts when fewer.
const DEFAULT_TOP_K: u32 = 8;

/// Refuses flags that the rest of the command line leaves without effect
/// (a usage error, exit 2), before anything is opened.
pub fn check_flags(args: &BenchArgs) -> Result<(), Failure> {
    let usage = |message: &str| Err(Failure::Usage(message.to_owned()));
    if args.trace.is_none() {
        for (set, flag) in [
            (args.sweep, "--sweep"),
            (args.baseline.is_some(), "--baseline"),
            (args.mem_cap.is_some(), "--mem-cap"),
            (args.plot.is_some(), "--plot"),
            (args.max_tokens.is_some(), "--max-tokens"),
            (args.side.is_some(), "--side"),
        ] {
            if set {
                return usage(&format!("{flag} needs --trace"));
            }
        }
    }
    if args.mode == Mode::Scan {
        for (set, flag) in [
            (args.trace.is_some(), "--trace"),
            (args.capture.is_some(), "--capture"),
        ] {
            if set {
                return usage(&format!(
                    "{flag} is for a decode: --mode scan reads every blob once and claims no token"
                ));
            }
        }
    }
    if args.sweep && args.capture.is_some() {
        return usage("--capture records the claims of a run: --sweep only simulates");
    }
    Ok(())
}

/// The vault metadata's `top_k`, when it holds a usable one. A `top_k` that
/// is not a number from 1 to `n_experts` is a warning, and ignored.
fn metadata_top_k(vault: &Vault) -> Option<u32> {
    let meta: serde_json::Value = serde_json::from_str(vault.meta()).ok()?;
    let value = meta.get("top_k")?;
    let n_experts = vault.n_experts();
    match value.as_u64() {
        Some(k) if (1..=u64::from(n_experts)).contains(&k) => Some(k as u32),
        _ => {
            warning_line(&format!(
                "{}: the metadata's top_k {value} is not a number from 1 to the vault's n_experts {n_experts}; ignored",
                vault.path().display()
            ));
            None
        }
    }
}

/// Checks `--top-k` against the vault (its experts per layer) and returns
/// the top-k to use: `--top-k`, else the metadata's, else the default. Out
/// of range is exit 1 with one line naming the flag, the value and the
/// range. `--ring-slots` is checked once the top-k is final
/// ([`check_ring_slots`]).
pub fn check_against(args: &BenchArgs, vault: &Vault) -> Result<TopK, Failure> {
    let file = vault.path().display();
    let n_experts = vault.n_experts();
    let top_k = match args.top_k {
        Some(k) if k <= n_experts => TopK {
            value: k,
            from: TopKFrom::Flag,
        },
        Some(k) => {
            return Err(Failure::Message(format!(
                "--top-k {k} is out of range for {file}: expected 1..={n_experts} (the vault's n_experts)"
            )))
        }
        None => match metadata_top_k(vault) {
            Some(k) => TopK {
                value: k,
                from: TopKFrom::Metadata,
            },
            None => TopK {
                value: DEFAULT_TOP_K.min(n_experts),
                from: TopKFrom::Default,
            },
        },
    };
    Ok(top_k)
}

/// Refuses a `--ring-slots` the vault cannot fill, or (decode) smaller
/// than `top_k`, the top-k the run uses: after [`top_k_for_trace`] has
/// lowered it to a trace's ranks, so a ring that holds the trace's top-k
/// is not refused for the metadata's larger one.
pub fn check_ring_slots(args: &BenchArgs, vault: &Vault, top_k: TopK) -> Result<(), Failure> {
    let file = vault.path().display();
    let n_entries = vault.entries().len() as u32;
    let least = match args.mode {
        Mode::Decode => top_k.value.min(n_entries),
        Mode::Scan => 1,
    };
    if args.ring_slots != 0 && !(least..=n_entries).contains(&args.ring_slots) {
        let why = match args.mode {
            Mode::Decode => format!("at least the top-k {}, ", top_k.value),
            Mode::Scan => String::new(),
        };
        return Err(Failure::Message(format!(
            "--ring-slots {} is out of range for {file}: expected 0 (auto) or {least}..={n_entries} ({why}at most the vault's {n_entries} entries)",
            args.ring_slots
        )));
    }
    Ok(())
}

/// Refuses an output that is one of the run's own files, before anything
/// is read or written (a usage error naming both, exit 2): `--plot` that is
/// the vault file (a file of a model opened in place), the vault's
/// histogram (a model's, in its cache directory) or the `--trace` input, and
/// `--capture` that is one of these or the `--plot` file. "Is" is by
/// identity ([`same_file`]: device and inode, links followed), so `./t.csv`
/// and a symbolic or hard link to the trace are the trace; a file that
/// does not exist yet is told by its directory and name.
pub fn check_outputs(args: &BenchArgs, vault: &Vault) -> Result<(), Failure> {
    // A model's histogram is in its cache directory, never beside it; a
    // model's files are each the run's input.
    let histogram = vault.histogram_dir().ok().map(|(d, _)| d.join(FREQ_FILE));
    let data_files = vault.data_files();
    let mut own: Vec<(&str, &Path)> = match vault.model() {
        None => vec![("the vault file", vault.path())],
        Some(_) => data_files
            .iter()
            .map(|f| ("a file of the model", f.as_path()))
            .collect(),
    };
    if let Some(histogram) = &histogram {
        own.push(("the vault's histogram", histogram));
    }
    if let Some(trace) = &args.trace {
        own.push(("the --trace input", trace));
    }
    for (flag, what, output) in [
        ("--plot", "the --plot file", &args.plot),
        ("--capture", "the --capture file", &args.capture),
    ] {
        let Some(output) = output else { continue };
        if let Some((is, path)) = own.iter().find(|(_, path)| same_file(output, path)) {
            return Err(Failure::Usage(format!(
                "{flag} {}: is {is} {}; an output never replaces a file the run reads or \
                 writes, so nothing was run",
                output.display(),
                path.display()
            )));
        }
        own.push((what, output));
    }
    Ok(())
}

/// The top-k of a replay of `tokens`, read from `trace` at `top_k`: a row
/// may leave its last ranks empty (a capture does), so the ranks the trace
/// has are the most any replayed row names. A `--top-k` above them is a
/// usage error naming the trace, its ranks and the flag (exit 2); a top-k
/// from the metadata or the default is lowered to them. A trace of no rows
/// keeps the top-k.
pub fn top_k_for_trace(
    args: &BenchArgs,
    top_k: TopK,
    trace: &Path,
    tokens: &TraceTokens,
) -> Result<TopK, Failure> {
    // The rows were cut to `top_k` ranks: fewer means the trace has fewer.
    let ranks = WorkingSet::of_trace(tokens).top_k;
    if ranks == 0 || ranks >= top_k.value {
        return Ok(top_k);
    }
    if top_k.from != TopKFrom::Flag {
        return Ok(TopK {
            value: ranks,
            from: TopKFrom::Trace,
        });
    }
    let rows = match args.max_tokens {
        Some(n) => format!("rows of its first {n} tokens"),
        None => "rows".to_owned(),
    };
    Err(Failure::Usage(format!(
        "--top-k {} is more than the {ranks} ranks of the trace {} (the most its {rows} \
         name): expected 1..={ranks}",
        top_k.value,
        trace.display()
    )))
}
