//! `smoe inspect`: a vault's header, shape, sizes and metadata, for people
//! or (with `--json`) for programs; for a model opened in place (SPEC §6),
//! its kind and files, its shape, and each layer's slot: the items at their
//! slot offsets, the slot's bytes and the reads an expert takes.

use std::path::Path;

use serde_json::{json, Value};
use smoe::internals::printable::{escape, escape_json_text};
use smoe::vault::{InPlace, Vault, FREQ_FILE};
use smoe_pack::layout::{BlobLayouts, LayoutItem};

use crate::output::{human_bytes, out, Failure};

/// Opens (and so fully validates) the vault at `path` and prints its summary.
pub fn run(path: &Path, as_json: bool) -> Result<(), Failure> {
    let vault = Vault::open(path)?;
    // Checked here so a malformed layout is an error, not a silent omission.
    let layouts = BlobLayouts::of(&vault)?;
    if as_json {
        let summary = match vault.model() {
            Some(model) => model_json(&vault, model, layouts.as_ref()),
            None => json_summary(&vault),
        };
        let text = serde_json::to_string_pretty(&summary)
            .map_err(|e| Failure::Message(format!("cannot encode the summary as JSON: {e}")))?;
        // serde_json leaves DEL and the C1 controls of a name raw.
        out(&(escape_json_text(&text).into_owned() + "\n"))
    } else {
        match vault.model() {
            Some(model) => out(&model_summary(&vault, model, layouts.as_ref())),
            None => out(&human_summary(&vault, layouts.as_ref())),
        }
    }
}

/// "GGUF" or "safetensors".
fn kind_name(model: &InPlace) -> &'static str {
    match model.kind().name() {
        "gguf" => "GGUF",
        _ => "safetensors",
    }
}

/// Where the library keeps a model's histogram (never beside the model),
/// or why there is none (no cache directory).
fn histogram_path(vault: &Vault) -> Result<std::path::PathBuf, String> {
    vault.histogram_dir().map(|(d, _)| d.join(FREQ_FILE))
}

/// One layer of a model: its slot bytes, the bytes a claim spans and the
/// reads an expert takes, from its first expert (every expert of a layer
/// has the same layout and the same windows, SPEC §6).
struct LayerSlot {
    slot_bytes: u64,
    data_bytes: u64,
    reads: usize,
}

fn layer_slot(vault: &Vault, model: &InPlace, layer: u32) -> Option<LayerSlot> {
    let e = vault.entries().iter().find(|e| e.layer == layer)?;
    Some(LayerSlot {
        slot_bytes: e.padded_size,
        data_bytes: e.size,
        reads: model.reads_per_expert(layer),
    })
}

/// A model's `--json`: its own keys (a model has no vault header), see
/// docs/cli.md.
fn model_json(vault: &Vault, model: &InPlace, layouts: Option<&BlobLayouts>) -> Value {
    let files: Vec<Value> = model
        .files()
        .iter()
        .map(|f| json!({"path": f.path.display().to_string(), "bytes": f.len}))
        .collect();
    let layers: Vec<Value> = layouts
        .map(|l| l.layers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|(layer, items)| {
            let slot = layer_slot(vault, model, *layer);
            json!({
                "layer": layer,
                "slot_bytes": slot.as_ref().map(|s| s.slot_bytes),
                "data_bytes": slot.as_ref().map(|s| s.data_bytes),
                "reads_per_expert": model.reads_per_expert(*layer),
                "items": items.iter().map(|i| json!({
                    "role": i.role,
                    "tensor": i.tensor,
                    "dtype": i.dtype,
                    "shape": i.shape,
                    "offset": i.offset,
                    "bytes": i.bytes,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let (mut reads, mut moves) = (Vec::new(), Vec::new());
    let entries: Vec<Value> = vault
        .entries()
        .iter()
        .map(|e| {
            reads.clear();
            moves.clear();
            model.reads(e.layer, e.expert, &mut reads, &mut moves);
            json!({
                "layer": e.layer,
                "expert": e.expert,
                "offset": e.offset,
                "size": e.size,
                "padded_size": e.padded_size,
                "reads": reads.iter().map(|r| json!({
                    "file": r.file,
                    "offset": r.offset,
                    "len": r.len,
                    "slot": r.slot,
                })).collect::<Vec<_>>(),
                "moved_bytes": moves.iter().map(|m| m.len).sum::<u64>(),
            })
        })
        .collect();
    let h = vault.header();
    json!({
        "model": {
            "kind": model.kind().name(),
            "files": files,
            "dense_bytes": model.dense_bytes(),
            "histogram": histogram_path(vault).ok().map(|p| p.display().to_string()),
            "layers": layers,
        },
        "n_layers": h.n_layers,
        "n_experts": h.n_experts,
        "n_entries": h.n_entries,
        "vault_id": h.vault_id_hex(),
        "meta": meta_value(vault),
        "entries": entries,
    })
}

/// A model's human summary: what it is, where its bytes are, its shape and
/// each layer's slot.
fn model_summary(vault: &Vault, model: &InPlace, layouts: Option<&BlobLayouts>) -> String {
    let h = vault.header();
    let mut layers_with_experts: Vec<u32> = vault.entries().iter().map(|e| e.layer).collect();
    layers_with_experts.dedup();
    let files = model.files();
    let mut s = String::new();
    let mut line = |key: &str, value: String| push_line(&mut s, &format!("{key:<14}{value}"));
    line("path", vault.path().display().to_string());
    line(
        "kind",
        format!(
            "{} model, opened in place (read-only: no vault, no copy, nothing written beside it)",
            kind_name(model)
        ),
    );
    line(
        "files",
        format!(
            "{} file{}, {} bytes ({})",
            files.len(),
            if files.len() == 1 { "" } else { "s" },
            h.file_bytes,
            human_bytes(h.file_bytes)
        ),
    );
    for f in files {
        line("", format!("  {}  {} bytes", f.path.display(), f.len));
    }
    line(
        "vault_id",
        format!(
            "{} (from the model's headers and file sizes)",
            h.vault_id_hex()
        ),
    );
    line(
        "histogram",
        histogram_path(vault).map_or_else(
            |why| format!("none ({why}: set SMOE_CACHE_DIR to an absolute path)"),
            |p| p.display().to_string(),
        ),
    );
    line(
        "shape",
        format!(
            "{} layers × {} experts ({} expert ids)",
            h.n_layers,
            h.n_experts,
            h.expert_ids()
        ),
    );
    line(
        "experts",
        format!(
            "{}; {} of {} layers have experts ({})",
            h.n_entries,
            layers_with_experts.len(),
            h.n_layers,
            ranges(&layers_with_experts)
        ),
    );
    let items: u64 = layouts.map_or(0, |l| {
        vault
            .entries()
            .iter()
            .filter_map(|e| l.layer(e.layer))
            .flat_map(|items| items.iter().map(|i| i.bytes))
            .sum()
    });
    line(
        "expert bytes",
        format!("{items} bytes ({}) of items", human_bytes(items)),
    );
    let dense = model.dense_bytes();
    line(
        "dense",
        format!(
            "{dense} bytes ({}): the non-expert tensors",
            human_bytes(dense)
        ),
    );
    let largest = vault.max_padded_size();
    line(
        "largest slot",
        format!("{largest} bytes ({})", human_bytes(largest)),
    );
    line(
        "checksums",
        "none (a GGUF/safetensors model carries none; `smoe pack` writes checksummed blobs)"
            .to_owned(),
    );
    let meta = match meta_value(vault) {
        Value::Object(mut members) => {
            members.remove("layer_blob_layouts");
            serde_json::to_string_pretty(&Value::Object(members)).unwrap_or_default()
        }
        Value::Null => "none".to_owned(),
        Value::String(raw) => raw,
        value => serde_json::to_string_pretty(&value).unwrap_or_default(),
    };
    let mut meta_lines = meta.lines();
    line("metadata", meta_lines.next().unwrap_or_default().to_owned());
    for rest in meta_lines {
        push_line(&mut s, &format!("{:<14}{rest}", ""));
    }
    if let Some(layouts) = layouts {
        s.push_str(&layout_lines(layouts, "slot layout", &|layer| {
            layer_slot(vault, model, layer).map_or_else(String::new, |l| {
                format!(
                    "slot {} bytes, data {} bytes, {} read{} per expert",
                    l.slot_bytes,
                    l.data_bytes,
                    l.reads,
                    if l.reads == 1 { "" } else { "s" }
                )
            })
        }));
    }
    s
}

/// The metadata as JSON: the parsed object, null when the vault has none,
/// and (should a vault carry text that only looks like an object) the raw
/// text as a string rather than a failure.
fn meta_value(vault: &Vault) -> Value {
    match vault.meta() {
        "" => Value::Null,
        text => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned())),
    }
}

/// Exactly the keys the `--json` contract lists, no others.
fn json_summary(vault: &Vault) -> Value {
    let h = vault.header();
    let entries: Vec<Value> = vault
        .entries()
        .iter()
        .map(|e| {
            json!({
                "layer": e.layer,
                "expert": e.expert,
                "offset": e.offset,
                "size": e.size,
                "padded_size": e.padded_size,
                "xxh3": format!("{:016x}", e.xxh3),
            })
        })
        .collect();
    json!({
        "version": h.version,
        "alignment": h.alignment,
        "n_layers": h.n_layers,
        "n_experts": h.n_experts,
        "n_entries": h.n_entries,
        "flags": h.flags,
        "data_offset": h.data_offset,
        "file_bytes": h.file_bytes,
        "vault_id": h.vault_id_hex(),
        "meta": meta_value(vault),
        "entries": entries,
    })
}

fn human_summary(vault: &Vault, layouts: Option<&BlobLayouts>) -> String {
    let h = vault.header();
    let mut layers_with_experts: Vec<u32> = vault.entries().iter().map(|e| e.layer).collect();
    layers_with_experts.dedup();
    let payload = vault.total_payload_bytes();
    let largest = vault.max_padded_size();
    let meta = match meta_value(vault) {
        Value::Null => "none".to_owned(),
        // The layouts are printed below, grouped; the rest of the metadata
        // is shown as it is.
        Value::Object(mut members) if layouts.is_some() => {
            members.remove("layer_blob_layouts");
            serde_json::to_string_pretty(&Value::Object(members)).unwrap_or_default()
        }
        Value::String(raw) => raw,
        value => serde_json::to_string_pretty(&value).unwrap_or_else(|_| vault.meta().to_owned()),
    };
    let mut s = String::new();
    let mut line = |key: &str, value: String| push_line(&mut s, &format!("{key:<14}{value}"));
    line("path", vault.path().display().to_string());
    line("vault_id", h.vault_id_hex());
    line("version", h.version.to_string());
    line(
        "alignment",
        format!("{} ({})", h.alignment, human_bytes(h.alignment.into())),
    );
    line(
        "shape",
        format!(
            "{} layers × {} experts ({} expert ids)",
            h.n_layers,
            h.n_experts,
            h.expert_ids()
        ),
    );
    line(
        "entries",
        format!(
            "{} blobs; {} of {} layers have experts ({})",
            h.n_entries,
            layers_with_experts.len(),
            h.n_layers,
            ranges(&layers_with_experts)
        ),
    );
    line(
        "payload",
        format!("{payload} bytes ({})", human_bytes(payload)),
    );
    line(
        "file",
        format!("{} bytes ({})", h.file_bytes, human_bytes(h.file_bytes)),
    );
    line(
        "largest blob",
        format!("{largest} bytes padded ({})", human_bytes(largest)),
    );
    line(
        "checksums",
        if h.has_checksums() {
            "yes (xxh3 per blob)"
        } else {
            "no"
        }
        .to_owned(),
    );
    let mut meta_lines = meta.lines();
    line("metadata", meta_lines.next().unwrap_or_default().to_owned());
    for rest in meta_lines {
        push_line(&mut s, &format!("{:<14}{rest}", ""));
    }
    if let Some(layouts) = layouts {
        s.push_str(&layout_lines(layouts, "layout", &|_| String::new()));
    }
    s
}

/// The blob layouts, one block per run of layers whose items agree in role,
/// dtype, shape, offset and size (the tensor names differ by layer) and
/// whose `about` (a model's slot: its bytes and reads) agrees, under
/// `label`:
///
/// ```text
/// layout        layers 1-93 (blob 25165824 bytes)
///                 gate      Q4_K   [1536, 4096]   3538944 bytes at 0
/// ```
fn layout_lines(layouts: &BlobLayouts, label: &str, about: &dyn Fn(u32) -> String) -> String {
    let key = |items: &[LayoutItem]| -> Vec<(String, String, Vec<u64>, u64, u64)> {
        items
            .iter()
            .map(|i| {
                (
                    i.role.clone(),
                    i.dtype.clone(),
                    i.shape.clone(),
                    i.offset,
                    i.bytes,
                )
            })
            .collect()
    };
    let mut s = String::new();
    let mut groups: Vec<(Vec<u32>, &[LayoutItem], String)> = Vec::new();
    for (layer, items) in &layouts.layers {
        let text = about(*layer);
        match groups.last_mut() {
            Some((layers, first, t)) if key(first) == key(items) && *t == text => {
                layers.push(*layer)
            }
            _ => groups.push((vec![*layer], items, text)),
        }
    }
    for (i, (layers, items, text)) in groups.iter().enumerate() {
        let end = items.iter().map(LayoutItem::end).max().unwrap_or(0);
        let label = if i == 0 { label } else { "" };
        let which = if layers.len() == 1 { "layer" } else { "layers" };
        let what = if text.is_empty() {
            format!("blob {end} bytes")
        } else {
            text.clone()
        };
        push_line(
            &mut s,
            &format!("{label:<14}{which} {} ({what})", ranges(layers)),
        );
        for item in *items {
            let shape = item.shape_text();
            push_line(
                &mut s,
                &format!(
                    "{:<16}{:<13} {:<8} {:<16} {:>10} bytes at {}",
                    "", item.role, item.dtype, shape, item.bytes, item.offset
                ),
            );
        }
    }
    s
}

/// Appends `text` and a newline to `s`, every control character of it
/// escaped: a name from a model (a path, a role, the architecture) holding
/// ESC or a newline is shown as `\x1b` or `\x0a`, and cannot forge a
/// line of the summary.
fn push_line(s: &mut String, text: &str) {
    s.push_str(&escape(text));
    s.push('\n');
}

/// Sorted ids as compact ranges: "1-3, 5, 7-9".
fn ranges(ids: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::ranges;

    #[test]
    fn compact_ranges() {
        assert_eq!(ranges(&[]), "none");
        assert_eq!(ranges(&[4]), "4");
        assert_eq!(ranges(&[1, 2, 3, 5, 7, 8, 9]), "1-3, 5, 7-9");
    }
}
