//! `smoe pack SOURCE OUT_DIR [--force]`: a vault from a GGUF or safetensors
//! model, with a progress bar and a summary. The packing is `smoe_pack::pack`;
//! this file parses, shows progress, handles Ctrl-C and prints.

use std::path::PathBuf;

use clap::Args;
use smoe::internals::budget::{plan_for, BudgetConfig};
use smoe::vault::Vault;
use smoe_pack::{pack, PackOptions, PackSummary};

use crate::interrupt;
use crate::output::{human_bytes, out, Failure};
use crate::progress::bytes_bar;

/// Arguments of `smoe pack`.
#[derive(Debug, Args)]
pub struct PackArgs {
    /// The model: a .gguf file (the first part of a split model), a
    /// .safetensors file, a model directory, or its
    /// model.safetensors.index.json.
    pub source: PathBuf,
    /// The vault directory to create.
    pub out_dir: PathBuf,
    /// Replace OUT_DIR if it is empty or holds a valid vault and nothing
    /// but a vault's files (experts.smoe, scout.*, expert_freq.bin).
    #[arg(long)]
    pub force: bool,
}

/// Runs `smoe pack`.
pub fn run(args: &PackArgs) -> Result<(), Failure> {
    // Ctrl-C and `kill` stop the pack cleanly: the packer sees the flag,
    // removes its temporary directory and creates no OUT_DIR.
    interrupt::catch();
    let bar = bytes_bar(0, "pack");
    let summary = pack(
        &args.source,
        &args.out_dir,
        &PackOptions {
            force: args.force,
            cancel: Some(interrupt::flag()),
        },
        &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        },
    );
    bar.finish_and_clear();
    // A signal after the last check lets the pack finish: then the vault is
    // there, and saying otherwise would be wrong.
    let summary = match summary {
        Err(_) if interrupt::requested() => {
            return Err(Failure::Message(format!(
                "interrupted; {} was not created",
                args.out_dir.display()
            )))
        }
        other => other?,
    };
    out(&describe(&summary))
}

fn describe(s: &PackSummary) -> String {
    let mut text = String::new();
    let push = |text: &mut String, line: String| {
        text.push_str(&line);
        text.push('\n');
    };
    push(
        &mut text,
        format!(
            "packed {} ({}{}) into {}",
            file_list(&s.files),
            s.kind.name(),
            s.arch
                .as_deref()
                .map(|a| format!(", {a}"))
                .unwrap_or_default(),
            s.out_dir.display()
        ),
    );
    let layers_with_experts = s.layouts.layers.len();
    push(
        &mut text,
        format!(
            "layers: {} ({layers_with_experts} with experts), experts per layer: {}{}, blobs: {}",
            s.n_layers,
            s.n_experts,
            s.top_k.map(|k| format!(" (top-{k})")).unwrap_or_default(),
            s.n_entries
        ),
    );
    push(
        &mut text,
        format!(
            "blob size: {} to {}; expert bytes: {}",
            human_bytes(s.blob_bytes.0),
            human_bytes(s.blob_bytes.1),
            human_bytes(s.expert_bytes)
        ),
    );
    for (role, dtypes) in &s.dtypes {
        push(&mut text, format!("  {role:<12} {}", dtypes.join(", ")));
    }
    push(
        &mut text,
        format!(
            "scout: {} ({}), vault id {}",
            s.scout.0,
            human_bytes(s.scout.1),
            s.vault_id
        ),
    );
    match Vault::open(&s.out_dir)
        .and_then(|v| plan_for(&v, &BudgetConfig::default()).map(|p| (v, p)))
    {
        Ok((_, plan)) => push(
            &mut text,
            format!(
                "ring on this machine (smoe budget): {} slots × {} = {}",
                plan.slots,
                human_bytes(plan.slot_bytes),
                human_bytes(u64::from(plan.slots) * plan.slot_bytes)
            ),
        ),
        Err(e) => push(
            &mut text,
            format!("ring on this machine: cannot plan ({e})"),
        ),
    }
    text
}

/// The source files, shortened for a split or sharded model: "11 files,
/// model-00001-of-00011.safetensors … model-00011-of-00011.safetensors".
fn file_list(files: &[PathBuf]) -> String {
    let names: Vec<String> = files
        .iter()
        .map(|f| {
            f.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .collect();
    match names.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [first, .., last] => format!("{} files, {first} … {last}", names.len()),
    }
}
