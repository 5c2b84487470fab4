"""RMSNorm in the order both reference models use: normalise in fp32, cast back, then scale."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, D]
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        # The weight multiplies after the cast back (bf16 on GPU), as in LLaDA and HF Qwen2.
        return self.weight * h.to(dtype)
