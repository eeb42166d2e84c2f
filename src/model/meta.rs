//! The metadata of SPEC §1.2, written once for both readers of a model: the
//! packer's vault (`"format": "smoe-vault"`, with its scout) and a model
//! opened in place (`"format": "smoe-model"`, whose item offsets are
//! positions in the claimed bytes). A JSON writer of its own, small and
//! exact, so that a GGUF-only build (without the `safetensors` feature)
//! writes it too; strings are escaped as serde_json escapes them, so the
//! text is the same either way.

use std::fmt::Write as _;

use super::{LayoutItem, Model};

/// What a metadata text says besides the model's own facts.
#[derive(Clone, Copy, Debug)]
pub struct MetaWriter<'a> {
    /// `"smoe-vault"` or `"smoe-model"`.
    pub format: &'a str,
    /// `"<program> <version>"`.
    pub writer: &'a str,
    /// The vault's scout file, if it has one.
    pub scout: Option<&'a str>,
    /// The source's config files the vault carries beside its scout
    /// (`configs`; omitted when empty).
    pub configs: &'a [&'a str],
}

/// The SPEC §1.2 metadata of `model` whose layers have `layouts` (ascending
/// by layer), as compact JSON: `format`, `writer`, `source`, `arch` and
/// `top_k` where the model says, `scout` where there is one, `configs`
/// where the vault carries any, and `layer_blob_layouts`.
pub fn metadata_json(model: &Model, layouts: &[(u32, &[LayoutItem])], w: MetaWriter<'_>) -> String {
    let mut out = String::with_capacity(256 + layouts.len() * 512);
    out.push('{');
    key(&mut out, "format");
    string(&mut out, w.format);
    out.push(',');
    key(&mut out, "writer");
    string(&mut out, w.writer);
    out.push(',');
    key(&mut out, "source");
    out.push('{');
    key(&mut out, "kind");
    string(&mut out, model.kind.name());
    out.push(',');
    key(&mut out, "files");
    let names: Vec<String> = model
        .files
        .iter()
        .map(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .collect();
    strings(&mut out, names.iter().map(String::as_str));
    out.push('}');
    if let Some(arch) = &model.arch {
        out.push(',');
        key(&mut out, "arch");
        string(&mut out, arch);
    }
    if let Some(k) = model.top_k {
        out.push(',');
        key(&mut out, "top_k");
        let _ = write!(out, "{k}");
    }
    if let Some(scout) = w.scout {
        out.push(',');
        key(&mut out, "scout");
        string(&mut out, scout);
    }
    if !w.configs.is_empty() {
        out.push(',');
        key(&mut out, "configs");
        strings(&mut out, w.configs.iter().copied());
    }
    out.push(',');
    key(&mut out, "layer_blob_layouts");
    layouts_json(&mut out, layouts);
    out.push('}');
    out
}

/// Appends a JSON array of `items`, each a string.
fn strings<'s>(out: &mut String, items: impl Iterator<Item = &'s str>) {
    out.push('[');
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        string(out, item);
    }
    out.push(']');
}

/// Appends the value of `layer_blob_layouts`: `{"<layer>": [item, ...]}`.
pub fn layouts_json(out: &mut String, layouts: &[(u32, &[LayoutItem])]) {
    out.push('{');
    for (n, (layer, items)) in layouts.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        key(out, &layer.to_string());
        out.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('{');
            key(out, "role");
            string(out, &item.role);
            out.push(',');
            key(out, "tensor");
            string(out, &item.tensor);
            out.push(',');
            key(out, "dtype");
            string(out, &item.dtype);
            out.push(',');
            key(out, "shape");
            out.push('[');
            for (d, dim) in item.shape.iter().enumerate() {
                if d > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{dim}");
            }
            out.push_str("],");
            key(out, "offset");
            let _ = write!(out, "{},", item.offset);
            key(out, "bytes");
            let _ = write!(out, "{}", item.bytes);
            out.push('}');
        }
        out.push(']');
    }
    out.push('}');
}

fn key(out: &mut String, k: &str) {
    string(out, k);
    out.push(':');
}

/// A JSON string literal, escaped as serde_json escapes: `"` and `\`,
/// the short forms of backspace, form feed, newline, carriage return and
/// tab, `\u00XX` for the other control characters; everything else as is.
fn string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every string serde_json accepts back as the same string, and the
    /// same text serde_json writes.
    #[cfg(feature = "safetensors")]
    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        for s in [
            "plain",
            "quote \" and \\ backslash",
            "controls \u{0}\u{1}\u{8}\u{b}\u{c}\n\r\t\u{1f}\u{7f}",
            "unicode é ✓ \u{2028} 🦀",
        ] {
            let mut ours = String::new();
            string(&mut ours, s);
            assert_eq!(ours, serde_json::to_string(s).unwrap());
            let back: String = serde_json::from_str(&ours).unwrap();
            assert_eq!(back, s);
        }
    }

    #[test]
    fn layouts_are_written_in_order() {
        let item = LayoutItem {
            role: "gate".into(),
            tensor: "blk.1.ffn_gate_exps.weight".into(),
            dtype: "Q8_0".into(),
            shape: vec![32, 64],
            offset: 992,
            bytes: 2176,
        };
        let mut out = String::new();
        layouts_json(&mut out, &[(1, std::slice::from_ref(&item))]);
        assert_eq!(
            out,
            r#"{"1":[{"role":"gate","tensor":"blk.1.ffn_gate_exps.weight","dtype":"Q8_0","shape":[32,64],"offset":992,"bytes":2176}]}"#
        );
    }
}
