"""Rotary embedding ("rotate half") applied to q and k in place, in one launch per forward layer.

Two conventions (see layers/rotary.py): ``full_precision=True`` (LLaDA) rotates in fp32 and casts
back; ``False`` (Dream/Qwen2) casts cos/sin to the input dtype and rounds after every op as eager
torch does (``x*cos`` and ``rotate_half(x)*sin`` each rounded, then their sum). The torch reference
is :func:`dlm_backend.engine.layers.rotary.apply_rotary`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlm_backend.engine.kernels._common import next_pow2


@triton.jit
def _rotate_heads(x_ptr, t, st, sh, H, c1, c2, s1, s2, offs_h, offs_d, d_ok,
                  HALF: tl.constexpr, FULL: tl.constexpr):
    ok = (offs_h < H)[:, None] & d_ok[None, :]
    p1 = x_ptr + t * st + offs_h[:, None] * sh + offs_d[None, :]             # [H, D/2]
    x1 = tl.load(p1, mask=ok, other=0.0)
    x2 = tl.load(p1 + HALF, mask=ok, other=0.0)
    dt = x1.dtype
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    if FULL:
        o1 = a1 * c1[None, :] - a2 * s1[None, :]
        o2 = a2 * c2[None, :] + a1 * s2[None, :]
    else:
        # Round each product and the sum to the input dtype, like the eager bf16 ops.
        o1 = (a1 * c1[None, :]).to(dt).to(tl.float32) + (-a2 * s1[None, :]).to(dt).to(tl.float32)
        o2 = (a2 * c2[None, :]).to(dt).to(tl.float32) + (a1 * s2[None, :]).to(dt).to(tl.float32)
    tl.store(p1, o1.to(dt), mask=ok)
    tl.store(p1 + HALF, o2.to(dt), mask=ok)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, Hq, Hk, sq_t, sq_h, sk_t, sk_h, sc_t, ss_t,
                   HALF: tl.constexpr, FULL: tl.constexpr, BLOCK_HQ: tl.constexpr,
                   BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HALF
    c1 = tl.load(cos_ptr + t * sc_t + offs_d, mask=d_ok, other=0.0)
    c2 = tl.load(cos_ptr + t * sc_t + HALF + offs_d, mask=d_ok, other=0.0)
    s1 = tl.load(sin_ptr + t * ss_t + offs_d, mask=d_ok, other=0.0)
    s2 = tl.load(sin_ptr + t * ss_t + HALF + offs_d, mask=d_ok, other=0.0)
    if not FULL:
        # Dream casts the fp32 table to the activation dtype first.
        dt = q_ptr.dtype.element_ty
        c1, c2 = c1.to(dt).to(tl.float32), c2.to(dt).to(tl.float32)
        s1, s2 = s1.to(dt).to(tl.float32), s2.to(dt).to(tl.float32)
    _rotate_heads(q_ptr, t, sq_t, sq_h, Hq, c1, c2, s1, s2, tl.arange(0, BLOCK_HQ), offs_d, d_ok, HALF, FULL)
    _rotate_heads(k_ptr, t, sk_t, sk_h, Hk, c1, c2, s1, s2, tl.arange(0, BLOCK_HK), offs_d, d_ok, HALF, FULL)


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            full_precision: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hk, D] in place by cos/sin [T, D] (fp32); returns (q, k)."""
    T, Hq, D = q.shape
    assert k.shape[0] == T and k.shape[2] == D and D % 2 == 0 and q.dtype == k.dtype
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos.stride(-1) == 1 and sin.stride(-1) == 1
    if T:
        _rotary_kernel[(T,)](q, k, cos, sin, Hq, k.shape[1], q.stride(0), q.stride(1), k.stride(0),
                             k.stride(1), cos.stride(0), sin.stride(0), HALF=D // 2, FULL=full_precision,
                             BLOCK_HQ=next_pow2(Hq), BLOCK_HK=next_pow2(k.shape[1]),
                             BLOCK_D=next_pow2(D // 2))
    return q, k
