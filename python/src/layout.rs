//! The blob layouts of the metadata (`layer_blob_layouts`, docs/format.md
//! §3.2), read once at open, and the numpy and torch types of each item's
//! `dtype`: what `Lease.numpy(role)` and `Lease.torch(role)` need to type a
//! view of an expert's bytes.

use std::collections::HashMap;

use serde_json::Value;

/// One tensor slice inside a layer's blobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Item {
    /// `gate`, `up`, `down`, `gate_up`, `gate_bias`, ...
    pub(crate) role: String,
    /// The source's element type (`F32`, `BF16`, `Q8_0`, ...).
    pub(crate) dtype: String,
    /// One expert's slice, outermost first.
    pub(crate) shape: Vec<u64>,
    /// From the start of the claim's bytes.
    pub(crate) offset: u64,
    /// The slice's length.
    pub(crate) bytes: u64,
}

/// Every layer's items, by layer.
#[derive(Debug, Default)]
pub(crate) struct Layouts {
    layers: HashMap<u32, Vec<Item>>,
    /// Why there are none, when there are none: said when a role is asked
    /// for.
    missing: Option<String>,
}

impl Layouts {
    /// Reads `layer_blob_layouts` from the metadata text. A vault without
    /// them (a synthetic one) or with ones this cannot read has none; the
    /// reason is kept for [`Layouts::item`]'s error.
    pub(crate) fn parse(meta: &str) -> Layouts {
        match parse_layers(meta) {
            Ok(layers) => Layouts {
                layers,
                missing: None,
            },
            Err(why) => Layouts {
                layers: HashMap::new(),
                missing: Some(why),
            },
        }
    }

    /// The item of `role` in `layer`'s layout, or why there is none.
    pub(crate) fn item(&self, layer: u32, role: &str) -> Result<&Item, String> {
        if let Some(why) = &self.missing {
            return Err(why.clone());
        }
        let items = self
            .layers
            .get(&layer)
            .ok_or_else(|| format!("the metadata has no blob layout for layer {layer}"))?;
        items.iter().find(|item| item.role == role).ok_or_else(|| {
            let roles: Vec<&str> = items.iter().map(|item| item.role.as_str()).collect();
            format!(
                "layer {layer}'s blobs hold no {role:?} (its roles: {})",
                roles.join(", ")
            )
        })
    }
}

fn parse_layers(meta: &str) -> Result<HashMap<u32, Vec<Item>>, String> {
    let none = "the metadata has no layer_blob_layouts (a synthetic vault has none): \
                there are no roles, only the bytes (lease.numpy())";
    if meta.is_empty() {
        return Err(none.to_owned());
    }
    let value: Value =
        serde_json::from_str(meta).map_err(|e| format!("the metadata is not JSON: {e}"))?;
    let layouts = value
        .get("layer_blob_layouts")
        .ok_or_else(|| none.to_owned())?
        .as_object()
        .ok_or("layer_blob_layouts is not an object")?;
    let mut layers = HashMap::new();
    for (key, items) in layouts {
        let layer: u32 = key
            .parse()
            .map_err(|_| format!("layer_blob_layouts has a key {key:?} that is not a layer"))?;
        let items = items
            .as_array()
            .ok_or_else(|| format!("layer_blob_layouts[{key:?}] is not a list"))?
            .iter()
            .map(|item| parse_item(item).ok_or_else(|| bad_item(key, item)))
            .collect::<Result<Vec<_>, _>>()?;
        layers.insert(layer, items);
    }
    Ok(layers)
}

fn parse_item(item: &Value) -> Option<Item> {
    Some(Item {
        role: item.get("role")?.as_str()?.to_owned(),
        dtype: item.get("dtype")?.as_str()?.to_owned(),
        shape: item
            .get("shape")?
            .as_array()?
            .iter()
            .map(Value::as_u64)
            .collect::<Option<Vec<u64>>>()?,
        offset: item.get("offset")?.as_u64()?,
        bytes: item.get("bytes")?.as_u64()?,
    })
}

fn bad_item(layer: &str, item: &Value) -> String {
    format!(
        "layer_blob_layouts[{layer:?}] has an item without role, dtype, shape, offset and \
         bytes: {item}"
    )
}

/// How numpy reads an element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NumpyType {
    /// A numpy dtype string and its element size.
    Typed(&'static str, u64),
    /// bfloat16: typed where numpy knows the name (ml_dtypes registers it),
    /// raw bytes otherwise.
    Bfloat16,
    /// Raw bytes, one dimension: the quantized GGML types (blocks, not
    /// elements), 8-bit floats, anything else.
    Raw,
}

/// The numpy type of a layout's `dtype` (GGML's names and safetensors',
/// which agree on the plain types). Every source is little-endian.
pub(crate) fn numpy_type(dtype: &str) -> NumpyType {
    match dtype {
        "F64" => NumpyType::Typed("<f8", 8),
        "F32" => NumpyType::Typed("<f4", 4),
        "F16" => NumpyType::Typed("<f2", 2),
        "BF16" => NumpyType::Bfloat16,
        "I64" => NumpyType::Typed("<i8", 8),
        "I32" => NumpyType::Typed("<i4", 4),
        "I16" => NumpyType::Typed("<i2", 2),
        "I8" => NumpyType::Typed("i1", 1),
        "U64" => NumpyType::Typed("<u8", 8),
        "U32" => NumpyType::Typed("<u4", 4),
        "U16" => NumpyType::Typed("<u2", 2),
        "U8" => NumpyType::Typed("u1", 1),
        "BOOL" => NumpyType::Typed("?", 1),
        _ => NumpyType::Raw,
    }
}

/// The torch type of a layout's `dtype` (the name of its `torch.dtype`
/// attribute) and its element size; `None` for raw bytes (the quantized
/// GGML types, anything torch has no type for). torch has `bfloat16` and
/// the two 8-bit float types safetensors stores (`F8_E4M3` is
/// `float8_e4m3fn`, `F8_E5M2` `float8_e5m2`, as the safetensors package
/// maps them).
pub(crate) fn torch_type(dtype: &str) -> Option<(&'static str, u64)> {
    Some(match dtype {
        "F64" => ("float64", 8),
        "F32" => ("float32", 4),
        "F16" => ("float16", 2),
        "BF16" => ("bfloat16", 2),
        "F8_E4M3" => ("float8_e4m3fn", 1),
        "F8_E5M2" => ("float8_e5m2", 1),
        "I64" => ("int64", 8),
        "I32" => ("int32", 4),
        "I16" => ("int16", 2),
        "I8" => ("int8", 1),
        "U64" => ("uint64", 8),
        "U32" => ("uint32", 4),
        "U16" => ("uint16", 2),
        "U8" => ("uint8", 1),
        "BOOL" => ("bool", 1),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_found_by_layer_and_role() {
        let meta = r#"{"layer_blob_layouts": {"1": [
            {"role": "gate", "tensor": "t", "dtype": "Q8_0", "shape": [96, 64], "offset": 0, "bytes": 6528},
            {"role": "down_bias", "tensor": "b", "dtype": "F32", "shape": [64], "offset": 20992, "bytes": 256}
        ]}}"#;
        let layouts = Layouts::parse(meta);
        let item = layouts.item(1, "down_bias").unwrap();
        assert_eq!(
            (item.offset, item.bytes, item.shape.clone()),
            (20992, 256, vec![64])
        );
        assert!(layouts
            .item(1, "up")
            .unwrap_err()
            .contains("gate, down_bias"));
        assert!(layouts.item(0, "gate").unwrap_err().contains("layer 0"));
    }

    #[test]
    fn a_vault_without_layouts_says_so() {
        let layouts = Layouts::parse(r#"{"format": "smoe-vault"}"#);
        assert!(layouts.item(0, "gate").unwrap_err().contains("synthetic"));
        assert!(Layouts::parse("").item(0, "gate").is_err());
    }

    #[test]
    fn quantized_types_are_raw() {
        assert_eq!(numpy_type("Q4_K"), NumpyType::Raw);
        assert_eq!(numpy_type("F8_E4M3"), NumpyType::Raw);
        assert_eq!(numpy_type("F16"), NumpyType::Typed("<f2", 2));
        assert_eq!(torch_type("Q4_K"), None);
        assert_eq!(torch_type("IQ2_XXS"), None);
        assert_eq!(torch_type("BF16"), Some(("bfloat16", 2)));
        assert_eq!(torch_type("F8_E4M3"), Some(("float8_e4m3fn", 1)));
    }
}
