"""SwiGLU activation: ``silu(gate) * up`` in one pass (eager torch writes silu(gate) out first).

Rounds like eager torch: silu in fp32, cast to the input dtype, then the product cast again. The
torch reference is :func:`dlm_backend.engine.layers.mlp.silu_mul`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    g = tl.load(g_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=ok, other=0.0)
    act = (g / (1.0 + tl.exp(-g))).to(u.dtype).to(tl.float32)
    tl.store(o_ptr + offs, (act * u.to(tl.float32)).to(o_ptr.dtype.element_ty), mask=ok)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up: [..., I] (same shape and dtype) -> silu(gate) * up."""
    assert gate.shape == up.shape and gate.dtype == up.dtype
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    n = gate.numel()
    if n:
        block = 1024
        _swiglu_kernel[(triton.cdiv(n, block),)](gate, up, out, n, BLOCK=block)
    return out
