"""SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # [T, I] each
    return F.silu(gate) * up
