"""Small helpers shared by the kernel launchers."""

from __future__ import annotations

import torch

from dlm_backend.engine.kernels import interpreting


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (tile sizes in Triton must be powers of two)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def is_fp32(t: torch.Tensor) -> bool:
    """fp32 inputs ask tl.dot for IEEE products (Triton defaults to TF32 on GPU)."""
    return t.dtype == torch.float32


def dot_upcast(t: torch.Tensor) -> bool:
    """Triton 3.x's interpreter computes tl.dot on bf16 operands wrongly (numpy has no bf16), so
    under the interpreter bf16 tiles are upcast to fp32 before tl.dot. On GPU bf16 dots run natively."""
    return interpreting() and t.dtype == torch.bfloat16
