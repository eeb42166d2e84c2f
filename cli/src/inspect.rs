//! `smoe inspect`: a vault's header, shape, sizes and metadata, for people
//! or (with `--json`) for programs.

use std::path::Path;

use serde_json::{json, Value};
use smoe::vault::Vault;
use smoe_pack::layout::{BlobLayouts, LayoutItem};

use crate::output::{human_bytes, out, Failure};

/// Opens (and so fully validates) the vault at `path` and prints its summary.
pub fn run(path: &Path, as_json: bool) -> Result<(), Failure> {
    let vault = Vault::open(path)?;
    // Checked here so a malformed layout is an error, not a silent omission.
    let layouts = BlobLayouts::of(&vault)?;
    if as_json {
        let text = serde_json::to_string_pretty(&json_summary(&vault))
            .map_err(|e| Failure::Message(format!("cannot encode the summary as JSON: {e}")))?;
        out(&(text + "\n"))
    } else {
        out(&human_summary(&vault, layouts.as_ref()))
    }
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
    let mut line = |key: &str, value: String| {
        s.push_str(&format!("{key:<14}{value}\n"));
    };
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
        s.push_str(&format!("{:<14}{rest}\n", ""));
    }
    if let Some(layouts) = layouts {
        s.push_str(&layout_lines(layouts));
    }
    s
}

/// The blob layouts, one block per run of layers whose items agree in role,
/// dtype, shape, offset and size (the tensor names differ by layer):
///
/// ```text
/// layout        layers 1-93 (blob 25165824 bytes)
///                 gate      Q4_K   [1536, 4096]   3538944 bytes at 0
/// ```
fn layout_lines(layouts: &BlobLayouts) -> String {
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
    let mut groups: Vec<(Vec<u32>, &[LayoutItem])> = Vec::new();
    for (layer, items) in &layouts.layers {
        match groups.last_mut() {
            Some((layers, first)) if key(first) == key(items) => layers.push(*layer),
            _ => groups.push((vec![*layer], items)),
        }
    }
    for (i, (layers, items)) in groups.iter().enumerate() {
        let end = items.iter().map(LayoutItem::end).max().unwrap_or(0);
        let label = if i == 0 { "layout" } else { "" };
        let which = if layers.len() == 1 { "layer" } else { "layers" };
        s.push_str(&format!(
            "{label:<14}{which} {} (blob {end} bytes)\n",
            ranges(layers)
        ));
        for item in *items {
            let shape = item.shape_text();
            s.push_str(&format!(
                "{:<16}{:<13} {:<8} {:<16} {:>10} bytes at {}\n",
                "", item.role, item.dtype, shape, item.bytes, item.offset
            ));
        }
    }
    s
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
