//! What is inside each blob: the `layer_blob_layouts` metadata key the
//! packer writes (see `docs/format.md`, "Metadata"), and its reader. Every
//! expert of one layer has the same layout, so an engine maps an item to its
//! kernels once per layer and reads expert `e`'s slice at
//! `slot + item.offset`.
//!
//! The library (`smoe`) plans the items (`LayoutItem`, from the model's
//! headers) but never reads them back from a vault: a C host parses
//! `smoe_vault_metadata`, a Rust host or the tool calls
//! [`BlobLayouts::of`].

use smoe::internals::model::json::{self, Value};
use smoe::vault::Vault;
use smoe::{Error, Result};

/// The items every blob of a layer holds, as the library plans them from
/// the model (`smoe::internals::model`), and their alignment.
pub use smoe::internals::model::{LayoutItem, ITEM_ALIGNMENT};

/// The metadata's `format` of a model opened in place (SPEC §6), whose
/// item offsets are slot positions that need not be multiples of
/// [`ITEM_ALIGNMENT`].
pub const IN_PLACE_FORMAT: &str = "smoe-model";

/// The layouts of every layer that has experts, by layer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlobLayouts {
    /// (layer, items in blob order), ascending by layer.
    pub layers: Vec<(u32, Vec<LayoutItem>)>,
}

impl BlobLayouts {
    /// What is inside each blob of `vault`, by layer: its metadata's
    /// `layer_blob_layouts`, as `smoe pack` writes it. `Ok(None)` when the
    /// metadata has none (a synthetic vault); an error naming the layer and
    /// item when it is malformed, or when an item runs past a blob of its
    /// layer.
    pub fn of(vault: &Vault) -> Result<Option<BlobLayouts>> {
        let Some(layouts) = BlobLayouts::from_metadata(vault.meta())? else {
            return Ok(None);
        };
        for e in vault.entries() {
            let end = layouts
                .layer(e.layer)
                .and_then(|items| items.iter().map(LayoutItem::end).max());
            match end {
                Some(end) if end <= e.size => {}
                Some(end) => {
                    return Err(Error::format(format!(
                        "the layout ends at byte {end}, the blob has {}",
                        e.size
                    ))
                    .with_path(vault.path())
                    .with_expert(e.layer, e.expert)
                    .with_field("layer_blob_layouts"))
                }
                None => {
                    return Err(Error::format(format!(
                        "layer {} has blobs but no entry in layer_blob_layouts",
                        e.layer
                    ))
                    .with_path(vault.path())
                    .with_field("layer_blob_layouts"))
                }
            }
        }
        Ok(Some(layouts))
    }

    /// The items of `layer`'s blobs.
    pub fn layer(&self, layer: u32) -> Option<&[LayoutItem]> {
        self.layers
            .binary_search_by_key(&layer, |(l, _)| *l)
            .ok()
            .map(|i| self.layers[i].1.as_slice())
    }

    /// Reads `layer_blob_layouts` from a vault's metadata text: `Ok(None)`
    /// when the metadata has no such key (a synthetic vault), an error
    /// naming the layer and item when it is malformed. An item's offset
    /// must be a multiple of [`ITEM_ALIGNMENT`], unless the metadata's
    /// `format` is [`IN_PLACE_FORMAT`] (a model opened in place, whose
    /// offsets are slot positions).
    pub fn from_metadata(meta: &str) -> Result<Option<BlobLayouts>> {
        if meta.trim().is_empty() {
            return Ok(None);
        }
        let bad = |what: String| Error::format(format!("metadata: {what}"));
        let v = json::parse(meta).map_err(|e| bad(e.to_string()))?;
        let Some(layouts) = v.get("layer_blob_layouts") else {
            return Ok(None);
        };
        // A model opened in place (SPEC §6) places each item where its
        // windows put it: a position in the slot, of any alignment. A
        // packed vault's items start on ITEM_ALIGNMENT.
        let in_place = v.get("format").and_then(Value::as_str) == Some(IN_PLACE_FORMAT);
        let layouts = layouts
            .as_object()
            .ok_or_else(|| bad("layer_blob_layouts is not an object".into()))?;
        let mut out = BlobLayouts::default();
        for (key, items) in layouts {
            let layer: u32 = key.parse().map_err(|_| {
                bad(format!(
                    "layer_blob_layouts key {key:?} is not a layer number"
                ))
            })?;
            let items = items
                .as_array()
                .ok_or_else(|| bad(format!("layer {layer}: layout is not an array")))?;
            let mut parsed = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let at = |what: &str| bad(format!("layer {layer} item {i}: {what}"));
                let text = |k: &str| {
                    item.get(k)
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                        .ok_or_else(|| at(&format!("{k} is missing or not a string")))
                };
                let number = |k: &str| {
                    item.get(k)
                        .and_then(Value::as_u64)
                        .ok_or_else(|| at(&format!("{k} is missing or not an unsigned integer")))
                };
                let shape = item
                    .get("shape")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
                    .ok_or_else(|| at("shape is missing or not an array of unsigned integers"))?;
                let offset = number("offset")?;
                if !in_place && offset % ITEM_ALIGNMENT != 0 {
                    return Err(at(&format!(
                        "offset {offset} is not a multiple of {ITEM_ALIGNMENT}"
                    )));
                }
                parsed.push(LayoutItem {
                    role: text("role")?,
                    tensor: text("tensor")?,
                    dtype: text("dtype")?,
                    shape,
                    offset,
                    bytes: number("bytes")?,
                });
            }
            let mut sorted: Vec<&LayoutItem> = parsed.iter().collect();
            sorted.sort_by_key(|i| i.offset);
            for w in sorted.windows(2) {
                if w[0].offset + w[0].bytes > w[1].offset {
                    return Err(bad(format!(
                        "layer {layer}: items {} and {} overlap",
                        w[0].role, w[1].role
                    )));
                }
            }
            out.layers.push((layer, parsed));
        }
        out.layers.sort_by_key(|(l, _)| *l);
        if let Some(w) = out.layers.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(bad(format!("layer {} has two layouts", w[0].0)));
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects() {
        let l = BlobLayouts {
            layers: vec![(
                1,
                vec![LayoutItem {
                    role: "gate".into(),
                    tensor: "blk.1.ffn_gate_exps.weight".into(),
                    dtype: "Q8_0".into(),
                    shape: vec![32, 64],
                    offset: 0,
                    bytes: 2176,
                }],
            )],
        };
        let items: Vec<(u32, &[LayoutItem])> =
            l.layers.iter().map(|(n, i)| (*n, i.as_slice())).collect();
        let mut meta = String::from("{\"layer_blob_layouts\":");
        smoe::internals::model::meta::layouts_json(&mut meta, &items);
        meta.push('}');
        assert_eq!(BlobLayouts::from_metadata(&meta).unwrap(), Some(l.clone()));
        assert_eq!(
            BlobLayouts::from_metadata("{\"arch\":\"x\"}").unwrap(),
            None
        );
        let bad = meta.replace("\"offset\":0", "\"offset\":5");
        let e = BlobLayouts::from_metadata(&bad).unwrap_err();
        assert!(e.to_string().contains("layer 1 item 0: offset 5"), "{e}");
        // A model opened in place: any slot position; another format still
        // needs the alignment.
        let model = bad.replacen('{', "{\"format\":\"smoe-model\",", 1);
        let got = BlobLayouts::from_metadata(&model).unwrap().unwrap();
        assert_eq!(got.layers[0].1[0].offset, 5);
        let other = bad.replacen('{', "{\"format\":\"smoe-vault\",", 1);
        let e = BlobLayouts::from_metadata(&other).unwrap_err();
        assert!(e.to_string().contains("layer 1 item 0: offset 5"), "{e}");
        let not_text = bad.replacen('{', "{\"format\":1,", 1);
        assert!(BlobLayouts::from_metadata(&not_text).is_err());
    }
}
