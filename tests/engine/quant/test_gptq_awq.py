"""GPTQ and AWQ checkpoints (engine/quant/formats/gptq.py, awq.py).

Tiny checkpoints are written from the parity fixture llada-tiny in the published layouts by the
test's own quantizer and packers (tests/engine/quant/layouts.py, from AutoGPTQ / GPTQModel's
``QuantLinear.pack`` and AutoAWQ's ``WQLinear_GEMM.from_linear``, the layouts vLLM's ``gptq`` and
``awq`` readers read): each weight loads to exactly what was packed, the engine runs them (tinygemm's
int4 kernel where the layout allows) and decodes, and a checkpoint the engine cannot read fails
naming what it found. llada-tiny's linears are [64 | 160, 64 | 160]: groups of 32 divide every K,
and every N is a multiple of 16, so 4-bit g32 weights run the int4 kernel.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load_file, save_file
from tests.engine.quant.layouts import awq_tensors, gptq_tensors, quantize_checkpoint, write_float
from tests.helpers import PARITY, copy_fixture, engine_for, forward, run_to_end

from dlm_backend import SamplingParams
from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.checkpoint.sources import SafetensorsSource
from dlm_backend.engine.checkpoint.weights import load_model
from dlm_backend.engine.quant.formats import checkpoint_format
from dlm_backend.engine.quant.int_weight import IntWeight
from dlm_backend.errors import CheckpointError

FIXTURE = PARITY / "llada-tiny"
FLOAT = load_file(FIXTURE / "model.safetensors")
LINEARS = sorted(n for n, t in FLOAT.items() if ".blocks." in n and t.dim() == 2)
HEAD = "model.transformer.ff_out.weight"
Q_PROJ = "model.transformer.blocks.0.q_proj.weight"                         # [64, 64]
PROMPT = json.loads((FIXTURE / "cases.json").read_text())["cases"][0]["prompt"]
MASK, VOCAB = 300, 320
CPU = torch.device("cpu")


@dataclass
class Case:
    config: dict                    # quantization_config
    pack: object                    # (name, w) -> (stored tensors by suffix, reference weight)
    names: list[str]                # the weights quantized
    kernels: set[str]               # IntWeight.exec of the loaded model's weights


def gptq(bits, group, **kw):
    return lambda name, w: gptq_tensors(w, bits, group, **kw)


def act_order(name, w):             # desc_act: a column order of its own for each weight
    return gptq_tensors(w, 4, 32, sym=True, act_order=torch.Generator().manual_seed(sum(map(ord, name))))


def ff_out_8bit(name, w):           # GPTQModel's dynamic: the ff_out layers at 8 bits per channel, the rest 4-bit g32
    return gptq_tensors(w, 8, -1) if name.endswith("ff_out.weight") else gptq_tensors(w, 4, 32)


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": False}
CASES = {
    # The head is quantized too (GPTQModel's lm_head: true); it is no layer the engine quantizes, so it loads in float.
    "gptq-4bit-g32": Case({**GPTQ, "lm_head": True}, gptq(4, 32), LINEARS + [HEAD], {"int4pack"}),
    "gptq-act-order": Case({**GPTQ, "desc_act": True, "sym": True}, act_order, LINEARS, {"int4pack"}),
    "gptq_v2-8bit-per-channel": Case({**GPTQ, "bits": 8, "group_size": -1, "checkpoint_format": "gptq_v2"},
                                     gptq(8, -1, v2=True), LINEARS, {"int4x2", "dense"}),   # K 64 / 160
    "gptq-dynamic": Case({**GPTQ, "dynamic": {r"+:.*\.ff_out$": {"bits": 8, "group_size": -1}}}, ff_out_8bit,
                         LINEARS, {"int4pack", "dense"}),
    "awq-gemm-g32": Case({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"},
                         lambda name, w: awq_tensors(w, 32), LINEARS, {"int4pack"}),
}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """``build(case)`` -> (quantized folder, float folder of its dequantized weights, references by name)."""
    built = {}

    def make(case: str):
        if case not in built:
            c = CASES[case]
            folder = copy_fixture(tmp_path_factory.mktemp(case))
            reference = quantize_checkpoint(folder, c.config, c.pack, c.names)
            exact = copy_fixture(tmp_path_factory.mktemp(f"{case}-dequantized"))
            write_float(exact, reference)
            built[case] = folder, exact, reference
        return built[case]
    return make


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("case", CASES)
def test_each_weight_loads_exactly_as_packed(case, build):
    folder, _, reference = build(case)
    fmt = checkpoint_format(read_config(folder))
    loaded = {e.name: e.read() for e in SafetensorsSource(folder, fmt).entries("cpu", lambda _: None)}
    for name, want in reference.items():
        got = loaded[name]
        assert isinstance(got, IntWeight) and got.shape == want.shape, name
        # levels, zeros <= 256 and fp16 scales multiply exactly in float32: no tolerance
        assert torch.equal(got.dequantize(), want), name
        # act-order's scattered groups come back as a column permutation; plain g_idx as none
        assert (got.perm is not None) == (case == "gptq-act-order"), name
    for name, t in FLOAT.items():                       # norms and embeddings pass through as stored
        if name not in reference:
            assert torch.equal(loaded[name], t), name


@pytest.mark.parametrize("case", CASES)
def test_the_engine_decodes_a_quantized_checkpoint(case, build):
    folder, exact, reference = build(case)
    engine = engine_for(folder)
    model = engine.model
    assert {m.exec for m in model.modules() if isinstance(m, IntWeight)} == CASES[case].kernels
    if HEAD in reference:                               # a quantized head is dequantized into its float place
        assert torch.equal(model.state_dict()[HEAD], reference[HEAD])

    ids = torch.tensor(PROMPT + [MASK] * 8)
    _, logits = forward(model, ids)
    _, want = forward(load_model(exact, read_config(exact), CPU, torch.float32), ids)
    _, before = forward(load_model(FIXTURE, read_config(FIXTURE), CPU, torch.float32), ids)
    # the int4 kernel takes bf16 activations (8 significant bits): about 0.3% off per linear, 1.6-1.9% on
    # the logits after two blocks (measured, 4-bit; 8-bit levels run as two 4-bit halves, and weights no
    # kernel takes as a bf16 copy); 5% bounds it
    assert relative(logits, want) < 0.05
    # Against the float model before quantization the error is the weights' own rounding, which this
    # random-init fixture (weight std 0.25) amplifies about 5x into the logits (measured 4.8-5.2x: 8% weight
    # error at 4 bits g32 -> 39% logits, 0.55% at 8 bits -> 2.9%); 8x bounds it.
    weight_error = (sum((reference[n] - FLOAT[n]).norm() ** 2 for n in reference)
                    / sum(FLOAT[n].norm() ** 2 for n in reference)).sqrt().item()
    assert relative(logits, before) < 8 * weight_error
    if case == "gptq_v2-8bit-per-channel":              # 8 bits: the float model's greedy pick at most rows
        assert (logits.argmax(-1) == before.argmax(-1)).float().mean() >= 0.9

    params = SamplingParams(sampler="llada", max_tokens=16, block_length=8, ignore_eos=True)
    seq = engine.add_request(PROMPT, params)
    out = run_to_end(engine)[seq.request_id].output.token_ids
    assert len(out) == 16 and all(0 <= t < VOCAB for t in out)


def declare(folder, config: dict) -> None:
    """Set ``quantization_config`` in the config.json of ``folder``."""
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "quantization_config": config}))


@pytest.mark.parametrize("config, says", [
    ({**GPTQ, "bits": 3}, "GPTQ 3-bit weights are not read by this engine; it reads 4-bit and 8-bit GPTQ"),
    ({**GPTQ, "bits": 2}, "GPTQ 2-bit weights are not read"),
    ({**GPTQ, "dynamic": {"+:.*q_proj": {"bits": 3}}}, "dynamic['+:.*q_proj']: GPTQ 3-bit weights are not read"),
    ({**GPTQ, "dynamic": {"+:(": {}}}, "GPTQ dynamic pattern '+:(' is not a regular expression"),
    ({**GPTQ, "checkpoint_format": "marlin"}, "GPTQ checkpoint_format 'marlin' lays the weights out for its own "
                                              "kernel; this engine reads the gptq and gptq_v2 layouts"),
    ({**GPTQ, "is_marlin_format": True}, "GPTQ checkpoint_format 'marlin'"),
    ({**GPTQ, "pack_dtype": "int16"}, "GPTQ pack_dtype 'int16'"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "AWQ version 'gemv' lays the weights out for its own "
                                                           "kernel; this engine reads AutoAWQ's GEMM layout"),
    ({"quant_method": "awq", "bits": 4, "version": "exllama"}, "AWQ version 'exllama'"),
    ({"quant_method": "awq", "bits": 4, "version": "marlin"}, "AWQ version 'marlin'"),
    ({"quant_method": "awq", "bits": 4, "backend": "llm-awq"}, "AWQ backend 'llm-awq'"),
    ({"quant_method": "awq", "bits": 8}, "AWQ 8-bit weights are not read"),
    ({"quant_method": "awq", "bits": 4, "zero_point": False}, "AWQ zero_point false"),
])
def test_a_layout_the_engine_does_not_read_is_refused_naming_it(tmp_path, config, says):
    # Refused from config.json alone (read_config builds the format), before a tensor is read.
    folder = copy_fixture(tmp_path)
    declare(folder, config)
    with pytest.raises(CheckpointError, match=re.escape(says)):
        engine_for(folder)


@pytest.mark.parametrize("method, pack, drop", [
    ("gptq", gptq(4, 32), "qzeros"), ("gptq", gptq(4, 32), "scales"),
    ("awq", lambda name, w: awq_tensors(w, 32), "qzeros"), ("awq", lambda name, w: awq_tensors(w, 32), "qweight"),
])
def test_a_quantized_weight_missing_a_tensor_is_refused_naming_it(tmp_path, method, pack, drop):
    folder = copy_fixture(tmp_path)
    config = GPTQ if method == "gptq" else {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}
    quantize_checkpoint(folder, config, pack, [Q_PROJ])
    state = load_file(folder / "model.safetensors")
    del state[f"model.transformer.blocks.0.q_proj.{drop}"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"{method.upper()} checkpoint is missing tensors of its quantized "
                                              f"weights: model.transformer.blocks.0.q_proj.{drop} "):
        engine_for(folder)


def test_malformed_gptq_tensors_are_refused_naming_the_weight(tmp_path):
    # group_size 64 in config.json over tensors packed in groups of 32: qzeros holds 2 groups where 1 is due
    folder = copy_fixture(tmp_path / "a")
    quantize_checkpoint(folder, {**GPTQ, "group_size": 64}, gptq(4, 32), [Q_PROJ])
    with pytest.raises(CheckpointError, match=r"q_proj.weight: qzeros has shape \[2, 8\] where GPTQ 4-bit g64 of "
                                              r"a \[64, 64\] weight needs \[1, 8\]"):
        engine_for(folder)
    # an act-order g_idx must put exactly group_size columns in each group
    folder = copy_fixture(tmp_path / "b")
    quantize_checkpoint(folder, {**GPTQ, "desc_act": True}, act_order, [Q_PROJ])
    state = load_file(folder / "model.safetensors")
    state["model.transformer.blocks.0.q_proj.g_idx"][:40] = 0                  # group 0 now holds 40+ columns
    save_file(state, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="q_proj.weight: g_idx does not put exactly 32 input columns in each"):
        engine_for(folder)
