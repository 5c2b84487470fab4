"""RMSNorm fused with the residual add that precedes it in every pre-norm block.

``rmsnorm(x, residual, weight, eps) -> (normed, new_residual)`` with ``new_residual = x + residual``
(just ``x`` when residual is None) and ``normed = weight * (h * rsqrt(mean(h^2) + eps)).to(dtype)``,
``h = new_residual`` in fp32: the order of :class:`~dlm_backend.engine.layers.norm.RMSNorm` (normalise
in fp32, cast back, then scale by the weight in the model dtype). One read of x and residual, one
write of each output, instead of the four passes eager torch makes. The torch reference is
:func:`dlm_backend.engine.layers.norm.rms_norm`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlm_backend.engine.kernels._common import next_pow2


@triton.jit
def _rmsnorm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr, D, sx, sr, so, sro, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < D
    x = tl.load(x_ptr + row * sx + offs, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        # The add rounds to the input dtype, as torch's ``x + residual`` does.
        x = (x.to(tl.float32) + tl.load(r_ptr + row * sr + offs, mask=ok, other=0.0).to(tl.float32))
        x = x.to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * sro + offs, x, mask=ok)
    h = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(h * h, 0) / D + eps)
    y = (h * inv).to(out_ptr.dtype.element_ty).to(tl.float32)        # cast back before the weight
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * so + offs, (w * y).to(out_ptr.dtype.element_ty), mask=ok)


def rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [T, D] (same dtype), weight: [D] -> (normed [T, D], x + residual [T, D])."""
    assert x.dim() == 2 and x.stride(-1) == 1 and weight.shape == (x.shape[1],)
    T, D = x.shape
    out = torch.empty_like(x)
    if residual is None:
        res_out, r = x, x
    else:
        assert residual.shape == x.shape and residual.stride(-1) == 1
        res_out, r = torch.empty_like(x), residual
    if T:
        block = next_pow2(D)
        _rmsnorm_kernel[(T,)](x, r, weight, out, res_out, D, x.stride(0), r.stride(0), out.stride(0),
                              res_out.stride(0), eps, HAS_RESIDUAL=residual is not None, BLOCK=block,
                              num_warps=min(16, max(1, block // 256)))
    return out, res_out
