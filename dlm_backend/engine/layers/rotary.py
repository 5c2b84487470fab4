"""Rotary position embeddings ("rotate half", non-interleaved), LLaDA and Dream conventions.

The cos/sin table is computed once for the whole context, the way LLaDA's reference does, and
indexed by position: computing it per call over a different length can change the last bit of
``cos`` on vectorised CPU paths, and greedy parity needs the same bits.
"""

from __future__ import annotations

import math

import torch

from dlm_backend.engine.layers.attention import triton_enabled


class RotaryTable:
    """cos/sin for positions ``0..max_positions-1``, float32, shape ``[P, rotary_dim]``.

    ``rotary_dim`` below ``head_dim`` is partial rotary (LLaDA2: half the head): only the first
    ``rotary_dim`` dims of each head rotate, with frequencies ``theta^(-2i/rotary_dim)``. ``inv_freq``
    replaces those frequencies and ``attention_factor`` scales cos and sin (YaRN, :func:`yarn_rope`).
    """

    def __init__(self, head_dim: int, theta: float, max_positions: int, device: torch.device | str,
                 rotary_dim: int | None = None, inv_freq: torch.Tensor | None = None,
                 attention_factor: float = 1.0):
        dim = rotary_dim or head_dim
        if inv_freq is None:
            inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
        pos = torch.arange(max_positions, dtype=torch.float, device=device)
        freqs = torch.outer(pos, inv_freq.to(device))           # [P, D/2]
        angles = torch.cat((freqs, freqs), dim=-1)              # [P, D]
        self.cos = angles.cos() * attention_factor
        self.sin = angles.sin() * attention_factor
        self.max_positions = max_positions


    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for ``positions`` ([T]) as ``[T, 1, D]`` so they broadcast over heads."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]


def yarn_rope(dim: int, theta: float, factor: float, original_max: int, beta_fast: float = 32.0,
              beta_slow: float = 1.0, mscale: float | None = None, mscale_all_dim: float | None = None,
              attention_factor: float | None = None, truncate: bool = True) -> tuple[torch.Tensor, float]:
    """YaRN's ``(inv_freq [dim/2], attention_factor)`` as Hugging Face's ``_compute_yarn_parameters``
    computes them: each pair's frequency blends the plain one (fast-turning pairs, more than
    ``beta_fast`` turns over ``original_max``) and the one divided by ``factor`` (slow pairs, fewer
    than ``beta_slow``), linearly between; cos/sin scale by ``0.1 * m * ln(factor) + 1`` (1 for a
    factor of 1 or below: Nemotron-Labs-Diffusion's 0.25 scales nothing)."""
    def mscale_of(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if attention_factor is None:
        attention_factor = (mscale_of(mscale) / mscale_of(mscale_all_dim) if mscale and mscale_all_dim
                            else mscale_of())

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001                                   # as the reference: no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1 - ramp                             # 1: the plain frequency
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


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
