//! What a vault of a model holds, planned from the model's headers alone:
//! the checks before anything is sized (tensors that share bytes, expert
//! counts, the vault's id cap) and each layer's blob layout, the same for
//! every expert of the layer: its items in the order gate, up or gate_up,
//! down, then biases ([`role_rank`]), each at a multiple of
//! [`ITEM_ALIGNMENT`] bytes, and, per item, where expert `e`'s slice lies in
//! the source files ([`LayerPlan::slice`]).

use std::collections::BTreeMap;

use super::names::{expert_template, role_rank};
use super::{ExpertTensor, Model, SourceKind, Tensor};
use crate::error::{Error, Result};

/// Items start at multiples of this many bytes inside a blob.
pub const ITEM_ALIGNMENT: u64 = 256;

/// One tensor slice inside every blob of a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutItem {
    /// `gate`, `up`, `down`, `gate_up` (fused: gate rows then up rows),
    /// their `_bias` forms, or the source's own suffix.
    pub role: String,
    /// The source tensor; `{expert}` stands for the expert number where the
    /// source has one tensor per expert.
    pub tensor: String,
    /// The source's element type name (`Q8_0`, `BF16`, `F32`, ...).
    pub dtype: String,
    /// The slice's shape, outermost dimension first.
    pub shape: Vec<u64>,
    /// Bytes from the start of the blob (a multiple of [`ITEM_ALIGNMENT`]).
    pub offset: u64,
    /// Bytes of the slice, as in the source.
    pub bytes: u64,
}

impl LayoutItem {
    /// The end of the item inside the blob.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.bytes)
    }

    /// The shape as text, outermost first: `[768, 2048]`.
    pub fn shape_text(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(u64::to_string).collect();
        format!("[{}]", dims.join(", "))
    }
}

/// Refuses tensors whose data overlap in a file: each is copied whole, so
/// aliased ranges would let a small file stand for a huge model (a 411 KB
/// GGUF became a 501 MB vault). Empty tensors overlap nothing.
pub fn check_no_overlap(model: &Model) -> Result<()> {
    let mut order: Vec<&Tensor> = model.tensors.iter().filter(|t| t.bytes > 0).collect();
    order.sort_unstable_by_key(|t| (t.file, t.offset));
    // The tensor of this file seen so far whose data reaches furthest.
    let mut reach: Option<&Tensor> = None;
    let end = |t: &Tensor| t.offset.saturating_add(t.bytes);
    for t in order {
        match reach {
            Some(r) if r.file == t.file && t.offset < end(r) => {
                return Err(Error::format(format!(
                    "{}: tensors {} (bytes {}..{}) and {} (bytes {}..{}) share data; each tensor must have bytes of its own",
                    model.files[t.file].display(),
                    r.name,
                    r.offset,
                    end(r),
                    t.name,
                    t.offset,
                    end(t)
                )));
            }
            Some(r) if r.file == t.file && end(r) >= end(t) => {}
            _ => reach = Some(t),
        }
    }
    Ok(())
}

/// Where one item of one expert's blob comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    /// Index into the model's files.
    pub file: usize,
    /// Absolute offset in that file.
    pub offset: u64,
    /// Bytes of the slice.
    pub bytes: u64,
}

/// One layer's plan: its layout and, per item, how to find expert e's
/// slice.
#[derive(Clone, Debug)]
pub struct LayerPlan {
    /// The layer (the source's block number).
    pub layer: u32,
    /// The items of every blob of the layer, in blob order.
    pub items: Vec<LayoutItem>,
    /// Per item: a stacked tensor (slice e at `offset + e × stride`), or
    /// one tensor per expert.
    sources: Vec<ItemSource>,
    /// Bytes of each blob of the layer: the end of its last item.
    pub blob_bytes: u64,
}

/// Where an item's slices lie.
#[derive(Clone, Debug)]
enum ItemSource {
    /// One tensor of all experts: expert e's slice at `offset + e × stride`.
    Stacked {
        file: usize,
        offset: u64,
        stride: u64,
    },
    /// One tensor per expert, by expert.
    PerExpert(Vec<Slice>),
}

impl LayerPlan {
    /// Where expert `expert`'s slice of item `item` lies. Both must be in
    /// range: `item` below `items.len()`, `expert` below the expert count
    /// [`plan`] returned.
    pub fn slice(&self, item: usize, expert: u32) -> Slice {
        match &self.sources[item] {
            ItemSource::Stacked {
                file,
                offset,
                stride,
            } => Slice {
                file: *file,
                offset: offset + u64::from(expert) * stride,
                bytes: *stride,
            },
            ItemSource::PerExpert(slices) => slices[expert as usize],
        }
    }
}

/// Most roles (kinds of expert tensor) a layer's blob holds.
const MAX_ROLES: usize = 64;

/// Checks the expert tensors and plans every layer's blobs: the layer
/// count, the expert count, and the plan of each layer that has experts,
/// ascending by layer. Errors name the file (and the tensors).
pub fn plan(model: &Model) -> Result<(u32, u32, Vec<LayerPlan>)> {
    // The expert tensor of the highest layer: a name may say any layer up
    // to 2^32 - 1, so the count is reckoned in u64 and checked below.
    let Some(top) = model.experts.iter().max_by_key(|x| x.layer) else {
        return Err(Error::format(format!(
            "{}: no expert tensors found ({} tensors; expected names like {})",
            model.files[0].display(),
            model.tensors.len(),
            match model.kind {
                SourceKind::Gguf => "blk.N.ffn_gate_exps.weight",
                SourceKind::Safetensors =>
                    "model.layers.N.mlp.experts.E.gate_proj.weight or model.layers.N.block_sparse_moe.experts.E.w1.weight",
            }
        )));
    };
    let bad = |what: String| Error::format(format!("{}: {what}", model.files[0].display()));
    // The expert count: what the source says, else what the tensors show.
    let shown = |x: &ExpertTensor| match x.expert {
        Some(e) => u64::from(e) + 1,
        None => *model.tensors[x.tensor].shape.first().unwrap_or(&0),
    };
    let n_experts = model
        .expert_count
        .or_else(|| model.experts.iter().map(shown).max());
    if let Some(n) = n_experts {
        for x in &model.experts {
            let t = &model.tensors[x.tensor];
            match x.expert {
                None if shown(x) != n => {
                    return Err(bad(format!(
                        "tensor {} stacks {} experts, the model has {n}",
                        t.name,
                        shown(x)
                    )))
                }
                Some(e) if u64::from(e) >= n => {
                    return Err(bad(format!(
                        "tensor {} is expert {e}, the model has {n} experts",
                        t.name
                    )))
                }
                _ => {}
            }
        }
    }
    let n_experts = n_experts
        .filter(|&n| n > 0)
        .ok_or_else(|| bad("no experts".into()))?;
    let max_layer = top.layer;
    let (n_layers, from_tensor) = match model.block_count {
        Some(b) if b > u64::from(max_layer) => (b, false),
        Some(b) => {
            return Err(bad(format!(
                "expert tensors of layer {max_layer}, but the block count is {b}"
            )))
        }
        None => (u64::from(max_layer) + 1, true),
    };

    // Before anything is sized by them: a config.json, a header or a
    // tensor's name may claim any count, and the expert count any u64.
    let max_ids = crate::limits::MAX_EXPERT_IDS;
    let ids = n_layers.saturating_mul(n_experts);
    if ids > max_ids {
        let top_tensor = &model.tensors[top.tensor];
        // Where each count came from: a key the source has, else the
        // tensors themselves.
        let experts_from = match &model.counts_from.1 {
            Some(key) => key.clone(),
            None => {
                let x = model.experts.iter().max_by_key(|x| shown(x)).unwrap_or(top);
                let t = &model.tensors[x.tensor];
                match x.expert {
                    Some(e) => format!("the expert number of tensor {} ({e})", t.name),
                    None => format!("the outermost dimension of tensor {}", t.name),
                }
            }
        };
        let ids_text = format!(
            "{n_layers} layers × {n_experts} experts = {ids} expert ids, above the limit of {max_ids} ids"
        );
        return Err(Error::format(match (&model.counts_from.0, from_tensor) {
            (Some(key), false) => format!(
                "{}: {ids_text} (the expert count is from {experts_from}, the layer count from {key})",
                model.files[0].display()
            ),
            _ => format!(
                "{}: tensor {} is in layer {max_layer}, so the model would have {ids_text} (the expert count is from {experts_from})",
                model.files[top_tensor.file].display(),
                top_tensor.name
            ),
        }));
    }
    // Their product is at most MAX_EXPERT_IDS, so both fit.
    let n_experts = u32::try_from(n_experts).map_err(|_| bad(format!("{n_experts} experts")))?;
    let n_layers = u32::try_from(n_layers).map_err(|_| bad(format!("{n_layers} layers")))?;
    let mut by_layer: BTreeMap<u32, BTreeMap<String, Vec<&ExpertTensor>>> = BTreeMap::new();
    for x in &model.experts {
        by_layer
            .entry(x.layer)
            .or_default()
            .entry(x.role.clone())
            .or_default()
            .push(x);
    }
    let mut plans = Vec::new();
    for (layer, roles) in by_layer {
        // A model has a handful (gate, up, down, their biases); any number
        // of stacked tensors may claim the expert grammar, and a layer's
        // blob is sized per role and per expert.
        if roles.len() > MAX_ROLES {
            return Err(bad(format!(
                "layer {layer} has {} kinds of expert tensor (roles); a blob holds at most {MAX_ROLES}",
                roles.len()
            )));
        }
        let mut roles: Vec<(String, Vec<&ExpertTensor>)> = roles.into_iter().collect();
        roles.sort_by(|a, b| role_rank(&a.0).cmp(&role_rank(&b.0)));
        let mut items = Vec::new();
        let mut sources = Vec::new();
        let mut offset = 0u64;
        for (role, xs) in roles {
            let stacked: Vec<_> = xs.iter().filter(|x| x.expert.is_none()).collect();
            let (tensor_name, dtype, shape, source) = if let [x] = stacked.as_slice() {
                if xs.len() > 1 {
                    return Err(bad(format!(
                        "layer {layer} {role}: both a stacked tensor and per-expert tensors"
                    )));
                }
                let t = &model.tensors[x.tensor];
                let stride = t.bytes / u64::from(n_experts);
                if stride * u64::from(n_experts) != t.bytes || stride == 0 {
                    return Err(bad(format!(
                        "tensor {}: {} bytes do not split into {n_experts} experts",
                        t.name, t.bytes
                    )));
                }
                (
                    t.name.clone(),
                    t.dtype.clone(),
                    t.shape.get(1..).unwrap_or_default().to_vec(),
                    ItemSource::Stacked {
                        file: t.file,
                        offset: t.offset,
                        stride,
                    },
                )
            } else if !stacked.is_empty() {
                return Err(bad(format!(
                    "layer {layer} {role}: more than one stacked tensor"
                )));
            } else {
                let mut slices: Vec<Option<(Slice, &Tensor)>> = vec![None; n_experts as usize];
                // No stacked tensor here: every tensor is one expert's.
                for (x, e) in xs.iter().filter_map(|x| Some((x, x.expert?))) {
                    let t = &model.tensors[x.tensor];
                    // Below n_experts, checked above.
                    let Some(slot) = slices.get_mut(e as usize) else {
                        return Err(bad(format!(
                            "tensor {} is expert {e}, the model has {n_experts} experts",
                            t.name
                        )));
                    };
                    if let Some((_, other)) = slot {
                        return Err(bad(format!(
                            "layer {layer} {role}: expert {e} appears twice, as {} and {}",
                            other.name, t.name
                        )));
                    }
                    *slot = Some((
                        Slice {
                            file: t.file,
                            offset: t.offset,
                            bytes: t.bytes,
                        },
                        t,
                    ));
                }
                let Some(first) = slices.iter().flatten().next().map(|(_, t)| *t) else {
                    return Err(bad(format!("layer {layer} {role}: no tensor")));
                };
                let mut out = Vec::with_capacity(slices.len());
                for (e, s) in slices.iter().enumerate() {
                    let Some((slice, t)) = s else {
                        return Err(bad(format!(
                            "layer {layer} {role}: expert {e} is missing (the model has {n_experts} experts)"
                        )));
                    };
                    if (&t.dtype, &t.shape) != (&first.dtype, &first.shape) {
                        return Err(bad(format!(
                            "layer {layer} {role}: {} is {} {:?}, but {} is {} {:?}; every expert of a layer must match",
                            t.name, t.dtype, t.shape, first.name, first.dtype, first.shape
                        )));
                    }
                    out.push(*slice);
                }
                let template = expert_template(&first.name);
                (
                    template,
                    first.dtype.clone(),
                    first.shape.clone(),
                    ItemSource::PerExpert(out),
                )
            };
            let bytes = match &source {
                ItemSource::Stacked { stride, .. } => *stride,
                ItemSource::PerExpert(s) => s.first().map_or(0, |s| s.bytes),
            };
            items.push(LayoutItem {
                role,
                tensor: tensor_name,
                dtype,
                shape,
                offset,
                bytes,
            });
            sources.push(source);
            offset = (offset + bytes).next_multiple_of(ITEM_ALIGNMENT);
        }
        let blob_bytes = items.last().map_or(0, LayoutItem::end);
        plans.push(LayerPlan {
            layer,
            items,
            sources,
            blob_bytes,
        });
    }
    Ok((n_layers, n_experts, plans))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config.json may claim any expert count: it is checked against the
    /// id cap before anything is sized by it.
    #[cfg(feature = "safetensors")]
    #[test]
    fn a_huge_claimed_expert_count_is_refused_before_allocating() {
        let dir = tempfile::tempdir().unwrap();
        let header = r#"{"model.layers.0.mlp.experts.0.up_proj.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.extend_from_slice(&[0u8; 16]);
        std::fs::write(dir.path().join("model.safetensors"), file).unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"num_local_experts": 4000000000, "num_hidden_layers": 1}"#,
        )
        .unwrap();
        let model = super::super::open_model(dir.path(), &|| false).unwrap();
        let e = plan(&model).unwrap_err();
        assert!(e.to_string().contains("above the limit of 1048576"), "{e}");
    }

    /// An expert count that does not fit 32 bits is refused naming where
    /// it came from and the id cap, whichever source gave it: a GGUF key, a
    /// stacked tensor's outermost dimension, or a `config.json` key.
    #[test]
    fn an_expert_count_over_u32_names_its_source_and_the_id_cap() {
        use super::super::gguf::{header_bytes, GgmlType, KeyValue, TensorInfo};
        let n = 1u64 << 32;
        let dir = tempfile::tempdir().unwrap();
        // One stacked I8 tensor of 2^32 one-byte experts, its data a hole.
        let gguf = |name: &str, key: Option<u64>| {
            let mut kvs = vec![KeyValue::string("general.architecture", "qwen3moe")];
            if let Some(k) = key {
                kvs.push(KeyValue {
                    key: "qwen3moe.expert_count".into(),
                    value_type: 10,
                    raw: k.to_le_bytes().to_vec(),
                });
            }
            let mut tensors = [TensorInfo {
                name: "blk.0.ffn_up_exps.weight".into(),
                ne: vec![1, 1, n],
                ggml_type: GgmlType::from_id(24).unwrap(),
                offset: 0,
                bytes: n,
            }];
            let head = header_bytes(&kvs, &mut tensors, 32);
            let path = dir.path().join(name);
            std::fs::write(&path, &head).unwrap();
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_len(head.len() as u64 + n).unwrap();
            plan(&super::super::open_model(&path, &|| false).unwrap())
                .unwrap_err()
                .to_string()
        };
        #[cfg(feature = "safetensors")]
        let (_dir, model) = checkpoint(
            &["model.layers.0.mlp.experts.0.up_proj.weight"],
            r#"{"num_experts": 5000000000, "num_hidden_layers": 1}"#,
        );
        #[cfg(feature = "safetensors")]
        let config_json = Some((
            plan(&model).unwrap_err().to_string(),
            vec!["config.json", "num_experts", "5000000000"],
        ));
        // A GGUF-only build has no safetensors case.
        #[cfg(not(feature = "safetensors"))]
        let config_json = None;
        let errors: Vec<(String, Vec<&str>)> = [
            (
                gguf("key.gguf", Some(n)),
                vec!["qwen3moe.expert_count", "4294967296"],
            ),
            (
                gguf("tensor.gguf", None),
                vec!["blk.0.ffn_up_exps.weight", "4294967296"],
            ),
        ]
        .into_iter()
        .chain(config_json)
        .collect();
        let wrong: Vec<&String> = errors
            .iter()
            .filter(|(e, needles)| !needles.iter().chain(&["1048576"]).all(|n| e.contains(n)))
            .map(|(e, _)| e)
            .collect();
        assert!(
            wrong.is_empty(),
            "not naming the source and the cap: {wrong:#?}"
        );
    }

    /// A safetensors checkpoint in a new directory: one F32 [2, 2] tensor
    /// per name, and `config`.
    #[cfg(feature = "safetensors")]
    fn checkpoint(names: &[&str], config: &str) -> (tempfile::TempDir, crate::model::Model) {
        let dir = tempfile::tempdir().unwrap();
        let entries: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                format!(
                    r#""{n}":{{"dtype":"F32","shape":[2,2],"data_offsets":[{},{}]}}"#,
                    16 * i,
                    16 * (i + 1)
                )
            })
            .collect();
        let header = format!("{{{}}}", entries.join(","));
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.resize(file.len() + 16 * names.len(), 0);
        std::fs::write(dir.path().join("model.safetensors"), file).unwrap();
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        let model = super::super::open_model(dir.path(), &|| false).unwrap();
        (dir, model)
    }

    /// One expert under two spellings of its role is refused naming both
    /// tensors.
    #[cfg(feature = "safetensors")]
    #[test]
    fn an_expert_spelled_twice_names_both_tensors() {
        let (_dir, model) = checkpoint(
            &[
                "model.layers.0.mlp.experts.0.up_proj.weight",
                "model.layers.0.mlp.experts.1.up_proj.weight",
                "model.layers.0.mlp.experts.0.w3.weight",
            ],
            r#"{"num_local_experts": 2, "num_hidden_layers": 1}"#,
        );
        let e = plan(&model).unwrap_err().to_string();
        assert!(
            e.contains("expert 0 appears twice")
                && e.contains("model.layers.0.mlp.experts.0.up_proj.weight")
                && e.contains("model.layers.0.mlp.experts.0.w3.weight"),
            "{e}"
        );
    }

    /// A header may hold any number of stacked tensors the grammar takes
    /// for experts: beyond [`MAX_ROLES`] in a layer, the plan refuses
    /// rather than size a table of roles × experts.
    #[cfg(feature = "safetensors")]
    #[test]
    fn a_layer_of_too_many_roles_is_refused() {
        let names: Vec<String> = (0..=MAX_ROLES)
            .map(|i| format!("model.layers.0.mlp.experts.role{i}"))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let config = r#"{"n_routed_experts": 2, "num_hidden_layers": 1}"#;
        let (_dir, model) = checkpoint(&names, config);
        let e = plan(&model).unwrap_err().to_string();
        assert!(e.contains("layer 0 has 65 kinds of expert tensor"), "{e}");
        let (_dir, model) = checkpoint(&names[..MAX_ROLES], config);
        assert_eq!(plan(&model).unwrap().2[0].items.len(), MAX_ROLES);
    }

    /// DeepSeek-V3's and GLM-4.5's checkpoints keep their multi-token
    /// prediction block as the layer after `num_hidden_layers`, counted by
    /// `num_nextn_predict_layers`: its experts, when there, are a layer of
    /// the model.
    #[cfg(feature = "safetensors")]
    #[test]
    fn next_token_prediction_layers_count_as_layers() {
        let names = [
            "model.layers.0.mlp.experts.0.up_proj.weight",
            "model.layers.0.mlp.experts.1.up_proj.weight",
            "model.layers.1.mlp.experts.0.up_proj.weight",
            "model.layers.1.mlp.experts.1.up_proj.weight",
        ];
        let (_dir, model) = checkpoint(
            &names,
            r#"{"n_routed_experts": 2, "num_hidden_layers": 1, "num_nextn_predict_layers": 1}"#,
        );
        let (n_layers, n_experts, _) = plan(&model).unwrap();
        assert_eq!((n_layers, n_experts), (2, 2));
        // A checkpoint trimmed of its prediction layer keeps the key: the
        // layer count is the decoder's.
        let (_dir, model) = checkpoint(
            &names[..2],
            r#"{"n_routed_experts": 2, "num_hidden_layers": 1, "num_nextn_predict_layers": 1}"#,
        );
        let (n_layers, n_experts, _) = plan(&model).unwrap();
        assert_eq!((n_layers, n_experts), (1, 2));
        // Without the key, layer 1 is past the block count.
        let (_dir, model) =
            checkpoint(&names, r#"{"n_routed_experts": 2, "num_hidden_layers": 1}"#);
        let e = plan(&model).unwrap_err().to_string();
        assert!(
            e.contains("expert tensors of layer 1, but the block count is 1"),
            "{e}"
        );
    }
}
