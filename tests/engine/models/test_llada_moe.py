"""LLaDA-MoE: llada-moe-tiny's reference runs (LLaDA's generate over the HF modeling_lladamoe.py) come
out of the engine exactly; the router is the reference's; bad config fields are refused by name;
int8 quantizes the experts."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from tests.helpers import PARITY

from dlm_backend import LLM
from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.checkpoint.weights import load_model
from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context
from dlm_backend.engine.models.llada_moe import MASK_ID, LLaDAMoEGate, LLaDAMoEModelLM
from dlm_backend.engine.models.registry import resolve_model_class
from dlm_backend.engine.quant.experts import QuantizedExperts
from dlm_backend.errors import CheckpointError, DLMError
from dlm_backend.parity import check_fixture

FIXTURE = PARITY / "llada-moe-tiny"
CASES = json.loads((FIXTURE / "cases.json").read_text())
EXPECTED = load_file(str(FIXTURE / "expected_logits.safetensors"))
MASK = {"mask_token_id": CASES["mask_token_id"]}
CPU, FP32 = torch.device("cpu"), torch.float32


def _load(quantization=None, **config):
    return load_model(FIXTURE, {**read_config(FIXTURE), **MASK, **config}, CPU, FP32, quantization=quantization)


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    T = len(ids)
    with torch.no_grad(), forward_context(ForwardContext(PackedAttention([Segment(slice(0, T), 0)]))):
        return model.compute_logits(model(ids, torch.arange(T)))


def test_the_architecture_resolves_and_loads():
    assert resolve_model_class(read_config(FIXTURE)) is LLaDAMoEModelLM
    model = _load()
    a = model.args
    assert (a.num_layers, a.head_dim, a.num_kv_heads, a.mask_token_id, a.rotary_dim) == (2, 16, 2, 300, None)
    assert model.schedule == "full" and model.logits_shift == 0
    assert model.model.layers[0].mlp.experts.gate_proj.shape == (8, 32, 64)
    assert model.model.layers[1].shared_expert.down_proj.weight.shape == (64, 48)


def test_every_case_and_the_forward_are_exact():
    results = check_fixture(FIXTURE)
    assert [r.line() for r in results if not r.ok] == []
    assert len(results) == len(CASES["cases"]) + 1              # + the forward logits


def test_router_weights_are_the_raw_softmax_top_k():
    """The reference hard-codes norm_topk_prob = False: the chosen probabilities are not renormalised."""
    model, seen = _load(), {}
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, out, n=n: seen.__setitem__(n, out))
             for n, layer in enumerate(model.model.layers)]
    try:
        torch.testing.assert_close(_logits(model, EXPECTED["input_ids"][0]), EXPECTED["logits"][0],
                                   atol=1e-4, rtol=1e-4)
    finally:
        for h in hooks:
            h.remove()
    for idx, weight, logits in seen.values():
        probs = torch.softmax(logits.float(), dim=-1)
        want_w, want_idx = probs.topk(2, dim=-1)
        assert torch.equal(idx, want_idx) and torch.equal(weight, want_w)
        assert (weight.sum(-1) < 1).all()


def test_expert_bias_moves_the_choice_and_is_the_weight():
    """The reference's lines: ``routing_weights = softmax(logits, dim=1, dtype=float); += expert_bias;
    topk`` (the biased values are the weights)."""
    g = torch.Generator().manual_seed(0)
    gate = LLaDAMoEGate(LLaDAMoEModelLM.args_from_config({**read_config(FIXTURE), **MASK}),
                        LLaDAMoEModelLM.moe_from_config(read_config(FIXTURE), 2))
    gate.weight.data = torch.randn(8, 64, generator=g)
    x, bias = torch.randn(5, 64, generator=g), torch.tensor([0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.3])
    idx, weight, logits = gate(x, bias)
    want = torch.softmax(logits, dim=1, dtype=torch.float) + bias
    want_w, want_idx = torch.topk(want, 2, dim=-1)
    assert torch.equal(idx, want_idx) and torch.equal(weight, want_w)
    assert (idx == 2).any(-1).all()                              # +0.5 puts expert 2 in every top 2


def test_expert_bias_loads_from_the_checkpoint(tmp_path):
    folder = _copy(tmp_path, moe_router_enable_expert_bias=True)
    tensors = load_file(str(FIXTURE / "model.safetensors"))
    tensors.update({f"model.layers.{i}.mlp.expert_bias": torch.zeros(8) for i in range(2)})
    save_file(tensors, str(folder / "model.safetensors"))
    model = load_model(folder, {**read_config(folder), **MASK}, CPU, FP32)
    assert torch.equal(model.model.layers[1].mlp.expert_bias, torch.zeros(8))
    # a zero bias routes as none: the fixture's logits again
    torch.testing.assert_close(_logits(model, EXPECTED["input_ids"][0]), EXPECTED["logits"][0], atol=1e-4, rtol=1e-4)


def _copy(tmp_path, drop: tuple = (), **config):
    for name in ("generation_config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    c = {k: v for k, v in read_config(FIXTURE).items() if k not in drop}
    (tmp_path / "config.json").write_text(json.dumps({**c, **config}))
    return tmp_path


@pytest.mark.parametrize("field,value", [
    ("moe_layer_freq", [1]),                    # shorter than num_hidden_layers
    ("moe_layer_freq", "all"),
    ("moe_layer_freq", None),                   # the config class's [] fails the reference's indexing
    ("num_experts", "8"),
    ("num_experts_per_tok", 9),                 # more than the 8 experts
    ("expert_intermediate_size", -1),           # the config class's default
    ("shared_expert_intermediate_size", "48"),
    ("hidden_act", "gelu"),
    ("partial_rotary_factor", -1),              # the config class's default: nothing would rotate
    ("partial_rotary_factor", 0.05),            # int(16 * 0.05) = 0 dims
    ("rope_theta", None),
    ("head_dim", 32),                           # the attention uses hidden_size // heads = 16
    ("rope_scaling", {"type": "yarn", "factor": 2.0}),
    ("qk_layernorm", "yes"),
    ("clip_qkv", "8"),
    ("mask_token_id", 320),                     # outside the 320-token vocabulary
])
def test_a_malformed_field_is_refused_by_name(field, value):
    c = {**read_config(FIXTURE), **MASK, field: value}
    with pytest.raises(CheckpointError, match="rope_scaling" if field == "rope_scaling" else field):
        LLaDAMoEModelLM.from_config(c)


def test_a_missing_field_is_named_through_the_engine(tmp_path):
    folder = _copy(tmp_path, drop=("shared_expert_intermediate_size",))   # the class default -1 cannot build
    with pytest.raises(DLMError, match="shared_expert_intermediate_size"):
        LLM(str(folder), dtype="float32", config_overrides=MASK)


def test_the_mask_id_defaults_to_the_reference_generates():
    c = {**read_config(FIXTURE), "vocab_size": 157184}
    assert LLaDAMoEModelLM.args_from_config(c).mask_token_id == MASK_ID == 156895
    with pytest.raises(CheckpointError, match="mask_token_id"):          # not in a 320-token vocabulary
        LLaDAMoEModelLM.args_from_config(read_config(FIXTURE))


def test_null_shared_expert_builds_none():
    c = {**read_config(FIXTURE), **MASK, "shared_expert_intermediate_size": None, "moe_layer_freq": [0, 1]}
    model = LLaDAMoEModelLM.from_config(c)
    assert model.model.layers[1].shared_expert is None
    assert model.model.layers[0].mlp.down_proj.weight.shape == (64, 128)   # dense_intermediate_size


def test_int8_quantizes_the_experts_and_keeps_the_router_float():
    model, full = _load("int8"), _load()
    for layer in model.model.layers:
        assert all(isinstance(getattr(layer.mlp.experts, p), QuantizedExperts)
                   for p in ("gate_proj", "up_proj", "down_proj"))
        assert layer.mlp.gate.weight.dtype == torch.float32
    ids = EXPECTED["input_ids"][0]
    got, want = _logits(model, ids), _logits(full, ids)
    assert torch.isfinite(got).all()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
