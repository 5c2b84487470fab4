"""SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlm_backend.engine.layers.attention import triton_enabled


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in eager torch: the reference of the fused kernel."""
    return F.silu(gate) * up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # [T, I] each
    """``silu(gate) * up``: one fused Triton kernel on the kernel path, eager torch otherwise."""
    if triton_enabled():
        from dlm_backend.engine.kernels.swiglu import swiglu as swiglu_kernel

        return swiglu_kernel(gate, up)
    return silu_mul(gate, up)
