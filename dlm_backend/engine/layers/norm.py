"""RMSNorm in the order both reference models use: normalise in fp32, cast back, then scale.

On the kernel path (the forward context says so; see :mod:`dlm_backend.engine.kernels`) the norm runs as one Triton kernel,
fused with the residual add that precedes it in every block (:meth:`RMSNorm.add_forward`).
"""

from __future__ import annotations

import torch
from torch import nn

from dlm_backend.engine.layers.attention import triton_enabled


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _fusable(self, x: torch.Tensor) -> bool:
        return x.dim() == 2 and x.stride(-1) == 1 and x.dtype == self.weight.dtype and triton_enabled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, D]
        if self._fusable(x):
            from dlm_backend.engine.kernels.rmsnorm import rmsnorm

            return rmsnorm(x, None, self.weight, self.eps)[0]
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        # The weight multiplies after the cast back (bf16 on GPU), as in LLaDA and HF Qwen2.
        return self.weight * h.to(dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``; ``residual=None`` means plain ``(norm(x), x)``.

        The add is ``x + residual`` in the input dtype, exactly what the unfused blocks did.
        """
        if residual is not None and self._fusable(x) and residual.stride(-1) == 1:
            from dlm_backend.engine.kernels.rmsnorm import rmsnorm

            return rmsnorm(x, residual, self.weight, self.eps)
        if residual is not None:
            x = x + residual
        return self(x), x
