"""Bidirectional flash-style attention forward over a packed query batch.

Layout that fits the runner: queries of B sequences are packed row-wise, ``q [T, Hq, D]`` with
``cu_q [B+1]`` row offsets; keys/values are one tensor per batch ``k, v [B, Hkv, L, D]`` (any
strides, so a per-sequence cache layer ``cache.k[layer][None]`` or packed new keys viewed with a
batch stride of 0 both work without a copy). Sequence b attends over keys
``k_start[b] .. k_start[b] + k_len[b]`` (left padding or a packed key range), all of them: no
causal mask. Grouped-query heads read KV head ``h // (Hq // Hkv)`` directly (no repeat_interleave).

The kernel tiles over keys with an online softmax (running max, running sum, rescaled accumulator),
so it never materialises the [q, L] score matrix.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from dlm_backend.engine.kernels._common import dot_upcast, is_fp32, next_pow2


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b with fp32 accumulation; IEEE products for fp32 inputs (Triton defaults to TF32), fp32
    operands under the interpreter for bf16 (see _common.dot_upcast)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if IEEE or UPCAST:
        r = tl.dot(a, b, input_precision="ieee")
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def _attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, cu_q_ptr, k_start_ptr, k_len_ptr,
    sq_t, sq_h, sq_d, sk_b, sk_h, sk_l, sk_d, sv_b, sv_h, sv_l, sv_d, so_t, so_h, so_d,
    qk_scale, N_REP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    q0 = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q0
    if pid_m * BLOCK_M < q_len:
        ks = tl.load(k_start_ptr + b)
        kl = tl.load(k_len_ptr + b)
        hk = h // N_REP
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_ok = offs_m < q_len
        d_ok = offs_d < HEAD_DIM
        q = tl.load(q_ptr + (q0 + offs_m)[:, None] * sq_t + h * sq_h + offs_d[None, :] * sq_d,
                    mask=m_ok[:, None] & d_ok[None, :], other=0.0)          # [M, D]
        k_base = k_ptr + b.to(tl.int64) * sk_b + hk * sk_h
        v_base = v_ptr + b.to(tl.int64) * sv_b + hk * sv_h
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for n0 in range(0, kl, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_ok = offs_n < kl
            rows = (ks + offs_n).to(tl.int64)
            kt = tl.load(k_base + rows[None, :] * sk_l + offs_d[:, None] * sk_d,
                         mask=n_ok[None, :] & d_ok[:, None], other=0.0)     # [D, N]
            s = _dot(q, kt, IEEE, UPCAST)
            s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))         # log2 domain
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            vt = tl.load(v_base + rows[:, None] * sv_l + offs_d[None, :] * sv_d,
                         mask=n_ok[:, None] & d_ok[None, :], other=0.0)     # [N, D]
            acc = acc * alpha[:, None] + _dot(p.to(vt.dtype), vt, IEEE, UPCAST)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(o_ptr + (q0 + offs_m)[:, None] * so_t + h * so_h + offs_d[None, :] * so_d,
                 out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def _check(q, k, v, cu_q, k_start, k_len):
    B = k_len.shape[0]
    assert q.dim() == 3 and k.dim() == 4 and v.shape == k.shape, (q.shape, k.shape, v.shape)
    assert q.shape[1] % k.shape[1] == 0, "query heads must be a multiple of KV heads"
    assert q.shape[2] == k.shape[3] and cu_q.shape[0] == B + 1 and k_start.shape[0] == B
    return B


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
              k_start: torch.Tensor, k_len: torch.Tensor, max_q_len: int,
              scale: float | None = None) -> torch.Tensor:
    """Non-causal attention of packed queries over per-sequence key ranges (Triton).

    q: [T, Hq, D]; k, v: [B, Hkv, L, D]; cu_q: [B+1] int32 query row offsets; k_start, k_len: [B]
    int32 key ranges (every k_len >= 1); ``max_q_len`` = max rows of one sequence (a host int, so
    the launch never syncs). Returns o: [T, Hq, D] in q's dtype.
    """
    B = _check(q, k, v, cu_q, k_start, k_len)
    T, Hq, D = q.shape
    o = torch.empty_like(q)
    if T == 0 or B == 0:
        return o
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    block_d = max(16, next_pow2(D))
    block_m = 64 if max_q_len > 32 else max(16, next_pow2(max_q_len))
    block_n = 64 if block_d <= 64 else 32
    grid = (triton.cdiv(max_q_len, block_m), B, Hq)
    _attention_fwd_kernel[grid](
        q, k, v, o, cu_q, k_start, k_len,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        scale * 1.4426950408889634, N_REP=Hq // k.shape[1], HEAD_DIM=D,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, IEEE=is_fp32(q), UPCAST=dot_upcast(q),
        num_warps=4 if block_d <= 64 else 8)
    return o
