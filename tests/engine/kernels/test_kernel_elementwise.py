"""RMSNorm+residual, rotary and SwiGLU kernels against their torch references."""

import pytest
import torch
from tests.engine.kernels.kernel_utils import DEVICE, DTYPES, TOL

from dlm_backend.engine.kernels.rmsnorm import rmsnorm
from dlm_backend.engine.kernels.rotary import rotary_
from dlm_backend.engine.kernels.swiglu import swiglu
from dlm_backend.engine.layers.mlp import silu_mul
from dlm_backend.engine.layers.norm import rms_norm
from dlm_backend.engine.layers.rotary import RotaryTable, apply_rotary


def rotary_ref(q, k, cos, sin, full_precision):
    """The layer's rotation (the kernel's reference) of q and k by cos/sin [T, D]."""
    c, s = cos[:, None, :], sin[:, None, :]
    return apply_rotary(q, c, s, full_precision), apply_rotary(k, c, s, full_precision)


def _randn(*shape, dtype, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,D", [(7, 48), (3, 100), (1, 256)])
def test_rmsnorm_residual(dtype, T, D):
    x, r = _randn(T, D, dtype=dtype, seed=1), _randn(T, D, dtype=dtype, seed=2, scale=3.0)
    w = _randn(D, dtype=dtype, seed=3)
    out, res = rmsnorm(x, r, w, 1e-5)
    ref_out, ref_res = rms_norm(x, r, w, 1e-5)
    assert out.dtype == dtype and res.dtype == dtype
    torch.testing.assert_close(res, ref_res, **TOL[dtype])
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    assert torch.equal(x, _randn(T, D, dtype=dtype, seed=1))          # inputs untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_without_residual_and_strided_rows(dtype):
    # Rows of a wider buffer (stride != D) exercise the row stride; no residual returns x itself.
    big = _randn(5, 80, dtype=dtype, seed=4)
    x = big[:, :72]
    w = _randn(72, dtype=dtype, seed=5)
    out, res = rmsnorm(x, None, w, 1e-6)
    torch.testing.assert_close(out, rms_norm(x, None, w, 1e-6)[0], **TOL[dtype])
    assert res is x


def test_rmsnorm_fp32_matches_layer():
    # The layer's own RMSNorm (the CPU path) and the kernel agree closely in fp32.
    from dlm_backend.engine.layers.norm import RMSNorm

    norm = RMSNorm(40, 1e-5).to(DEVICE)
    norm.weight.data = _randn(40, dtype=torch.float32, seed=6)
    x = _randn(9, 40, dtype=torch.float32, seed=7)
    torch.testing.assert_close(rmsnorm(x, None, norm.weight.data, 1e-5)[0], norm(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("full_precision", [True, False])
@pytest.mark.parametrize("hq,hk,d", [(4, 2, 16), (3, 3, 64), (5, 1, 24)])
def test_rotary_in_place(dtype, full_precision, hq, hk, d):
    T = 11
    table = RotaryTable(d, 10000.0, 64, DEVICE)
    pos = torch.tensor([0, 1, 2, 3, 17, 18, 40, 41, 42, 62, 63], device=DEVICE)
    cos, sin = table.cos[pos], table.sin[pos]                        # [T, D] fp32
    q, k = _randn(T, hq, d, dtype=dtype, seed=8), _randn(T, hk, d, dtype=dtype, seed=9)
    q_ref, k_ref = rotary_ref(q.clone(), k.clone(), cos, sin, full_precision)
    q_out, k_out = rotary_(q, k, cos, sin, full_precision)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()   # in place
    torch.testing.assert_close(q, q_ref, **TOL[dtype])
    torch.testing.assert_close(k, k_ref, **TOL[dtype])


def test_rotary_views_of_a_projection():
    # The models rotate views of q/k projections: [T, H*D] viewed as [T, H, D].
    T, H, D = 6, 2, 32
    table = RotaryTable(D, 500000.0, 16, DEVICE)
    pos = torch.arange(3, 3 + T, device=DEVICE)
    proj = _randn(T, 3 * H * D, dtype=torch.float32, seed=10)
    q, k = proj[:, :H * D].view(T, H, D), proj[:, H * D:2 * H * D].view(T, H, D)
    want_q, want_k = rotary_ref(q.clone(), k.clone(), table.cos[pos], table.sin[pos], True)
    untouched = proj[:, 2 * H * D:].clone()
    rotary_(q, k, table.cos[pos], table.sin[pos], True)
    torch.testing.assert_close(q, want_q, **TOL[torch.float32])
    torch.testing.assert_close(k, want_k, **TOL[torch.float32])
    assert torch.equal(proj[:, 2 * H * D:], untouched)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 37), (1, 1), (5, 1029)])
def test_swiglu(dtype, shape):
    g, u = _randn(*shape, dtype=dtype, seed=11, scale=4.0), _randn(*shape, dtype=dtype, seed=12)
    out = swiglu(g, u)
    assert out.dtype == dtype and out.shape == g.shape
    torch.testing.assert_close(out, silu_mul(g, u), **TOL[dtype])
