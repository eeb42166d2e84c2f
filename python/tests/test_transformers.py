"""``smoe.transformers``: tiny random-weight MoE models built here from
transformers' own config classes, saved with ``save_pretrained``, and run
with their routed experts streamed; the logits equal the same checkpoint
loaded in memory with ``experts_implementation="eager"``, bit for bit.

Every model routes each token to 4 of its 8 experts: with 4 terms the order
of the additions shows in the last bits (two terms commute), so a backend
that summed in another order would fail (``test_the_comparison_can_tell``).
"""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

import smoe
from conftest import MODELS, QUIET, need

torch = need("torch")
transformers = need("transformers")
st = need("smoe.transformers")

EXPERTS = 8
TOP_K = 4
VOCAB = 128
# The prompt: seeded token ids (no tokenizer), enough tokens that most
# experts of every layer are hit.
PROMPT_TOKENS = 12

# Shared by every config: small, and token ids inside the vocabulary.
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts_per_tok=TOP_K,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=2,
    tie_word_embeddings=False,
)


def configs() -> dict[str, object]:
    """One config per family, from transformers' own classes."""
    return {
        "mixtral": transformers.MixtralConfig(
            **COMMON, intermediate_size=32, num_hidden_layers=2, num_local_experts=EXPERTS
        ),
        "qwen3moe": transformers.Qwen3MoeConfig(
            **COMMON,
            intermediate_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_experts=EXPERTS,
            head_dim=16,
        ),
        "olmoe": transformers.OlmoeConfig(
            **COMMON, intermediate_size=32, num_hidden_layers=2, num_experts=EXPERTS
        ),
        # Layer 0 dense (first_k_dense_replace), a shared expert beside
        # the routed ones, grouped routing.
        "deepseekv3": transformers.DeepseekV3Config(
            **{**COMMON, "num_key_value_heads": 4},
            intermediate_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            n_routed_experts=EXPERTS,
            n_group=2,
            topk_group=2,
            first_k_dense_replace=1,
            n_shared_experts=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
        ),
    }


MODELS_BUILT = list(configs())
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# A ring that holds every expert of the model, and one smaller than one
# layer's experts (so every layer evicts).
RINGS = {"whole ring": 64, "2-slot ring": 2}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[tuple[str, str], object]:
    """Each model, random weights (seeded), saved in float32 and in
    bfloat16 with ``save_pretrained``."""
    saved = {}
    for i, (name, config) in enumerate(configs().items()):
        torch.manual_seed(1000 + i)
        model = transformers.AutoModelForCausalLM.from_config(config)
        for dtype_name, dtype in DTYPES.items():
            path = tmp_path_factory.mktemp(f"{name}-{dtype_name}")
            model.to(dtype).save_pretrained(path)
            saved[(name, dtype_name)] = path
        del model
    return saved


@pytest.fixture(scope="session")
def prompt():
    generator = torch.Generator().manual_seed(7)
    return torch.randint(3, VOCAB, (1, PROMPT_TOKENS), generator=generator)


_REFERENCE: dict = {}


def eager_logits(path, prompt, dtype=None, implementation="eager"):
    """The logits of the checkpoint loaded in memory by transformers."""
    key = (str(path), dtype, implementation)
    if key not in _REFERENCE:
        kwargs = {} if dtype is None else {"dtype": dtype}
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, experts_implementation=implementation, **kwargs
        )
        with torch.no_grad():
            _REFERENCE[key] = model(prompt).logits
    return _REFERENCE[key]


def routed_parameters(model) -> dict[str, torch.Tensor]:
    names = st.streamed_experts(model)
    return {
        f"{name}.{pname}": param
        for name, module in model.named_modules()
        if name in names
        for pname, param in module.named_parameters(recurse=False)
    }


@pytest.mark.parametrize("ring", RINGS)
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("name", MODELS_BUILT)
def test_logits_equal_eager(checkpoints, prompt, name, dtype_name, ring):
    path = checkpoints[(name, dtype_name)]
    want = eager_logits(path, prompt)
    slots = RINGS[ring]
    # strict: a view of the ring kept past its claim would raise.
    model = st.from_pretrained(path, ring_slots=slots, strict=True, **QUIET)
    streamer = model.smoe_streamer
    try:
        params = routed_parameters(model)
        assert params and all(p.device.type == "meta" for p in params.values()), "experts never loaded"
        assert set(st.streamed_experts(model).values()) == {
            int(layer) for layer in streamer.metadata["layer_blob_layouts"]
        }
        with torch.no_grad():
            got = model(prompt).logits
        assert got.dtype == want.dtype == DTYPES[dtype_name]
        assert torch.equal(got, want), f"max |difference| {(got.float() - want.float()).abs().max().item()}"
        stats = streamer.stats()
        assert stats["slots_held"] == 0
        if slots == RINGS["whole ring"]:
            assert stats["evictions"] == 0
        else:
            assert stats["claims"] > slots and stats["evictions"] >= stats["claims"] - slots
    finally:
        streamer.close()


@pytest.mark.parametrize("name", MODELS_BUILT)
def test_the_comparison_can_tell(checkpoints, prompt, name):
    """In bfloat16 another experts implementation's logits differ from
    eager's (it sums the 4 experts of a token in another order and
    precision): equality above is evidence, not luck."""
    path = checkpoints[(name, "bfloat16")]
    eager = eager_logits(path, prompt)
    assert not torch.equal(eager, eager_logits(path, prompt, implementation="batched_mm"))


def test_a_cast_on_load_is_eager_s_cast(checkpoints, prompt):
    """A float32 checkpoint loaded as bfloat16: each expert is cast as
    transformers casts it."""
    path = checkpoints[("qwen3moe", "float32")]
    want = eager_logits(path, prompt, dtype=torch.bfloat16)
    model = st.from_pretrained(path, ring_slots=3, dtype=torch.bfloat16, **QUIET)
    with torch.no_grad():
        got = model(prompt).logits
    model.smoe_streamer.close()
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_generate_is_eager_s(checkpoints, prompt):
    path = checkpoints[("deepseekv3", "bfloat16")]
    eager = transformers.AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager")
    model = st.from_pretrained(path, ring_slots=3, **QUIET)
    want = eager.generate(prompt, max_new_tokens=6, do_sample=False)
    got = model.generate(prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, want)
    assert model.smoe_streamer.stats()["slots_held"] == 0
    model.smoe_streamer.close()


def test_a_full_ring_waits_for_other_threads_claims(checkpoints, prompt):
    """Threads that share a model share its ring: a forward pass that finds
    every slot held by another thread's claim waits for it instead of
    raising RingFull. Here the main thread holds the one slot while another
    thread runs the model; the pass ends once the slot is released."""
    import threading
    import time

    path = checkpoints[("qwen3moe", "float32")]
    model = st.from_pretrained(path, ring_slots=1, **QUIET)
    streamer = model.smoe_streamer
    result: dict[str, object] = {}

    def run() -> None:
        try:
            with torch.no_grad():
                result["logits"] = model(prompt).logits
        except BaseException as e:  # reported below, in the test's thread
            result["error"] = e

    lease = streamer.claim(0, 0)
    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)
    assert worker.is_alive() and not result, result
    lease.release()
    worker.join(30)
    assert not worker.is_alive()
    assert "error" not in result, result.get("error")
    assert torch.equal(result["logits"], eager_logits(path, prompt))
    assert streamer.stats()["slots_held"] == 0
    streamer.close()


@pytest.mark.parametrize("name", ["gptoss-bf16", "qwen2moe-f32-sharded"])
def test_repository_fixtures(prompt, name):
    """Two more layouts from the repository's fixtures: gpt-oss (stacked
    checkpoint tensors, transposed and interleaved gate_up, biases) and a
    sharded Qwen2-MoE (a shared expert with its own gate)."""
    path = MODELS / name
    model = st.from_pretrained(path, ring_slots=2, strict=True, **QUIET)
    with torch.no_grad():
        got = model(prompt).logits
    model.smoe_streamer.close()
    assert torch.equal(got, eager_logits(path, prompt))


def test_streamer_settings_and_transformers_keywords_are_split(checkpoints):
    path = checkpoints[("olmoe", "float32")]
    model = st.from_pretrained(
        path, ring_slots=5, workers=1, prewarm=False, freq_path="", attn_implementation="eager"
    )
    assert model.smoe_streamer.stats()["ring_slots"] == 5
    assert model.smoe_streamer.stats()["workers"] == 1
    assert model.config._attn_implementation == "eager"
    assert model.config._experts_implementation == st.IMPLEMENTATION
    model.smoe_streamer.close()
    with pytest.raises(smoe.ArgumentError, match="experts_implementation='smoe'"):
        st.from_pretrained(path, experts_implementation="eager", **QUIET)


def test_a_model_without_the_experts_interface_is_refused(tmp_path):
    config = transformers.JetMoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        kv_channels=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        bos_token_id=0,
        eos_token_id=1,
    )
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(smoe.Unsupported, match="JetMoeForCausalLM"):
        st.from_pretrained(tmp_path, **QUIET)


def test_a_path_that_is_not_a_checkpoint_directory_is_refused(tmp_path):
    with pytest.raises(smoe.ArgumentError, match="safetensors checkpoint directory"):
        st.from_pretrained(MODELS / "mixtral-q8_0.gguf", **QUIET)
    # A vault packed from a GGUF is a directory, and still not a checkpoint:
    # said before any config.json is looked for.
    vault = tmp_path / "vault"
    smoe.pack(MODELS / "mixtral-q8_0.gguf", vault)
    with pytest.raises(smoe.ArgumentError, match="is a vault packed from a GGUF"):
        st.from_pretrained(vault, **QUIET)


def test_the_implementation_is_registered_and_refuses_other_models(checkpoints, prompt):
    """``experts_implementation="smoe"`` on a model smoe did not load
    says so instead of computing with meta tensors."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert st.IMPLEMENTATION in ALL_EXPERTS_FUNCTIONS
    path = checkpoints[("mixtral", "float32")]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, experts_implementation="smoe")
    with pytest.raises(RuntimeError, match="smoe.transformers.from_pretrained"):
        model(prompt)
    del model
    gc.collect()


def test_transformers_4_is_refused():
    code = (
        "import transformers; transformers.__version__ = '4.57.1'\n"
        "try:\n    import smoe.transformers\nexcept ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "needs transformers 5 or newer" in done.stdout, done.stderr
    assert "this is transformers 4.57.1" in done.stdout


def test_a_packed_vault_alone_is_the_model(checkpoints, prompt, tmp_path):
    """``smoe.pack`` of a checkpoint, then the checkpoint moved away: the
    vault (experts.smoe, its scout, the configs it copied) loads and gives
    eager's logits."""
    path = checkpoints[("qwen3moe", "bfloat16")]
    want = eager_logits(path, prompt)
    checkpoint = tmp_path / "checkpoint"
    import shutil

    shutil.copytree(path, checkpoint)
    vault = tmp_path / "vault"
    smoe.pack(checkpoint, vault)
    shutil.rmtree(checkpoint)
    model = st.from_pretrained(vault, ring_slots=3, strict=True, **QUIET)
    try:
        assert model.smoe_streamer.metadata["format"] == "smoe-vault"
        with torch.no_grad():
            got = model(prompt).logits
        assert torch.equal(got, want)
    finally:
        model.smoe_streamer.close()
    # Without config.json (a vault packed before the packer copied it),
    # config= supplies it; without either, the refusal says so.
    config = transformers.AutoConfig.from_pretrained(vault)
    (vault / "config.json").unlink()
    with pytest.raises(smoe.ArgumentError, match="pass config="):
        st.from_pretrained(vault, **QUIET)
    model = st.from_pretrained(vault, config=config, ring_slots=3, **QUIET)
    with torch.no_grad():
        assert torch.equal(model(prompt).logits, want)
    model.smoe_streamer.close()


def test_a_multi_token_prediction_layer_is_left_to_the_streamer(checkpoints, prompt, tmp_path):
    """DeepSeek-V3's and GLM-4.5's checkpoints keep a multi-token
    prediction layer after the decoder's (``num_nextn_predict_layers``),
    with routed experts of its own, which transformers does not build: the
    streamer counts it, and the model loads and gives eager's logits."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    path = checkpoints[("deepseekv3", "bfloat16")]
    want = eager_logits(path, prompt)
    checkpoint = tmp_path / "mtp"
    shutil.copytree(path, checkpoint)
    weights = load_file(checkpoint / "model.safetensors")
    last = "model.layers.2.mlp.experts."
    extra = {
        "model.layers.3." + key.removeprefix("model.layers.2."): tensor.clone()
        for key, tensor in weights.items()
        if key.startswith(last)
    }
    assert extra, "the checkpoint's expert tensors are named otherwise; update this test"
    save_file({**weights, **extra}, checkpoint / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((checkpoint / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (checkpoint / "config.json").write_text(json.dumps(config))
    model = st.from_pretrained(checkpoint, ring_slots=3, strict=True, **QUIET)
    try:
        streamer = model.smoe_streamer
        assert sorted(streamer.metadata["layer_blob_layouts"], key=int) == ["1", "2", "3"]
        assert sorted(st.streamed_experts(model).values()) == [1, 2]
        with torch.no_grad():
            assert torch.equal(model(prompt).logits, want)
    finally:
        model.smoe_streamer.close()


def test_a_model_with_fewer_layers_than_the_checkpoint_is_refused(checkpoints):
    """Layers past the model's are left to the streamer only when the
    checkpoint's own config.json names them prediction layers: a model
    built with fewer decoder layers than the checkpoint has (its config
    still says one prediction layer, transformers' default) is refused,
    naming the first layer left out."""
    path = checkpoints[("deepseekv3", "bfloat16")]
    with pytest.raises(smoe.FormatError, match="the checkpoint's layer 2 has routed experts"):
        st.from_pretrained(path, num_hidden_layers=2, **QUIET)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_dtype_auto_is_the_checkpoint_s(checkpoints, prompt, dtype_name):
    """Issue 47, item 4: ``dtype="auto"``, transformers' own default, failed
    with ``AttributeError: module 'torch' has no attribute 'auto'``. It
    loads the checkpoint's dtype, as transformers does."""
    path = checkpoints[("qwen3moe", dtype_name)]
    want = eager_logits(path, prompt)
    model = st.from_pretrained(path, ring_slots=64, dtype="auto", **QUIET)
    try:
        with torch.no_grad():
            got = model(prompt).logits
    finally:
        model.smoe_streamer.close()
    assert got.dtype == want.dtype == DTYPES[dtype_name]
    assert torch.equal(got, want)


# ---------------------------------------------------------------- lookahead

DECODE_STEPS = 6
_EAGER_DECODE: dict = {}


def decode(model, prompt):
    """Greedy decoding: the tokens and every step's logits."""
    with torch.no_grad():
        out = model.generate(
            prompt,
            max_new_tokens=DECODE_STEPS,
            min_new_tokens=DECODE_STEPS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences, out.logits


def eager_decode(path, prompt):
    if str(path) not in _EAGER_DECODE:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager")
        _EAGER_DECODE[str(path)] = decode(model, prompt)
    return _EAGER_DECODE[str(path)]


@pytest.mark.parametrize("lookahead", [0, 1, 2])
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("name", MODELS_BUILT)
def test_lookahead_leaves_the_logits_eager_s(checkpoints, prompt, name, dtype_name, lookahead):
    """Decoding with the lookahead on (1 and 2 layers ahead) and off: every
    step's logits are eager's bit for bit; the guesses only choose reads.
    A decode step routes 4 of 8 experts (half: the lookahead guesses), the
    prompt more (it does not). The counters say whether bets were made."""
    path = checkpoints[(name, dtype_name)]
    want_tokens, want_logits = eager_decode(path, prompt)
    # Fewer slots than the model's experts (16 or 24), more than a layer's
    # routed set and its bets.
    model = st.from_pretrained(path, ring_slots=12, strict=True, lookahead=lookahead, **QUIET)
    streamer = model.smoe_streamer
    try:
        tokens, logits = decode(model, prompt)
        stats = streamer.stats()
    finally:
        streamer.close()
    assert torch.equal(tokens, want_tokens)
    assert len(logits) == len(want_logits) == DECODE_STEPS
    for step, (got, want) in enumerate(zip(logits, want_logits)):
        assert torch.equal(got, want), f"step {step}: max |difference| {(got - want).abs().max().item()}"
    assert stats["slots_held"] == 0
    if lookahead:
        assert stats["prediction_routed"] > 0 and stats["prediction_hits"] > 0, stats
        assert stats["prediction_hits"] <= stats["prediction_routed"]
    else:
        assert stats["prediction_routed"] == stats["prediction_hits"] == stats["bytes_speculative"] == 0, stats


def test_lookahead_is_off_by_default(checkpoints, prompt):
    model = st.from_pretrained(checkpoints[("qwen3moe", "bfloat16")], ring_slots=12, **QUIET)
    try:
        decode(model, prompt)
        stats = model.smoe_streamer.stats()
    finally:
        model.smoe_streamer.close()
    assert stats["prediction_routed"] == stats["bytes_speculative"] == 0, stats


@pytest.fixture(scope="session")
def constant_residual(tmp_path_factory):
    """A Qwen3-MoE of 4 layers whose attention and experts add nothing to
    the residual stream (``o_proj`` and every expert's ``down_proj`` are
    zero): each layer's FFN norm sees the same state, so the lookahead's
    guess of layer L+1 from layer L's state is exactly L+1's routing."""
    config = transformers.Qwen3MoeConfig(
        **COMMON,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_experts=EXPERTS,
        head_dim=16,
    )
    torch.manual_seed(2024)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("self_attn.o_proj.weight") or name.endswith("mlp.experts.down_proj"):
                param.zero_()
    path = tmp_path_factory.mktemp("constant-residual")
    model.save_pretrained(path)
    return path


def test_the_recall_is_exact_when_the_routing_is_predictable(constant_residual, prompt):
    """Each decode step bets on layers 1, 2, 3 (from layers 0, 1, 2) with
    each token's top-4, which is exactly what their routers then pick: the
    recall is 100 %, and the counters count every routed expert of every
    guessed layer of every decode step, no more."""
    model = st.from_pretrained(constant_residual, ring_slots=12, lookahead=1, **QUIET)
    streamer = model.smoe_streamer
    try:
        tokens, _ = decode(model, prompt)
        stats = streamer.stats()
    finally:
        streamer.close()
    want_tokens, _ = eager_decode(constant_residual, prompt)
    assert torch.equal(tokens, want_tokens)
    # generate's first forward is the prompt (no bets: it routes more than
    # half of each layer's experts); each later one is a decode step.
    routed = (DECODE_STEPS - 1) * 3 * TOP_K
    assert stats["prediction_routed"] == routed, stats
    assert stats["prediction_hits"] == routed, stats
    assert stats["speculative_dropped"] == 0, stats


def test_lookahead_is_off_when_the_ring_holds_every_expert(checkpoints, prompt):
    model = st.from_pretrained(checkpoints[("qwen3moe", "bfloat16")], ring_slots=64, lookahead=1, **QUIET)
    try:
        decode(model, prompt)
        stats = model.smoe_streamer.stats()
    finally:
        model.smoe_streamer.close()
    assert stats["prediction_routed"] == stats["bytes_speculative"] == 0, stats


def test_a_wider_lookahead_bets_on_more_experts(constant_residual, prompt):
    """``lookahead_width``: each token's 6 best experts instead of the
    router's 4: every routed expert is still named (recall 100 %), and the
    2 more a layer and step are bets the real sets do not name (dropped
    before they are read, or read and never claimed)."""
    model = st.from_pretrained(constant_residual, ring_slots=12, lookahead=1, lookahead_width=6, **QUIET)
    streamer = model.smoe_streamer
    try:
        decode(model, prompt)
        stats = streamer.stats()
    finally:
        streamer.close()
    routed = (DECODE_STEPS - 1) * 3 * TOP_K
    assert stats["prediction_routed"] == stats["prediction_hits"] == routed, stats
    assert stats["speculative_dropped"] > 0 or stats["bytes_speculative_unclaimed"] > 0, stats


@pytest.mark.parametrize(
    "keywords, error, words",
    [
        ({"lookahead": -1}, smoe.ArgumentError, "lookahead must be at least 0, not -1"),
        ({"lookahead": True}, TypeError, "lookahead must be an int, not bool"),
        ({"lookahead": 1.5}, TypeError, "lookahead must be an int, not float"),
        ({"lookahead_width": 0}, smoe.ArgumentError, "lookahead_width must be at least 1, not 0"),
        ({"lookahead_width": "4"}, TypeError, "lookahead_width must be an int, not str"),
    ],
)
def test_lookahead_settings_are_checked(checkpoints, keywords, error, words):
    with pytest.raises(error, match=words):
        st.from_pretrained(checkpoints[("olmoe", "float32")], **keywords, **QUIET)


def test_a_forward_pass_is_the_engine_s_busy_time(checkpoints, prompt):
    """Each forward pass calls prewarm_pause(True) at its start and
    prewarm_pause(False) at its end: busy_ns grows during passes only, and
    an exception in a pass still ends its busy time."""
    import time

    model = st.from_pretrained(checkpoints[("mixtral", "float32")], ring_slots=6, **QUIET)
    streamer = model.smoe_streamer
    try:
        assert streamer.stats()["busy_ns"] == 0
        with torch.no_grad():
            model(prompt)
        busy = streamer.stats()["busy_ns"]
        assert busy > 0
        time.sleep(0.05)
        assert streamer.stats()["busy_ns"] == busy, "idle between passes"
        with pytest.raises(Exception):
            with torch.no_grad():
                model(torch.tensor([[VOCAB + 5]]))  # a token id past the embedding
        after = streamer.stats()["busy_ns"]
        time.sleep(0.05)
        assert streamer.stats()["busy_ns"] == after, "a failed pass ends its busy time too"
    finally:
        streamer.close()
