"""The FP8 formats' readers against the tools that write them: compressed-tensors' own fake-quant
forward and compressor, transformers' FineGrainedFP8 dequantization and module skipping (both
installed in the dev environment, the versions .ci/constraints.txt pins)."""

import pytest
import torch

from dlm_backend.engine.quant.formats import checkpoint_format
from dlm_backend.engine.quant.formats.fp8_block import BlockFP8Format, skipped
from tests.engine.quant import fp8_layouts as L


# --- the tools' own code as reference ---------------------------------------------------------------------
@pytest.mark.parametrize("preset,dtype", [("FP8_DYNAMIC", torch.float32), ("FP8_BLOCK", torch.float32),
                                          ("FP8", torch.float32), ("FP8_DYNAMIC", torch.bfloat16),
                                          ("FP8_BLOCK", torch.bfloat16)])
def test_fp8weight_matches_compressed_tensors_forward(preset, dtype):
    """A Linear [40, 96] quantized by compressed-tensors' own lifecycle (preset scheme, calculate_qparams,
    its fake-quant forward), compressed by its FloatQuantizationCompressor and read by our format from
    its own QuantizationConfig.model_dump(). float32: bit-identical (the same amax / 448 scales and
    e4m3 casts). bf16: compressed-tensors computes the scales and x / scale in bf16 before the e4m3 cast
    (a double rounding) where the engine, as vLLM's kernels, keeps them in float32, so a few
    activations land one e4m3 step (1/8 relative) apart: within 3% of the output's largest value."""
    ct = pytest.importorskip("compressed_tensors.quantization")
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 40, bias=False)).to(dtype)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    if preset == "FP8_BLOCK":                   # 128x128 / 128 scaled to the test's [40, 96]
        scheme.weights.block_structure, scheme.input_activations.group_size = [16, 32], 32
    config = ct.QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"], format="float-quantized",
                                   quantization_status="frozen")
    ct.apply_quantization_config(model, config, show_progress=False)
    layer, x = model[0], torch.randn(2, 7, 96, dtype=dtype) * 3             # [B, T, K], as llm-compressor runs
    layer.weight_scale.data, layer.weight_zero_point.data = calculate_qparams(*L.minmax(layer.weight.data, scheme.weights),
                                                                               scheme.weights)
    if not scheme.input_activations.dynamic:
        layer.input_scale.data, layer.input_zero_point.data = calculate_qparams(x.min(), x.max(),
                                                                                scheme.input_activations)
    with torch.no_grad():
        want = layer(x)
    stored = {f"0.{k}": v for k, v in FloatQuantizationCompressor.compress(layer.state_dict(), scheme).items()}
    fmt = checkpoint_format({"quantization_config": {**config.model_dump(mode="json"),
                                                     "quant_method": "compressed-tensors"}})
    roles = fmt.groups(set(stored))["0.weight"]
    weight = fmt.build("0.weight", {r: stored[n] for r, n in roles.items()}).prepare("cpu", dtype)
    got = torch.nn.functional.linear(x, weight)
    if dtype == torch.float32:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, atol=0.03 * want.abs().max().item(), rtol=0)


@pytest.mark.parametrize("block", [(16, 16), (128, 128), (48, 48)])
def test_block_dequantization_matches_transformers(block):
    """Our block weight against transformers' own FineGrainedFP8 dequantizer, edge blocks included."""
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    w = torch.randn(160, 64, generator=torch.Generator().manual_seed(1))
    q, scale = L.fp8_quantize(w, block)
    ours = BlockFP8Format({"quant_method": "fp8", "weight_block_size": list(block)}).build(
        "x.weight", {"weight": q, "scale": scale})
    assert torch.equal(ours.dequantize(), fp8._dequantize_fp8_weight(q, scale, list(block), torch.float32))


def test_block_activations_round_each_token_group_by_its_own_amax():
    """DeepSeek-V3's act_quant (and transformers' finegrained-fp8 kernel): each token's run of ``bk``
    columns is cast to e4m3 at ``amax / 448`` of that run; a partial last group alone."""
    w = BlockFP8Format({"quant_method": "fp8", "weight_block_size": [16, 32]}).build(
        "x.weight", dict(zip(("weight", "scale"), L.fp8_quantize(torch.randn(16, 80), (16, 32)))))
    x = torch.randn(3, 80) * torch.logspace(-2, 2, 80)                      # groups of very different ranges
    want = torch.cat([L.qdq(x[:, a:a + 32], None) for a in (0, 32, 64)], dim=1)
    assert torch.equal(w.quantize_input(x), want)


@pytest.mark.parametrize("module,patterns", [("model.layers.1.mlp.gate", ["mlp.gate"]), ("lm_head", ["lm_head"]),
                                             ("model.layers.1.mlp.gate_proj", ["mlp.gate"]),
                                             ("model.layers.11.self_attn.q_proj", ["model.layers.1"]),
                                             ("model.layers.1.self_attn.q_proj", ["model.layers.1"]),
                                             ("model.layers.3.mlp.experts.0.up_proj", [r"model\.layers\.\d+\.mlp"])])
def test_modules_to_not_convert_reads_as_transformers(module, patterns):
    utils = pytest.importorskip("transformers.quantizers.quantizers_utils")
    assert skipped(module, patterns) == (not utils.should_convert_module(module, patterns))
