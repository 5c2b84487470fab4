"""The quantized weights' CUDA paths against their torch reference: tinygemm's int4 kernel, int8 as
``(x @ q^T) * scale``, and FP8 through ``torch._scaled_mm`` with per-token scales (compute
capability 8.9+) against the emulated quantize-dequantize the CPU runs."""

import pytest
import torch
import torch.nn.functional as F

from dlm_backend.engine.quant.methods import quantize_weight

pytestmark = pytest.mark.gpu
CUDA = torch.cuda.is_available()


def _product(method, N, K, M, device):
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(N, K, generator=g), torch.randn(M, K, generator=g)
    q = quantize_weight(w, method)
    reference = quantize_weight(w, method).prepare("cpu", torch.float32)     # the CPU path: emulated / packed
    want = F.linear(x, q.dequantize()) if method != "fp8" else F.linear(x, reference)
    q.prepare(device, torch.bfloat16)
    return q, F.linear(x.to(device, torch.bfloat16), q).float().cpu(), want


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("method, kernel", [("int4", "int4pack"), ("int8", "int8pack")])
@pytest.mark.parametrize("M", [1, 32, 257])
def test_the_integer_kernels_on_cuda_compute_the_dequantized_product(method, kernel, M):
    q, got, want = _product(method, 256, 512, M, "cuda")
    assert q.exec == kernel
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()              # bf16 activations and output


@pytest.mark.skipif(not CUDA or torch.cuda.get_device_capability() < (8, 9), reason="needs FP8 tensor cores (sm_89+)")
@pytest.mark.parametrize("M", [1, 32, 100])
def test_fp8_scaled_mm_agrees_with_the_emulation_the_cpu_runs(M):
    q, got, want = _product("fp8", 256, 512, M, "cuda")
    assert q.exec == "scaled_mm"
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()
