"""RMSNorm in the order both reference models use: normalise in fp32, cast back, then scale.

On the kernel path (the forward context says so; see :mod:`dlm_backend.engine.kernels`) the norm
runs as one Triton kernel, fused with the residual add that precedes it in every block.
"""

from __future__ import annotations

import torch
from torch import nn

from dlm_backend.engine.layers.attention import triton_enabled


def rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(x + residual), x + residual)`` in eager torch (the fused kernel's reference); the add
    rounds to the input dtype, and the weight multiplies after the cast back (bf16 on GPU), as in
    LLaDA and HF Qwen2."""
    if residual is not None:
        x = x + residual
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype), x


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _fusable(self, x: torch.Tensor, residual: torch.Tensor | None) -> bool:
        return (triton_enabled() and x.dim() == 2 and x.stride(-1) == 1 and x.dtype == self.weight.dtype
                and (residual is None or residual.stride(-1) == 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, D]
        return self.add_forward(x, None)[0]

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``; ``residual=None`` means plain ``(norm(x), x)``."""
        if self._fusable(x, residual):
            from dlm_backend.engine.kernels.rmsnorm import rmsnorm

            return rmsnorm(x, residual, self.weight, self.eps)
        return rms_norm(x, residual, self.weight, self.eps)
