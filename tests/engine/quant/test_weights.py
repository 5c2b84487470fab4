"""Quantized weights against their torch reference: each kernel path's product against the float
product with the dequantized weight, slicing for tensor parallelism, and what may not happen to them."""

import pytest
import torch
import torch.nn.functional as F

from dlm_backend.engine.quant.experts import QuantizedExperts
from dlm_backend.engine.quant.fp8_weight import FP8, FP8Weight, fake_quantize
from dlm_backend.engine.quant.int_weight import IntWeight
from dlm_backend.engine.quant.methods import quantize_weight
from dlm_backend.errors import CheckpointError


def _w(N, K, seed=0):
    return torch.randn(N, K, generator=torch.Generator().manual_seed(seed))


def _x(M, K, seed=1):
    return torch.randn(M, K, generator=torch.Generator().manual_seed(seed))


def _close(got, want, rtol):
    """Within ``rtol`` of the output's scale (the CPU kernels take bf16 activations: 2^-8 each)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    assert (got - want).abs().max().item() <= rtol * want.abs().max().item()


# (method, N, K, the kernel prepare picks): odd shapes take the dequantizing path
CASES = [("int4", 32, 256, "int4pack"), ("int4", 48, 96, "int4pack"), ("int4", 8, 64, "dense"),
         ("int4", 16, 40, "dense"), ("int8", 20, 48, "int8pack"), ("int8", 24, 40, "dense"),
         ("int8", 3, 32, "int8pack")]


@pytest.mark.parametrize("method, N, K, kernel", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 5, 33])
def test_each_integer_kernel_computes_the_dequantized_product(method, N, K, kernel, dtype, M):
    q = quantize_weight(_w(N, K), method)
    want = F.linear(_x(M, K).to(dtype), q.dequantize(dtype))
    q.prepare("cpu", dtype)
    assert q.exec == kernel
    _close(F.linear(_x(M, K).to(dtype), q), want, 2e-2)


def test_a_bias_and_leading_dims_pass_through():
    q = quantize_weight(_w(32, 64), "int4")
    w, b = q.dequantize(), torch.randn(32)
    x = torch.randn(2, 3, 64)
    q.prepare("cpu", torch.float32)
    _close(F.linear(x, q, b), F.linear(x, w, b), 2e-2)


def test_int4_levels_and_group_scales_reproduce_the_weight_within_half_a_step():
    w = _w(16, 256)
    q = quantize_weight(w, "int4")
    assert q.group == 128 and q.q.max() <= 15
    step = q.scale.repeat_interleave(128, 1)
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-6).all()


def test_int8_is_within_half_a_step_of_each_row_and_fp8_within_its_mantissa():
    w = _w(16, 64)
    q8 = quantize_weight(w, "int8")
    assert ((q8.dequantize() - w).abs() <= q8.scale / 2 + 1e-6).all()
    f8 = quantize_weight(w, "fp8")
    assert ((f8.dequantize() - w).abs() <= w.abs() * 2 ** -4 + f8.scale * 2 ** -9).all()   # 3 mantissa bits


def test_act_order_columns_read_the_input_in_stored_order():
    """GPTQ's desc_act: the stored columns are a permutation of the input's; groups contiguous."""
    w = _w(16, 64)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(3))
    plain = quantize_weight(w[:, perm], "int4")
    q = IntWeight(plain.q, plain.scale, plain.offset, 4, perm)
    assert torch.equal(q.dequantize()[:, perm], plain.dequantize())
    x = _x(4, 64)
    want = F.linear(x, q.dequantize())
    q.prepare("cpu", torch.float32)
    _close(F.linear(x, q), want, 2e-2)


def test_rows_columns_and_concatenation_slice_the_weight_they_stand_for():
    w = _w(64, 256)
    for method in ("int4", "int8", "fp8"):
        q = quantize_weight(w, method)
        full = q.dequantize()
        assert torch.equal(q[16:48].dequantize(), full[16:48])
        assert torch.equal(q[:, 128:256].dequantize(), full[:, 128:256])
        assert torch.equal(torch.cat([q[0:16], q[32:48]]).dequantize(), torch.cat([full[0:16], full[32:48]]))


def test_a_split_inside_a_group_is_an_error_naming_it():
    q = quantize_weight(_w(16, 256), "int4")                  # groups of 128
    with pytest.raises(CheckpointError, match="quantization group of 128 does not divide"):
        q[:, 0:64]
    perm = torch.arange(256).flip(0)
    with pytest.raises(CheckpointError, match="act-order GPTQ"):
        IntWeight(q.q, q.scale, q.offset, 4, perm)[:, 0:128]


def test_per_channel_int8_splits_by_columns_anywhere():
    q = quantize_weight(_w(8, 96), "int8")
    assert torch.equal(q[:, 10:50].dequantize(), q.dequantize()[:, 10:50])


def test_any_other_torch_op_on_a_quantized_weight_is_a_type_error_naming_it():
    q = quantize_weight(_w(16, 64), "int8")
    with pytest.raises(TypeError, match="torch.matmul does not run on a quantized weight"):
        torch.matmul(_x(2, 64), q)
    with pytest.raises(TypeError, match="sliced by rows or by columns"):
        q[3]


def test_scales_that_do_not_divide_the_weight_are_a_checkpoint_error():
    with pytest.raises(CheckpointError, match="do not divide the weight into whole groups"):
        IntWeight(torch.zeros(4, 30, dtype=torch.uint8), torch.ones(4, 4), None, 4)


@pytest.mark.parametrize("scale_shape, block", [((), None), ((32, 1), None), ((4, 8), (8, 8))])
def test_fp8_scales_per_tensor_channel_and_block_dequantize_and_slice(scale_shape, block):
    w8 = (_w(32, 64) * 20).clamp(-448, 448).to(FP8)
    scale = torch.rand(scale_shape) + 0.5
    q = FP8Weight(w8, scale, block, "none")
    expand = scale if block is None else scale.repeat_interleave(8, 0).repeat_interleave(8, 1)
    assert torch.equal(q.dequantize(), w8.float() * expand)
    assert torch.equal(q[8:24].dequantize(), q.dequantize()[8:24])
    assert torch.equal(q[:, 16:48].dequantize(), q.dequantize()[:, 16:48])
    assert torch.equal(torch.cat([q[0:8], q[16:24]]).dequantize(), q.dequantize()[[*range(8), *range(16, 24)]])


@pytest.mark.parametrize("activation", ["none", "token", "group", "static"])
def test_fp8_rounds_the_activations_as_its_scheme_says(activation):
    w = _w(16, 64)
    scale = w.abs().amax(1, keepdim=True) / 448
    if activation == "group":                                  # block scales [1, 2]: blocks of 16 x 32
        q = FP8Weight(w.to(FP8), torch.full((1, 2), 1.0), (16, 32), "group")
    else:
        q = FP8Weight((w / scale).to(FP8), scale, None, activation, torch.tensor(0.01) if activation == "static" else None)
    x = _x(3, 64)
    if activation == "none":
        xq = x
    elif activation == "static":
        xq = fake_quantize(x, torch.tensor(0.01))
    elif activation == "token":
        xq = fake_quantize(x, x.abs().amax(-1, keepdim=True) / 448)
    else:
        h = x.view(3, 2, 32)
        xq = fake_quantize(h, h.abs().amax(-1, keepdim=True) / 448).view(3, 64)
    want = F.linear(xq, q.dequantize())
    q.prepare("cpu", torch.float32)
    assert q.exec == "emulate"
    _close(F.linear(x, q), want, 1e-6)


def test_expert_stacks_index_and_split_their_rows():
    experts = QuantizedExperts([quantize_weight(_w(32, 64, seed=e), "int4") for e in range(3)])
    assert experts.shape == (3, 32, 64) and len(experts) == 3
    gate, up = experts.split_rows(16)
    assert torch.equal(up[2].dequantize(), experts[2].dequantize()[16:])
    assert gate.shape == (3, 16, 64)


@pytest.mark.parametrize("bits, signed, group", [(8, True, 32), (8, False, 128), (5, False, 32), (6, False, 64)])
def test_wider_levels_run_as_two_int4_halves_of_the_dequantized_product(bits, signed, group):
    """GGUF's Q8_0 (signed, groups of 32), GPTQ 8-bit (unsigned with zeros), 5/6-bit K-quants."""
    g = torch.Generator().manual_seed(bits + group)
    N, K = 32, 256
    q = (torch.randint(-128, 128, (N, K), generator=g).to(torch.int8) if signed else
         torch.randint(0, 2 ** bits, (N, K), generator=g).to(torch.uint8))
    scale = torch.rand(N, K // group, generator=g) * 0.01 + 1e-3
    offset = None if signed else -torch.rand(N, K // group, generator=g) * 0.1
    w = IntWeight(q, scale, offset, bits)
    x = _x(7, K)
    want = F.linear(x, w.dequantize())
    w.prepare("cpu", torch.float32)
    assert w.exec == "int4x2" and w.nbytes < N * K * 1.3              # a byte a weight, and its scales
    _close(F.linear(x, w), want, 2e-2)
