"""LLaDA2 MoE: forward logits and every router decision match the HF reference on llada2-tiny
(block-causal, fp32, CPU); what is not implemented (LLaDA2.2, other routers) is refused."""

import json
import shutil

import pytest
import torch
from tests.helpers import FIXTURES
from safetensors.torch import load_file, save_file

from dlm_backend import LLM
from dlm_backend.engine.checkpoint.load import open_checkpoint
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context
from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.models.llada2 import LLaDA2MoeModelLM, LLaDA2MoeSparseMoeBlock
from dlm_backend.engine.models.registry import supported_architectures
from dlm_backend.engine.checkpoint.weights import load_model
from dlm_backend.errors import CheckpointError, DLMError

FIXTURE = FIXTURES / "parity-block" / "llada2-tiny"
CASES = json.loads((FIXTURE / "cases.json").read_text())
EXPECTED = load_file(str(FIXTURE / "expected_logits.safetensors"))
L = CASES["forward"]["block_length"]            # 8: the fixture's forward block, not the default 32
MASK = {"mask_token_id": CASES["mask_token_id"]}
TOL = dict(atol=1e-4, rtol=1e-4)
CPU, FP32 = torch.device("cpu"), torch.float32


@pytest.fixture(scope="module")
def model():
    return load_model(FIXTURE, {**read_config(FIXTURE), **MASK}, CPU, FP32)


def block_forward(model, rows: list[torch.Tensor]) -> torch.Tensor:
    """Logits of each sequence in ``rows`` (packed, each at positions 0..), block-causal with L."""
    T = len(rows[0])
    segments = [Segment(slice(i * T, (i + 1) * T), 0, block_size=L) for i in range(len(rows))]
    with torch.no_grad(), forward_context(ForwardContext(PackedAttention(segments))):
        hidden = model(torch.cat(rows), torch.arange(T).repeat(len(rows)))
        return model.compute_logits(hidden).view(len(rows), T, -1)


def test_block_mask_is_the_references():
    T = CASES["forward"]["seq_len"]
    mask = Segment(slice(0, T), 0, block_size=L).mask(T, 0, "cpu")
    assert torch.equal(mask, EXPECTED["block_mask"].bool())


def test_forward_logits_match_reference(model):
    logits = block_forward(model, [EXPECTED["input_ids"][0]])
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, EXPECTED["logits"], **TOL)


def test_batch_of_two_matches_reference(model):
    logits = block_forward(model, list(EXPECTED["batch_input_ids"]))
    torch.testing.assert_close(logits, EXPECTED["batch_logits"], **TOL)


def _by_expert(idx: torch.Tensor, weight: torch.Tensor):
    """Each token's chosen experts in index order, with their weights aligned (a set per token)."""
    order = idx.argsort(dim=-1)
    return idx.gather(-1, order), weight.gather(-1, order)


def test_router_decisions_match_reference(model):
    seen = {}
    hooks = [layer.mlp.gate.register_forward_hook(lambda mod, inp, out, i=i: seen.__setitem__(i, out))
             for i, layer in enumerate(model.model.layers) if isinstance(layer.mlp, LLaDA2MoeSparseMoeBlock)]
    try:
        block_forward(model, [EXPECTED["input_ids"][0]])
    finally:
        for h in hooks:
            h.remove()
    moe_layers = sorted({int(k.split(".")[1]) for k in EXPECTED if k.startswith("router.")})
    assert sorted(seen) == moe_layers == [1, 2]         # first_k_dense_replace = 1
    for i in moe_layers:
        idx, weight, logits = seen[i]
        torch.testing.assert_close(logits, EXPECTED[f"router.{i}.logits"], atol=1e-5, rtol=1e-5)
        got_idx, got_w = _by_expert(idx, weight)
        want_idx, want_w = _by_expert(EXPECTED[f"router.{i}.topk_idx"], EXPECTED[f"router.{i}.topk_weight"])
        assert torch.equal(got_idx, want_idx), f"layer {i}: another expert set"
        torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=1e-5)
        assert torch.equal(idx, EXPECTED[f"router.{i}.topk_idx"])     # also the same order (by biased score)


def test_engine_facts(model):
    a = model.args
    assert (a.block_size, a.rotary_dim, a.head_dim, a.mask_token_id) == (32, 8, 16, CASES["mask_token_id"])
    assert model.rotary.cos.shape[-1] == 8                              # partial rotary: half the head


def test_mask_id_comes_from_overrides_or_tokenizer():
    assert LLaDA2MoeModelLM.args_from_config(read_config(FIXTURE)).mask_token_id is None
    ckpt = open_checkpoint(EngineConfig(str(FIXTURE), device="cpu", dtype="float32", config_overrides=MASK))
    assert ckpt.tokens.mask_id == CASES["mask_token_id"] and ckpt.tokens.eos_ids == (CASES["eos_token_id"],)
    # No tokenizer here and no override: the engine says where to put the mask id.
    with pytest.raises(CheckpointError, match="mask_token_id"):
        open_checkpoint(EngineConfig(str(FIXTURE), device="cpu", dtype="float32"))


def _copy(tmp_path, tensors: dict | None = None, drop: tuple = (), **config):
    """The fixture in ``tmp_path``: config.json without ``drop`` and with ``config``; other tensors if given."""
    for name in ("generation_config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    c = {k: v for k, v in json.loads((FIXTURE / "config.json").read_text()).items() if k not in drop}
    (tmp_path / "config.json").write_text(json.dumps({**c, **config}))
    if tensors is not None:
        save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_llada22_is_refused(tmp_path):
    folder = _copy(tmp_path, delete_token_id=156896, split_token_id=156897, **MASK)
    with pytest.raises(DLMError, match=r"LLaDA2\.2.*not supported") as err:
        LLM(str(folder), dtype="float32")
    assert "delete_token_id" in str(err.value) and "split_token_id" in str(err.value)


@pytest.mark.parametrize("field,value,match", [
    ("norm_head", True, "norm_head"),
    ("use_sliding_window", True, "sliding-window"),
    ("score_function", "softmax", "score_function"),
    ("router_dtype", "bf16", "router_dtype"),
    ("norm_topk_prob", False, "norm_topk_prob"),
    ("moe_router_enable_expert_bias", False, "expert_bias"),
    ("hidden_act", "gelu", "hidden_act"),
    ("rotary_dim", 16, "rotary_dim"),                   # disagrees with head_dim * partial_rotary_factor = 8
    ("n_group", 3, "n_group"),                          # 16 experts do not split into 3 groups
    ("n_group", 16, "n_group"),                         # groups of one: no top-2 group score
    ("num_experts_per_tok", 9, "num_experts_per_tok"),  # more than topk_group (2) groups of 4 hold
    ("block_routing_pool", 48, "LLaDA2.2"),
    ("rope_scaling", {"type": "yarn", "factor": 2.0}, "rope_scaling"),
    ("num_experts", None, "num_experts"),
])
def test_unsupported_configs_are_refused(field, value, match):
    c = {**read_config(FIXTURE), field: value}
    with pytest.raises(CheckpointError, match=match):
        LLaDA2MoeModelLM.from_config(c)


def test_biases_are_loaded_when_the_config_asks(tmp_path):
    # use_bias defaults to true in the reference config class: a config that leaves it out needs
    # attention.dense.bias in every layer, and the loader says so instead of running without it.
    folder = _copy(tmp_path, drop=("use_bias",), use_qkv_bias=True, **MASK)
    with pytest.raises(CheckpointError, match=r"missing.*attention\.dense\.bias"):
        load_model(folder, read_config(folder), CPU, FP32)
    tensors = load_file(str(FIXTURE / "model.safetensors"))
    for i in range(3):
        tensors[f"model.layers.{i}.attention.dense.bias"] = torch.zeros(64)
        tensors[f"model.layers.{i}.attention.query_key_value.bias"] = torch.zeros(128)
    folder = _copy(tmp_path, tensors, drop=("use_bias",), use_qkv_bias=True, **MASK)
    model = load_model(folder, read_config(folder), CPU, FP32)
    torch.testing.assert_close(block_forward(model, [EXPECTED["input_ids"][0]]), EXPECTED["logits"], **TOL)
    tensors["model.layers.0.attention.query_key_value.bias"] = torch.ones(128)     # and they are used
    model = load_model(_copy(tmp_path, tensors, drop=("use_bias",), use_qkv_bias=True, **MASK),
                       read_config(folder), CPU, FP32)
    assert not torch.allclose(block_forward(model, [EXPECTED["input_ids"][0]]), EXPECTED["logits"], **TOL)


def test_bfloat16_runs_with_an_fp32_router_and_head():
    model = load_model(FIXTURE, {**read_config(FIXTURE), **MASK}, CPU, torch.bfloat16)
    seen = []
    model.model.layers[1].mlp.gate.register_forward_hook(lambda mod, inp, out: seen.append(out))
    logits = block_forward(model, [EXPECTED["input_ids"][0]])
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    idx, weight, router_logits = seen[0]
    assert weight.dtype == router_logits.dtype == torch.float32
    # Weights: normalised unbiased sigmoid scores times routed_scaling_factor (2.5).
    torch.testing.assert_close(weight.sum(-1), torch.full((len(idx),), 2.5))


def test_wrong_shape_is_refused(tmp_path):
    tensors = load_file(str(FIXTURE / "model.safetensors"))
    tensors["model.layers.1.mlp.experts.3.up_proj.weight"] = torch.zeros(31, 64)
    _copy(tmp_path, tensors)
    with pytest.raises(CheckpointError, match=r"wrong shape.*experts\.3\.up_proj\.weight: expected \[32, 64\]"):
        load_model(tmp_path, read_config(tmp_path), CPU, FP32)


def test_missing_expert_is_refused(tmp_path):
    tensors = {k: v for k, v in load_file(str(FIXTURE / "model.safetensors")).items()
               if ".layers.2.mlp.experts.5." not in k}
    _copy(tmp_path, tensors)
    with pytest.raises(CheckpointError, match=r"missing.*model\.layers\.2\.mlp\.experts\.gate_proj\[5\]"):
        load_model(tmp_path, read_config(tmp_path), CPU, FP32)


def test_expert_beyond_num_experts_is_refused(tmp_path):
    tensors = load_file(str(FIXTURE / "model.safetensors"))
    tensors["model.layers.1.mlp.experts.16.down_proj.weight"] = torch.zeros(64, 32)
    _copy(tmp_path, tensors)
    with pytest.raises(CheckpointError, match=r"experts\.16\.down_proj\.weight: expected \[64, 32\] at index < 16"):
        load_model(tmp_path, read_config(tmp_path), CPU, FP32)


def test_listed_by_dlm_models():
    assert supported_architectures()["LLaDA2MoeModelLM"] == "dlm_backend.engine.models.llada2:LLaDA2MoeModelLM"
