//! Which tensors are experts, by name (docs/pack.md, "What it recognises"):
//! one grammar for the packer and an in-place open, so both see the same
//! layers, roles and expert ids.
//!
//! - GGUF: `blk.N.ffn_{gate,up,down,gate_up}_exps.{weight,bias}`, stacked
//!   (the outermost dimension is the expert);
//! - safetensors: `model.layers.N.<block>.experts.E.<proj>.{weight,bias}`
//!   with `<block>` `mlp` or `block_sparse_moe` and `<proj>` `gate_proj`,
//!   `up_proj`, `down_proj`, `gate_up_proj`, `w1` (gate), `w3` (up), `w2`
//!   (down); and stacked `model.layers.N.<block>.experts.<name>`.
//!
//! Routers, shared experts and every other tensor are not experts. A role
//! is `gate`, `up`, `gate_up`, `down`, their `_bias` forms, or a stacked
//! tensor's own name; [`role_rank`] orders them inside a blob.

/// Role order inside a blob: gate, up, gate_up, down, then biases, then
/// any other role by name.
pub fn role_rank(role: &str) -> (u8, &str) {
    let rank = match role {
        "gate" => 0,
        "up" => 1,
        "gate_up" => 2,
        "down" => 3,
        "gate_bias" => 4,
        "up_bias" => 5,
        "gate_up_bias" => 6,
        "down_bias" => 7,
        _ => 8,
    };
    (rank, role)
}

/// A layer or expert number as writers spell it: decimal digits, no sign,
/// no leading zero (`3`, not `+3` or `03`), so one number has one name
/// and the name llama.cpp or transformers looks up is the one read here.
fn number(s: &str) -> Option<u32> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

/// Recognises `blk.N.ffn_{gate,up,down,gate_up}_exps.{weight,bias}`.
pub fn gguf_expert(name: &str) -> Option<(u32, String)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer = number(layer)?;
    let (stem, suffix) = rest.split_once('.')?;
    let proj = stem.strip_prefix("ffn_")?.strip_suffix("_exps")?;
    if !matches!(proj, "gate" | "up" | "down" | "gate_up") {
        return None;
    }
    let role = match suffix {
        "weight" => proj.to_owned(),
        "bias" => format!("{proj}_bias"),
        _ => return None,
    };
    Some((layer, role))
}

/// Recognises `model.layers.N.<block>.experts.E.<proj>.{weight,bias}` and
/// stacked `model.layers.N.<block>.experts.<name>`.
pub fn safetensors_expert(name: &str) -> Option<(u32, String, Option<u32>)> {
    // Most tensors are not experts: skip them before splitting the name.
    if !name.starts_with("model.layers.") || !name.contains(".experts.") {
        return None;
    }
    let parts: Vec<&str> = name.split('.').collect();
    let ["model", "layers", layer, block, "experts", rest @ ..] = parts.as_slice() else {
        return None;
    };
    if !matches!(*block, "mlp" | "block_sparse_moe") {
        return None;
    }
    let layer = number(layer)?;
    match rest {
        [expert, proj, kind] => {
            let expert = number(expert)?;
            let proj = match *proj {
                "gate_proj" | "w1" => "gate",
                "up_proj" | "w3" => "up",
                "down_proj" | "w2" => "down",
                "gate_up_proj" => "gate_up",
                _ => return None,
            };
            let role = match *kind {
                "weight" => proj.to_owned(),
                "bias" => format!("{proj}_bias"),
                _ => return None,
            };
            Some((layer, role, Some(expert)))
        }
        [stacked] => {
            let role = match *stacked {
                "gate_proj" => "gate".to_owned(),
                "up_proj" => "up".to_owned(),
                "down_proj" => "down".to_owned(),
                "gate_up_proj" => "gate_up".to_owned(),
                s => match s.strip_suffix("_proj_bias") {
                    Some(p) => format!("{p}_bias"),
                    None => s.to_owned(),
                },
            };
            Some((layer, role, None))
        }
        _ => None,
    }
}

/// `model.layers.3.mlp.experts.7.gate_proj.weight` →
/// `model.layers.3.mlp.experts.{expert}.gate_proj.weight`.
pub fn expert_template(name: &str) -> String {
    let parts: Vec<&str> = name.split('.').collect();
    parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if i == 5 && parts.get(4) == Some(&"experts") {
                "{expert}"
            } else {
                p
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_recognised() {
        assert_eq!(
            gguf_expert("blk.3.ffn_gate_exps.weight"),
            Some((3, "gate".into()))
        );
        assert_eq!(
            gguf_expert("blk.0.ffn_gate_up_exps.bias"),
            Some((0, "gate_up_bias".into()))
        );
        assert_eq!(gguf_expert("blk.3.ffn_gate_shexp.weight"), None);
        assert_eq!(gguf_expert("blk.3.ffn_gate_inp.weight"), None);
        assert_eq!(gguf_expert("blk.3.exp_probs_b.bias"), None);
        assert_eq!(
            safetensors_expert("model.layers.2.block_sparse_moe.experts.7.w3.weight"),
            Some((2, "up".into(), Some(7)))
        );
        assert_eq!(
            safetensors_expert("model.layers.1.mlp.experts.10.down_proj.weight"),
            Some((1, "down".into(), Some(10)))
        );
        assert_eq!(
            safetensors_expert("model.layers.1.mlp.experts.gate_up_proj_bias"),
            Some((1, "gate_up_bias".into(), None))
        );
        assert_eq!(
            safetensors_expert("model.layers.1.mlp.shared_experts.gate_proj.weight"),
            None
        );
        assert_eq!(
            safetensors_expert("model.layers.1.mlp.shared_expert.up_proj.weight"),
            None
        );
        assert_eq!(safetensors_expert("model.layers.1.mlp.gate.weight"), None);
        // One spelling a number: what llama.cpp and transformers look up.
        for odd in ["+3", "03", "-0", " 3", "3 ", "", "4294967296"] {
            assert_eq!(
                gguf_expert(&format!("blk.{odd}.ffn_up_exps.weight")),
                None,
                "{odd:?}"
            );
            assert_eq!(
                safetensors_expert(&format!("model.layers.{odd}.mlp.experts.1.up_proj.weight")),
                None,
                "{odd:?}"
            );
            assert_eq!(
                safetensors_expert(&format!("model.layers.1.mlp.experts.{odd}.up_proj.weight")),
                None,
                "{odd:?}"
            );
        }
        assert_eq!(
            gguf_expert("blk.0.ffn_up_exps.weight"),
            Some((0, "up".into()))
        );
        assert_eq!(
            safetensors_expert("model.layers.10.mlp.experts.0.up_proj.weight"),
            Some((10, "up".into(), Some(0)))
        );
        assert_eq!(
            expert_template("model.layers.3.mlp.experts.7.gate_proj.weight"),
            "model.layers.3.mlp.experts.{expert}.gate_proj.weight"
        );
    }
}
