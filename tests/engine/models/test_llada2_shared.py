"""LLaDA2 with more than one shared expert (issue 53): the reference modeling code builds them as one
fused MLP of ``moe_intermediate_size * num_shared_experts`` and never reads
``moe_shared_expert_intermediate_size``; the engine builds the same, loads such a checkpoint and
matches the reference's logits and router decisions on it (llada2-shared-tiny, made by
recipes/fixtures/llada2_shared.py from the reference itself)."""

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tests.helpers import FIXTURES

from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.checkpoint.weights import load_model
from dlm_backend.parity.forward import packed_logits
from dlm_backend.engine.models.llada2 import LLaDA2MoeModelLM, LLaDA2MoeSparseMoeBlock
from dlm_backend.errors import CheckpointError
from dlm_backend.parity import check_fixture

FIXTURE = FIXTURES / "parity-block" / "llada2-shared-tiny"
ONE_SHARED = FIXTURES / "parity-block" / "llada2-tiny"
CASES = json.loads((FIXTURE / "cases.json").read_text())
EXPECTED = load_file(str(FIXTURE / "expected_logits.safetensors"))
L = CASES["forward"]["block_length"]
MASK = {"mask_token_id": CASES["mask_token_id"]}
TOL = dict(atol=1e-4, rtol=1e-4)
CPU, FP32 = torch.device("cpu"), torch.float32
SHARED = "model.layers.1.mlp.shared_experts."


@pytest.fixture(scope="module")
def model():
    return load_model(FIXTURE, {**read_config(FIXTURE), **MASK}, CPU, FP32)


def block_forward(model, rows) -> torch.Tensor:
    """Logits of each row (each at positions 0..), block-causal with L: dlm parity's own forward."""
    return packed_logits(model, torch.stack(list(rows)), L)


def test_the_fixture_holds_the_references_shapes():
    """Two shared experts of the routed width 32, and moe_shared_expert_intermediate_size 48: the
    reference saved [32 * 2, 64], not SGLang's [48 * 2, 64]."""
    config = read_config(FIXTURE)
    assert (config["num_shared_experts"], config["moe_intermediate_size"],
            config["moe_shared_expert_intermediate_size"]) == (2, 32, 48)
    with safe_open(str(FIXTURE / "model.safetensors"), "pt") as f:
        for i in (1, 2):
            p = f"model.layers.{i}.mlp.shared_experts."
            assert f.get_slice(p + "gate_proj.weight").get_shape() == [64, 64]
            assert f.get_slice(p + "up_proj.weight").get_shape() == [64, 64]
            assert f.get_slice(p + "down_proj.weight").get_shape() == [64, 64]
    assert CASES["shared_experts"]["gate_proj_shape"] == [64, 64]


@pytest.mark.parametrize("fields,width", [
    ({}, 32),                                                               # llada2-tiny: one shared expert
    ({"num_shared_experts": 2}, 64),
    ({"num_shared_experts": 2, "moe_shared_expert_intermediate_size": 48}, 64),    # the field is not read
    ({"num_shared_experts": 2, "moe_shared_expert_intermediate_size": 64}, 64),    # nor as a total width
    ({"num_shared_experts": 2, "moe_shared_expert_intermediate_size": None}, 64),
    ({"num_shared_experts": 3, "moe_shared_expert_intermediate_size": "x"}, 96),
    ({"num_shared_experts": 0}, 0),                 # the reference's width-0 MLP adds nothing
    ({"num_shared_experts": None}, 0),              # the reference builds none
])
def test_shared_width_is_the_references(fields, width):
    config = {**read_config(ONE_SHARED), **fields}
    assert LLaDA2MoeModelLM.moe_from_config(config).shared_intermediate_size == width
    with torch.device("meta"):
        built = LLaDA2MoeModelLM.from_config(config)
    block = built.model.layers[1].mlp
    assert isinstance(block, LLaDA2MoeSparseMoeBlock)
    if width:
        assert tuple(block.shared_experts.gate_proj.weight.shape) == (width, 64)
        assert tuple(block.shared_experts.down_proj.weight.shape) == (64, width)
    else:
        assert block.shared_experts is None


def test_no_num_shared_experts_is_the_config_class_default_of_none():
    config = {k: v for k, v in read_config(ONE_SHARED).items() if k != "num_shared_experts"}
    assert LLaDA2MoeModelLM.moe_from_config(config).shared_intermediate_size == 0


def test_a_shared_width_past_the_limit_is_refused():
    config = {**read_config(ONE_SHARED), "moe_intermediate_size": 64, "num_shared_experts": 4096}
    with pytest.raises(CheckpointError, match=r"num_shared_experts \(4096\) \* moe_intermediate_size \(64\)"):
        LLaDA2MoeModelLM.moe_from_config(config)


def test_loads_and_matches_the_reference(model):
    assert tuple(model.model.layers[1].mlp.shared_experts.gate_proj.weight.shape) == (64, 64)
    logits = block_forward(model, [EXPECTED["input_ids"][0]])
    torch.testing.assert_close(logits, EXPECTED["logits"], **TOL)
    torch.testing.assert_close(block_forward(model, list(EXPECTED["batch_input_ids"])), EXPECTED["batch_logits"],
                               **TOL)


def test_router_decisions_match_the_reference(model):
    seen = {}
    hooks = [layer.mlp.gate.register_forward_hook(lambda mod, inp, out, i=i: seen.__setitem__(i, out))
             for i, layer in enumerate(model.model.layers) if isinstance(layer.mlp, LLaDA2MoeSparseMoeBlock)]
    try:
        block_forward(model, [EXPECTED["input_ids"][0]])
    finally:
        for h in hooks:
            h.remove()
    assert sorted(seen) == [1, 2]
    for i in (1, 2):
        idx, weight, logits = seen[i]
        assert torch.equal(idx, EXPECTED[f"router.{i}.topk_idx"])
        torch.testing.assert_close(weight, EXPECTED[f"router.{i}.topk_weight"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits, EXPECTED[f"router.{i}.logits"], atol=1e-5, rtol=1e-5)


def _copy(tmp_path, tensors: dict):
    """The fixture's config in ``tmp_path`` with ``tensors`` as its weights."""
    for name in ("config.json", "generation_config.json"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_both_shared_experts_count(tmp_path):
    """Zeroing the second expert's half of the fused MLP changes the logits: the whole width is used."""
    tensors = load_file(str(FIXTURE / "model.safetensors"))
    for name in ("gate_proj", "up_proj"):
        tensors[f"{SHARED}{name}.weight"][32:] = 0
    tensors[f"{SHARED}down_proj.weight"][:, 32:] = 0
    halved = load_model(_copy(tmp_path, tensors), {**read_config(FIXTURE), **MASK}, CPU, FP32)
    assert not torch.allclose(block_forward(halved, [EXPECTED["input_ids"][0]]), EXPECTED["logits"], **TOL)


def test_sglang_widths_are_refused_with_the_shape_the_reference_builds(tmp_path):
    """Weights of moe_shared_expert_intermediate_size * num_shared_experts (96) are not the reference's."""
    tensors = load_file(str(FIXTURE / "model.safetensors"))
    for i in (1, 2):
        p = f"model.layers.{i}.mlp.shared_experts."
        tensors[p + "gate_proj.weight"] = torch.zeros(96, 64)
        tensors[p + "up_proj.weight"] = torch.zeros(96, 64)
        tensors[p + "down_proj.weight"] = torch.zeros(64, 96)
    folder = _copy(tmp_path, tensors)
    with pytest.raises(CheckpointError, match=r"shared_experts\.gate_proj\.weight: expected \[64, 64\], "
                                              r"found \[96, 64\]"):
        load_model(folder, {**read_config(folder), **MASK}, CPU, FP32)


def test_parity_fixture_passes():
    """What ``dlm parity tests/fixtures/parity-block/llada2-shared-tiny`` checks: every recorded
    reference run (tokens, forward counts) and forward tensor."""
    results = check_fixture(FIXTURE)
    assert sum(not r.name.startswith("forward") for r in results) == len(CASES["cases"]) > 0
    assert any(r.name.startswith("forward") for r in results)
    assert [r.line() for r in results if not r.ok] == []
