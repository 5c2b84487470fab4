"""FP8 checkpoint formats: compressed-tensors (llm-compressor's ``float-quantized``, as RedHatAI's
``*-FP8-dynamic`` releases; layout in compressed-tensors' ``compressors/naive_quantized`` and its
QuantizationScheme presets) and block FP8 (``quant_method: "fp8"``, transformers' FineGrainedFP8 /
DeepSeek-V3 / Qwen3-FP8; layout in transformers' ``integrations/finegrained_fp8.py``), written
from the parity fixtures by tests/engine/quant/fp8_layouts.py.

Each loaded weight is checked bit for bit against what the test wrote; decoding is checked token
for token against an emulated reference (the float model with the written weights and the
checkpoint's activation rounding); logits against the float fixture within FP8's error (REL).
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from dlm_backend import SamplingParams
from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.checkpoint.sources import SafetensorsSource
from dlm_backend.engine.checkpoint.weights import load_model
from dlm_backend.engine.engine import LLMEngine
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.quant.experts import QuantizedExperts
from dlm_backend.engine.quant.formats import checkpoint_format
from dlm_backend.engine.quant.fp8_weight import FP8Weight
from dlm_backend.engine.quant.weight import QuantizedWeight
from dlm_backend.errors import CheckpointError
from tests.engine.quant import fp8_layouts as L
from tests.helpers import FIXTURES, PARITY, forward, run_to_end

LLADA, BLOCK = PARITY / "llada-tiny", FIXTURES / "parity-block"
HEAD = "model.transformer.ff_out"       # LLaDA's LM head: releases keep the head in 16 bits ("lm_head")
CPU, FP32 = torch.device("cpu"), torch.float32
IDS = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(0))
# Logits vs the float fixture, ||fp8 - float|| / ||float||: e4m3 keeps 3 mantissa bits (about 2.5% RMS
# error per weight and per activation) and these random fixtures (weights of std 0.25) amplify it: 0.17-0.29
# in every layout here on llada-tiny, 0.36-0.46 on llada2-tiny (whose routers then pick other experts for
# some tokens), as the engine's own quantization="fp8" does (0.285 and 0.457; int8: 0.05 and 0.15). A
# misread scale gives 1 and more.
REL = {"llada-tiny": 0.35, "llada2-tiny": 0.5}
GREEDY = SamplingParams(max_tokens=24, temperature=0, sampler="llada", block_length=8, steps=24, cache="none")


def load(folder, **overrides):
    return load_model(folder, {**read_config(folder), **overrides}, CPU, FP32)


def rel_error(model, base) -> float:
    got, want = forward(model, IDS)[1], forward(base, IDS)[1]
    return ((got - want).norm() / want.norm()).item()


def close_to(model, base, fixture) -> bool:
    return rel_error(model, base) < REL[fixture.name]


def read_quantized(folder) -> dict:
    """The quantized weights as the loader reads them (canonical form, before prepare)."""
    source = SafetensorsSource(folder, checkpoint_format(read_config(folder)))
    return {e.name: v for e in source.entries("cpu", lambda n: None)
            if isinstance(v := e.read(), QuantizedWeight | QuantizedExperts)}


@pytest.fixture(scope="module")
def base():
    return load(LLADA)


@pytest.fixture(scope="module")
def scales(base):
    return L.input_scales(base, IDS)


def check_loaded(folder, src, expected, kind, float_names):
    """(a) every written weight reads back exactly, of ``kind``, and is installed; (c) the modules the
    checkpoint left in 16 bits load as the float fixture's tensors."""
    got = read_quantized(folder)
    assert sorted(got) == sorted(expected)
    for name, w in expected.items():
        assert got[name].kind == kind and torch.equal(got[name].dequantize(), w), name
    model, fixture = load(folder), load_file(str(src / "model.safetensors"))
    for name in expected:
        assert isinstance(L.loaded(model, name), QuantizedWeight), name
    for name in float_names:
        held = L.loaded(model, name)
        assert type(held) is torch.nn.Parameter and torch.equal(held, fixture[name]), name
    return model


CT_LAYOUTS = [      # (writer arguments, the kind the engine reports)
    pytest.param(dict(weights="channel", activations="token"), "fp8 per-channel, token activations", id="FP8_DYNAMIC"),
    pytest.param(dict(weights="tensor", activations="static"), "fp8 per-tensor, static activations", id="FP8-static"),
    pytest.param(dict(weights=(16, 32), activations="group"), "fp8 block 16x32, group activations", id="FP8_BLOCK"),
    pytest.param(dict(weights=("group", 32), activations=None), "fp8 block 1x32", id="FP8-group-weight-only"),
    pytest.param(dict(weights="int8", activations=None, fmt="int-quantized"), "int8 per-channel", id="int8-W8A16"),
    pytest.param(dict(weights="channel", activations="token", fmt="naive-quantized"),
                 "fp8 per-channel, token activations", id="naive-quantized"),
]


@pytest.mark.parametrize("layout,kind", CT_LAYOUTS)
def test_compressed_tensors_layouts_load_exactly(tmp_path, base, scales, layout, kind):
    folder = tmp_path / "q"
    expected = L.compressed_tensors(LLADA, folder, ignore=(HEAD,), input_scales=scales, **layout)
    model = check_loaded(folder, LLADA, expected, kind, [f"{HEAD}.weight"])
    assert close_to(model, base, LLADA)


BLOCK_LAYOUTS = [   # weight_block_size, activation_scheme, kind
    pytest.param((16, 16), "dynamic", "fp8 block 16x16, group activations", id="16x16"),
    pytest.param((32, 32), "dynamic", "fp8 block 32x32, group activations", id="32x32"),
    pytest.param((128, 128), "dynamic", "fp8 block 128x128, group activations", id="128x128-partial"),  # published
    pytest.param((48, 48), "dynamic", "fp8 block 48x48, group activations", id="48x48-edge-blocks"),
    pytest.param(None, "dynamic", "fp8 per-tensor, token activations", id="per-tensor"),
    pytest.param(None, "static", "fp8 per-tensor, static activations", id="per-tensor-static"),
]


@pytest.mark.parametrize("block,activation,kind", BLOCK_LAYOUTS)
def test_block_fp8_layouts_load_exactly(tmp_path, base, scales, block, activation, kind):
    folder = tmp_path / "q"
    expected = L.block_fp8(LLADA, folder, block, activation, not_convert=(HEAD,), input_scales=scales)
    model = check_loaded(folder, LLADA, expected, kind, [f"{HEAD}.weight"])
    assert close_to(model, base, LLADA)


def test_autofp8_per_tensor_layout_loads_exactly(tmp_path, base, scales):
    """AutoFP8's releases (quant_method "fp8", static activations): weight_scale and input_scale."""
    expected = L.block_fp8(LLADA, tmp_path / "q", None, "static", (HEAD,), scales, ("weight_scale", "input_scale"))
    model = check_loaded(tmp_path / "q", LLADA, expected, "fp8 per-tensor, static activations", [f"{HEAD}.weight"])
    assert close_to(model, base, LLADA)


# --- decoding: token for token as the emulated reference ------------------------------------------------
def decode(folder, hook_names=(), g=None) -> list[list[int]]:
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", dtype="float32"))
    for name, module in engine.model.named_modules():
        if f"{name}.weight" in hook_names:
            module.register_forward_pre_hook(lambda m, args: (L.qdq(args[0], g),))
    ids = [engine.add_request(p, GREEDY).request_id for p in ([5, 6, 7, 8, 9, 10], [40, 41, 42])]
    done = run_to_end(engine)
    return [done[i].output.token_ids for i in ids]


@pytest.mark.parametrize("write,g", [
    pytest.param(lambda dest: L.compressed_tensors(LLADA, dest, ignore=(HEAD,)), None, id="compressed-tensors"),
    pytest.param(lambda dest: L.block_fp8(LLADA, dest, (16, 16), not_convert=(HEAD,)), 16, id="block-fp8"),
])
def test_engine_decodes_token_for_token_as_the_emulated_reference(tmp_path, write, g):
    """(b) The FP8 checkpoint's greedy tokens equal the float model's with the written weights and each
    quantized layer's input rounded by ``qdq``: the same float32 arithmetic, so exact. (Against the
    float fixture the tokens part after a few: this random model is chaotic, and even rounding the
    weights alone changes most of its 24 tokens.)"""
    expected = write(tmp_path / "q")
    reference = decode(L.float_copy(LLADA, tmp_path / "ref", expected), expected, g)
    assert decode(tmp_path / "q") == reference
    assert all(len(t) == GREEDY.max_tokens for t in reference)


# --- MoE: per-expert FP8 tensors stack; the router and head stay float -----------------------------------
LLADA2 = BLOCK / "llada2-tiny"
MASK2 = {"mask_token_id": json.loads((LLADA2 / "cases.json").read_text())["mask_token_id"]}


@pytest.mark.parametrize("fmt", ["compressed-tensors", "fp8"])
def test_moe_experts_load_as_fp8_stacks_beside_a_float_router_and_head(tmp_path, fmt):
    """(c, d) llada2-tiny's experts (``mlp.experts.N.gate_proj.weight``, 16 per MoE layer) quantized as
    DeepSeek-V3 / llm-compressor MoE releases are, the router (``mlp.gate``) and head kept float by
    ``ignore`` (compressed-tensors' ``"re:.*mlp.gate$"``) or ``modules_to_not_convert``."""
    folder = tmp_path / "q"
    if fmt == "compressed-tensors":
        expected = L.compressed_tensors(LLADA2, folder, (16, 16), "group", ("lm_head", "re:.*mlp.gate$"), **MASK2)
    else:
        expected = L.block_fp8(LLADA2, folder, (16, 16), not_convert=("lm_head", "mlp.gate"), **MASK2)
    routers = [n for n in load_file(str(LLADA2 / "model.safetensors")) if n.endswith("mlp.gate.weight")]
    assert routers and not any(r in expected for r in routers)
    model = check_loaded(folder, LLADA2, expected, "fp8 block 16x16, group activations",
                         ["lm_head.weight", *routers])
    for layer in (1, 2):
        for param in ("gate_proj", "up_proj", "down_proj"):
            stack = getattr(model.get_submodule(f"model.layers.{layer}.mlp.experts"), param)
            assert isinstance(stack, QuantizedExperts) and len(stack) == 16
            assert all(isinstance(e, FP8Weight) and e.exec == "emulate" for e in stack)
    assert close_to(model, load(LLADA2, **MASK2), LLADA2)
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", dtype="float32"))
    request = engine.add_request([5, 6, 7, 8], SamplingParams(max_tokens=16, temperature=0)).request_id
    out = run_to_end(engine)[request].output.token_ids
    assert 0 < len(out) <= 16 and all(0 <= t < 512 for t in out)


# --- what is refused, and how it is named ---------------------------------------------------------------
@pytest.mark.parametrize("fmt,what", [("pack-quantized", "int32 weight_packed"), ("nvfp4-pack-quantized", "NVFP4")])
def test_unread_compressed_tensors_formats_are_named(tmp_path, fmt, what):
    L.compressed_tensors(LLADA, tmp_path / "q", ignore=(HEAD,), fmt=fmt)
    with pytest.raises(CheckpointError, match=f"format '{fmt}' .*{what}.*it reads float-quantized"):
        load(tmp_path / "q")


def _ct(**group) -> dict:
    w = L.ct_args("float", "channel", False)
    return {"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
                                    "config_groups": {"g": {"targets": ["Linear"], "weights": w, **group}}}}


@pytest.mark.parametrize("config,match", [
    (_ct(weights=L.ct_args("int", "channel", False), input_activations=L.ct_args("int", "token", True)), "W8A8"),
    (_ct(weights={**L.ct_args("int", "group", False), "num_bits": 4, "group_size": 128}), "4-bit int"),
    (_ct(input_activations=L.ct_args("float", "tensor", True)), "dynamic tensor activations"),
    (_ct(input_activations=L.ct_args("float", "group", True, group_size=128)), "activation groups of 128"),
    (_ct(output_activations=L.ct_args("float", "token", True)), "output_activations"),
    ({"quantization_config": {**_ct()["quantization_config"], "kv_cache_scheme": L.ct_args("float", "tensor", False)}},
     "kv_cache_scheme"),
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}}, "fmt 'e5m2'"),
    ({"quantization_config": {"quant_method": "fp8", "scale_fmt": "ue8m0"}}, "UE8M0"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}}, "weight_block_size"),
    ({"quantization_config": {"quant_method": "fp8", "modules_to_convert": ["embed_tokens"]}}, "embedding"),
])
def test_schemes_the_engine_cannot_run_are_refused_by_name(config, match):
    with pytest.raises(CheckpointError, match=match):
        checkpoint_format(config)


Q = "model.transformer.blocks.0.q_proj"


def test_a_module_takes_the_first_of_its_exact_regex_and_class_targets():
    """As compressed-tensors' apply_quantization_config: an exact name over a regex over a class."""
    groups = {"by_class": {"targets": ["Linear"], "weights": L.ct_args("float", "channel", False),
                           "input_activations": L.ct_args("float", "token", True)},
              "by_regex": {"targets": ["re:.*q_proj$"], "weights": L.ct_args("float", "tensor", False)},
              "by_name": {"targets": [Q], "weights": L.ct_args("float", "block", False, block_structure=[16, 16])}}
    fmt = checkpoint_format({"quantization_config": {"quant_method": "compressed-tensors",
                                                     "format": "float-quantized", "config_groups": groups}})
    modules = (Q, "model.transformer.blocks.1.q_proj", "model.transformer.blocks.1.k_proj")
    assert [fmt.scheme_for(m).group for m in modules] == ["by_name", "by_regex", "by_class"]


def test_a_misshapen_weight_scale_inv_is_named(tmp_path):
    L.block_fp8(LLADA, tmp_path / "q", (16, 16), not_convert=(HEAD,))
    with pytest.raises(CheckpointError, match=rf"{Q}\.weight_scale_inv: shape \[3, 4\] .* needs \[4, 4\]"):
        load(L.edit(tmp_path / "q", {f"{Q}.weight_scale_inv": torch.ones(3, 4)}))


def test_checkpoint_and_config_disagreeing_is_named(tmp_path, scales):
    L.compressed_tensors(LLADA, tmp_path / "a", ignore=())             # the head quantized, then listed as ignored
    with pytest.raises(CheckpointError, match=f"{HEAD}.weight_scale: {HEAD} is in quantization_config.ignore"):
        load(L.edit(tmp_path / "a", ignore=[HEAD]))
    L.block_fp8(LLADA, tmp_path / "b", None, "static", not_convert=(HEAD,), input_scales=scales)
    with pytest.raises(CheckpointError, match=f"{Q}.weight: activation_scheme 'static' needs {Q}.input_scale"):
        load(L.edit(tmp_path / "b", drop=[f"{Q}.activation_scale"]))
    L.compressed_tensors(LLADA, tmp_path / "c", ignore=(HEAD,))
    with pytest.raises(CheckpointError, match=f"{Q}.weight: an FP8 checkpoint stores its weights as 2-D "
                                              "float8_e4m3fn, found bfloat16"):
        load(L.edit(tmp_path / "c", {f"{Q}.weight": torch.zeros(64, 64, dtype=torch.bfloat16)}))


# --- stacked experts (transformers v5: experts.gate_up_proj [E, 2I, D] + experts.gate_up_proj_scale_inv) -
GEMMA = BLOCK / "diffusiongemma-tiny"


def test_stacked_experts_read_as_a_stack_of_fp8_experts(tmp_path):
    expected = L.block_fp8(GEMMA, tmp_path / "q", (16, 16), not_convert=("router.proj",))
    got = read_quantized(tmp_path / "q")
    stacks = [n for n in expected if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(stacks) == 6
    for name in stacks:
        assert isinstance(got[name], QuantizedExperts) and len(got[name]) == 4
        assert all(torch.equal(e.dequantize(), w) for e, w in zip(got[name], expected[name], strict=True))


def test_stacked_fp8_experts_load_into_the_model(tmp_path):
    L.block_fp8(GEMMA, tmp_path / "q", (16, 16), not_convert=("router.proj",))
    experts = load(tmp_path / "q").get_submodule("model.decoder.layers.0.experts")
    assert all(isinstance(stack, QuantizedExperts) for stack in (*experts.gate_up, experts.down_proj))
