"""Greedy unmasking statistics straight from the hidden states: no [N, V] logits in memory.

For every row of ``hidden [N, D]`` (already final-normed) and the LM head ``weight [V, D]`` the kernel
streams the vocabulary in tiles, computes each logit tile with tl.dot, and folds it into running
statistics (online softmax): the max m, the sum of exp s = sum e^(x-m), and the best allowed logit
and its index. From those, ``token`` = argmax of the logits (``exclude_id``, the mask id, never
chosen; the first index on ties) and ``prob`` = its softmax probability over the whole vocabulary,
the confidence the threshold rules use.

The vocabulary is split across programs (``split_size`` columns each) so a handful of rows still
fills the GPU; the per-split partials are merged by a few tiny torch ops (no host sync). The torch
reference is :func:`dlm_backend.engine.layers.head.greedy_confidence`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlm_backend.engine.kernels._common import dot_upcast, is_fp32, next_pow2
from dlm_backend.engine.kernels.attention import _dot


@triton.jit
def _unmask_partial_kernel(h_ptr, w_ptr, part_ptr, idx_ptr, N, V, D, sh_n, sw_v, chunk, n_split, exclude,
                           BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                           IEEE: tl.constexpr, UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < N
    v_lo = split * chunk
    v_hi = tl.minimum(v_lo + chunk, V)
    ninf = float("-inf")
    m = tl.full([BLOCK_M], ninf, tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    best = tl.full([BLOCK_M], ninf, tl.float32)          # best allowed logit
    best_i = tl.zeros([BLOCK_M], tl.int32)
    cols = tl.arange(0, BLOCK_V)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        offs_v = v0 + cols
        v_ok = offs_v < v_hi
        acc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
        for k0 in range(0, D, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < D
            h = tl.load(h_ptr + offs_m[:, None].to(tl.int64) * sh_n + offs_k[None, :],
                        mask=m_ok[:, None] & k_ok[None, :], other=0.0)                   # [M, K]
            w = tl.load(w_ptr + offs_v[None, :].to(tl.int64) * sw_v + offs_k[:, None],
                        mask=v_ok[None, :] & k_ok[:, None], other=0.0)                   # [K, V]
            acc += _dot(h, w, IEEE, UPCAST)
        x = tl.where(v_ok[None, :], acc, ninf)                                           # logits tile
        m_new = tl.maximum(m, tl.max(x, 1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), 1)
        m = m_new
        xa = tl.where(v_ok[None, :] & (offs_v != exclude)[None, :], x, ninf)
        tile_best = tl.max(xa, 1)
        better = tile_best > best                          # strict: ties keep the lower index
        best = tl.where(better, tile_best, best)
        best_i = tl.where(better, v0 + tl.argmax(xa, 1), best_i)
    base = part_ptr + offs_m * n_split + split
    plane = N * n_split
    tl.store(base, m, mask=m_ok)
    tl.store(base + plane, s, mask=m_ok)
    tl.store(base + 2 * plane, best, mask=m_ok)
    tl.store(idx_ptr + offs_m * n_split + split, best_i, mask=m_ok)


def _merge(part: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine per-split partials [3, N, S] into (token, prob) per row (torch, no host sync)."""
    m, s, best = part.unbind(0)
    M = m.max(1).values                                       # [N]
    S = (s * torch.exp(m - M[:, None])).sum(1)
    j = best.argmax(1, keepdim=True)                          # first split on ties = lower index
    token = idx.gather(1, j)[:, 0].long()
    return token, torch.exp(best.gather(1, j)[:, 0] - M) / S


def unmask_stats(hidden: torch.Tensor, weight: torch.Tensor, exclude_id: int = -1,
                 split_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [N] int64, prob [N] fp32) of ``hidden [N, D] @ weight[V, D].T`` in one pass."""
    N, D = hidden.shape
    V = weight.shape[0]
    assert weight.shape[1] == D and hidden.stride(1) == 1 and weight.stride(1) == 1
    block_m = min(64, max(16, next_pow2(N)))
    block_v, block_k = 128, min(64, max(16, next_pow2(D)))
    row_blocks = triton.cdiv(max(N, 1), block_m)
    if split_size is None:
        # Enough (rows x splits) programs to fill an H100/H200-class GPU a couple of times over.
        splits = max(1, min(triton.cdiv(V, 1024), triton.cdiv(264, row_blocks)))
        split_size = triton.cdiv(triton.cdiv(V, splits), block_v) * block_v
    n_split = triton.cdiv(V, split_size)
    part = torch.empty(3, N, n_split, dtype=torch.float32, device=hidden.device)
    idx = torch.empty(N, n_split, dtype=torch.int32, device=hidden.device)
    if N:
        _unmask_partial_kernel[(row_blocks, n_split)](
            hidden, weight, part, idx, N, V, D, hidden.stride(0), weight.stride(0), split_size, n_split,
            exclude_id, BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_K=block_k, IEEE=is_fp32(hidden),
            UPCAST=dot_upcast(hidden), num_warps=8)
    return _merge(part, idx)
