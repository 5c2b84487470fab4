"""Rotary position embeddings ("rotate half", non-interleaved), LLaDA and Dream conventions.

The cos/sin table is computed once for the whole context, the way LLaDA's reference does, and
indexed by position: computing it per call over a different length can change the last bit of
``cos`` on vectorised CPU paths, and greedy parity needs the same bits.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.layers.attention import triton_enabled


class RotaryTable:
    """cos/sin for positions ``0..max_positions-1``, float32, shape ``[P, rotary_dim]``.

    ``rotary_dim`` below ``head_dim`` is partial rotary (LLaDA2: half the head): only the first
    ``rotary_dim`` dims of each head rotate, with frequencies ``theta^(-2i/rotary_dim)``.
    """

    def __init__(self, head_dim: int, theta: float, max_positions: int, device: torch.device | str,
                 rotary_dim: int | None = None):
        dim = rotary_dim or head_dim
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
        pos = torch.arange(max_positions, dtype=torch.float, device=device)
        freqs = torch.outer(pos, inv_freq)                      # [P, D/2]
        angles = torch.cat((freqs, freqs), dim=-1)              # [P, D]
        self.cos = angles.cos()
        self.sin = angles.sin()
        self.max_positions = max_positions

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for ``positions`` ([T]) as ``[T, 1, D]`` so they broadcast over heads."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, full_precision: bool) -> torch.Tensor:
    """Rotate ``x`` ([T, H, D]).

    ``full_precision=True`` is LLaDA's ``rope_full_precision``: rotate in fp32 and cast back.
    ``False`` is Dream/Qwen2: cos/sin are cast to ``x``'s dtype and the rotation runs in it.
    """
    if full_precision:
        xf = x.float()
        return ((xf * cos) + (_rotate_half(xf) * sin)).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return (x * cos) + (_rotate_half(x) * sin)


def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              full_precision: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H, D] and k [T, Hkv, D] by cos/sin from :meth:`RotaryTable.lookup`.

    The kernel path rotates both in place in one launch; the torch path returns new tensors. A table
    narrower than the head (partial rotary) rotates the leading dims and passes the rest through.
    """
    rotary_dim = cos.shape[-1]
    if rotary_dim < q.shape[-1]:
        def partial(x):
            return torch.cat((apply_rotary(x[..., :rotary_dim], cos, sin, full_precision), x[..., rotary_dim:]), -1)
        return partial(q), partial(k)
    if triton_enabled() and q.stride(-1) == 1 and k.stride(-1) == 1:
        from dlm_backend.engine.kernels.rotary import rotary_

        return rotary_(q, k, cos[:, 0], sin[:, 0], full_precision)
    return apply_rotary(q, cos, sin, full_precision), apply_rotary(k, cos, sin, full_precision)
