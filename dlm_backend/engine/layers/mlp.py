"""Gated feed-forward: down(act(gate(x)) * up(x)), SwiGLU (act = silu) or Gemma's GeGLU (tanh GELU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlm_backend.engine.layers.attention import triton_enabled
from dlm_backend.engine.layers.parallel import ColumnLinear, RowLinear


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in eager torch: the reference of the fused kernel."""
    return F.silu(gate) * up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # [T, I] each
    """``silu(gate) * up``: one fused Triton kernel on the kernel path, eager torch otherwise."""
    if triton_enabled():
        from dlm_backend.engine.kernels.swiglu import swiglu as swiglu_kernel

        return swiglu_kernel(gate, up)
    return silu_mul(gate, up)


class GatedMLP(nn.Module):
    """The gated MLP of the Llama-style families, with their checkpoint names: ``gate_proj`` and
    ``up_proj`` [width, hidden], ``down_proj`` [hidden, width], no biases. ``activation`` "silu" is
    SwiGLU (fused on the kernel path); Gemma's is "gelu_tanh" (``gelu_pytorch_tanh``). Under tensor
    parallelism gate/up split by columns and down by rows; ``reduce=False`` leaves the all-reduce of
    the output to the caller (an MoE block's shared expert, summed with the routed experts first)."""

    def __init__(self, hidden: int, width: int, activation: str = "silu", reduce: bool = True):
        super().__init__()
        self.activation = activation
        what = "the MLP width"
        self.gate_proj = ColumnLinear(hidden, width, bias=False, what=what)
        self.up_proj = ColumnLinear(hidden, width, bias=False, what=what)
        self.down_proj = RowLinear(width, hidden, bias=False, what=what, reduce=reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:           # [T, hidden]
        if self.activation == "silu":
            return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))
