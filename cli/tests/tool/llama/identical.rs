//! Stock's text and logits, bit for bit, through rings smaller than the
//! fixtures' layers, from vaults and from the GGUFs in place.

use super::*;

#[test]
fn mixtral_q8_0_identical() {
    // 4 experts per layer, top-2: 3 slots
    identical("mixtral-q8_0.gguf", 3);
}

#[test]
fn mixtral256_q4_k_m_identical() {
    // Q4_K and Q6_K experts, which stock repacks when repacking is on
    identical("mixtral256-q4_k_m.gguf", 3);
}

#[test]
fn qwen3moe_q8_0_identical() {
    // 16 experts per layer
    identical("qwen3moe-q8_0.gguf", 8);
}

#[test]
fn qwen3moe_bf16_identical() {
    identical("qwen3moe-bf16.gguf", 8);
}

/// The waves and what they compute: the long prompt routes each layer of
/// qwen3moe to all 16 experts, through a ring of 8 slots (half a layer),
/// so prefill runs every layer in waves (it once shrank n_ubatch to 4
/// tokens instead and read each expert once per 4 tokens); the logits of
/// every step are stock's, bit for bit, and the statistics say waves ran.
#[test]
fn qwen3moe_half_a_layer_prefill_in_waves_identical() {
    let Some(waves) = identical_with("qwen3moe-q8_0.gguf", 8, LONG_PROMPT) else {
        return;
    };
    // a layer's 16 experts through 8 slots: prefill's layers take two waves
    // or more (a shrunk n_ubatch instead would show one)
    assert!(waves > 1.0, "{waves} waves per layer");
}

/// Many waves in a deeper model: the long prompt routes each of the 8
/// layers to all 16 experts through a ring of one slot, 16 waves a layer.
/// Each wave repeats the expert FFN's graph nodes; llama.cpp's node budget
/// for this model (1024) once overflowed and the context aborted in
/// `ggml_hash_insert` before the first token. Now the budget counts the
/// waves: stock's text and logits.
#[test]
fn qwen3moe_8_layers_one_slot_sixteen_waves_identical() {
    let Some(waves) = identical_with("derived/qwen3moe-q8_0-8layers.gguf", 1, LONG_PROMPT) else {
        return;
    };
    // prefill's layers in 16 waves, decode's in as many as a token's top-k
    assert!(waves > 2.0, "{waves} waves per layer");
}

/// One slot, fewer than a token's top-2: decode runs in waves of one
/// expert (it once stopped: "distinct experts but the ring has 1 slots").
#[test]
fn mixtral_one_slot_in_waves_identical() {
    identical("mixtral-q8_0.gguf", 1);
}

// In place (issue 34): `SMOE=1` streams the routed experts from the very
// GGUF llama.cpp is given, with no vault; `SMOE_VAULT` may name the model
// file too.

/// The slot offsets of a model's items as smoe's metadata gives them (SPEC
/// §6: positions in the slot, not necessarily multiples of 256).
fn in_place_offsets(gguf: &Path) -> Vec<u64> {
    let vault = smoe::vault::Vault::open(gguf).unwrap();
    let meta: serde_json::Value = serde_json::from_str(vault.meta()).unwrap();
    assert_eq!(meta["format"], "smoe-model", "{}", vault.meta());
    meta["layer_blob_layouts"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|items| items.as_array().unwrap().iter())
        .map(|item| item["offset"].as_u64().unwrap())
        .collect()
}

#[test]
fn mixtral_q8_0_in_place_identical() {
    identical_from("mixtral-q8_0.gguf", 3, PROMPT, Source::Model);
}

/// Q4_K and Q6_K experts whose items sit at slot offsets that are not
/// multiples of 256 (the tensors' file offsets mod 4096): the glue's views
/// take them as they are.
#[test]
fn mixtral256_q4_k_m_in_place_identical() {
    let gguf = fixtures().join("mixtral256-q4_k_m.gguf");
    let offsets = in_place_offsets(&gguf);
    assert!(
        offsets.iter().any(|o| o % 256 != 0),
        "no offset off 256 any more: {offsets:?}"
    );
    identical_from("mixtral256-q4_k_m.gguf", 3, PROMPT, Source::Model);
}

#[test]
fn qwen3moe_q8_0_in_place_identical() {
    identical_from("qwen3moe-q8_0.gguf", 8, PROMPT, Source::Model);
}

#[test]
fn qwen3moe_bf16_in_place_identical() {
    let offsets = in_place_offsets(&fixtures().join("qwen3moe-bf16.gguf"));
    assert!(offsets.iter().any(|o| o % 256 != 0), "{offsets:?}");
    identical_from("qwen3moe-bf16.gguf", 8, PROMPT, Source::Model);
}

/// The other fixtures llama.cpp runs, in place through one slot (every
/// batch in waves): per-expert biases and items off 256 (gpt-oss), a fused
/// `gate_up` weight (cohere2moe), a dense first layer and shared experts
/// (deepseekv3, qwen2moe), F16 experts (mixtral).
#[test]
fn other_fixtures_in_place_one_slot_identical() {
    for fixture in [
        "gptoss-f32.gguf",
        "cohere2moe-q8_0-fused.gguf",
        "deepseekv3-q8_0.gguf",
        "qwen2moe-q8_0.gguf",
        "mixtral-f16.gguf",
    ] {
        if identical_from(fixture, 1, PROMPT, Source::Model).is_none() {
            return;
        }
    }
}

/// A split GGUF: llama.cpp is given the first of its 4 parts and finds the
/// others beside it; smoe, given the same path, reads the experts from the
/// parts that hold them. Stock's logits on the split model, bit for bit.
#[test]
fn split_gguf_in_place_identical() {
    identical_from(SPLIT, 8, PROMPT, Source::Model);
}

/// The first part of the split fixture.
const SPLIT: &str = "qwen3moe-q8_0-split/qwen3moe-q8_0-split-00001-of-00004.gguf";

/// `SMOE_VAULT` naming the model file itself (what `SMOE=1` does without
/// it): a single GGUF whose items are off 256, and the split one's first
/// part.
#[test]
fn smoe_vault_naming_the_gguf_identical() {
    identical_from("mixtral256-q4_k_m.gguf", 3, PROMPT, Source::Named);
    identical_from(SPLIT, 8, PROMPT, Source::Named);
}

/// The long prompt through half a layer's slots, in place: prefill's layers
/// run in waves, the logits are stock's.
#[test]
fn in_place_half_a_layer_prefill_in_waves_identical() {
    let Some(waves) = identical_from("qwen3moe-q8_0.gguf", 8, LONG_PROMPT, Source::Model) else {
        return;
    };
    assert!(waves > 1.0, "{waves} waves per layer");
}

/// One slot for the 8-layer model, in place: 16 waves a layer in prefill.
#[test]
fn in_place_8_layers_one_slot_sixteen_waves_identical() {
    let Some(waves) = identical_from(
        "derived/qwen3moe-q8_0-8layers.gguf",
        1,
        LONG_PROMPT,
        Source::Model,
    ) else {
        return;
    };
    assert!(waves > 2.0, "{waves} waves per layer");
}
