"""Unmasking statistics straight from the hidden states: no [N, V] logits in memory.

For every row of ``hidden [N, D]`` (already final-normed) and the LM head ``weight [V, D]`` the kernel
streams the vocabulary in tiles, computes each logit tile with tl.dot, and folds it into running
statistics (online softmax): max m, sum of exp s = sum e^(x-m), and t = sum e^(x-m) x, plus the best
choice and the two largest allowed logits. From those:

* ``token``: argmax of the logits, or with ``temperature > 0`` argmax(x / T + Gumbel noise), the
  noise generated in-kernel by Philox from ``(seed, row * V + col)`` (see :func:`gumbel_noise`);
* ``prob``: softmax probability of the chosen token (the confidence the threshold rule uses);
* ``margin``: top-1 minus top-2 probability; ``entropy``: log s + m - t / s.

``exclude_id`` (the mask id) can never be chosen nor count as top-1/top-2; the softmax itself runs
over the whole vocabulary, as in the samplers (confidence = softmax(logits)[token]). Statistics use
the raw logits; the temperature only shapes the choice.

The vocabulary is split across programs (``split_size`` columns each) so a handful of rows still
fills the GPU; the per-split partials are merged by a few tiny torch ops (no host sync).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlm_backend.engine.kernels import UnmaskStats
from dlm_backend.engine.kernels._common import dot_upcast, is_fp32, next_pow2
from dlm_backend.engine.kernels.attention import _dot


@triton.jit
def _gumbel(seed, offsets):
    """Gumbel(0, 1) noise from Philox uniforms; u = 0 gives -inf (never chosen)."""
    u = tl.rand(seed, offsets)
    return -tl.log(-tl.log(u))


@triton.jit
def _gumbel_kernel(out_ptr, seed, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < V
    tl.store(out_ptr + row.to(tl.int64) * V + cols, _gumbel(seed, row * V + cols), mask=ok)


def gumbel_noise(seed: int, n: int, v: int, device) -> torch.Tensor:
    """The exact noise :func:`unmask_stats` adds for ``(seed, n rows, v columns)``: [n, v] fp32.

    Offsets are 32-bit (row * V + col), so n * v must stay below 2**31 (16k rows of a 126k vocab).
    """
    out = torch.empty(n, v, dtype=torch.float32, device=device)
    if n and v:
        _gumbel_kernel[(n, triton.cdiv(v, 1024))](out, seed, v, BLOCK=1024)
    return out


@triton.jit
def _unmask_partial_kernel(h_ptr, w_ptr, part_ptr, idx_ptr, N, V, D, sh_n, sw_v, chunk, n_split,
                           inv_temp, seed, exclude, SAMPLE: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
                           UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < N
    v_lo = split * chunk
    v_hi = tl.minimum(v_lo + chunk, V)
    ninf = float("-inf")
    m = tl.full([BLOCK_M], ninf, tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    t = tl.zeros([BLOCK_M], tl.float32)
    best = tl.full([BLOCK_M], ninf, tl.float32)          # best choice score
    best_x = tl.full([BLOCK_M], ninf, tl.float32)        # its logit
    best_i = tl.zeros([BLOCK_M], tl.int32)
    l1 = tl.full([BLOCK_M], ninf, tl.float32)            # two largest allowed logits
    l2 = tl.full([BLOCK_M], ninf, tl.float32)
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
        e = tl.exp(x - m_new[:, None])
        rescale = tl.exp(m - m_new)
        s = s * rescale + tl.sum(e, 1)
        t = t * rescale + tl.sum(e * tl.where(v_ok[None, :], x, 0.0), 1)   # 0 * -inf would be nan
        m = m_new
        allowed = v_ok[None, :] & (offs_v != exclude)[None, :]
        xa = tl.where(allowed, x, ninf)
        if SAMPLE:
            noise = _gumbel(seed, offs_m[:, None] * V + offs_v[None, :])
            score = tl.where(allowed, x * inv_temp + noise, ninf)
        else:
            score = xa
        tile_best = tl.max(score, 1)
        tile_i = tl.argmax(score, 1)
        tile_x = tl.max(tl.where(cols[None, :] == tile_i[:, None], x, ninf), 1)
        better = tile_best > best                          # strict: ties keep the lower index
        best = tl.where(better, tile_best, best)
        best_x = tl.where(better, tile_x, best_x)
        best_i = tl.where(better, v0 + tile_i, best_i)
        a1 = tl.max(xa, 1)
        a2 = tl.max(tl.where(cols[None, :] == tl.argmax(xa, 1)[:, None], ninf, xa), 1)
        l2 = tl.maximum(tl.minimum(l1, a1), tl.maximum(l2, a2))
        l1 = tl.maximum(l1, a1)
    base = part_ptr + offs_m * n_split + split
    plane = N * n_split
    tl.store(base, m, mask=m_ok)
    tl.store(base + plane, s, mask=m_ok)
    tl.store(base + 2 * plane, t, mask=m_ok)
    tl.store(base + 3 * plane, best, mask=m_ok)
    tl.store(base + 4 * plane, best_x, mask=m_ok)
    tl.store(base + 5 * plane, l1, mask=m_ok)
    tl.store(base + 6 * plane, l2, mask=m_ok)
    tl.store(idx_ptr + offs_m * n_split + split, best_i, mask=m_ok)


def _merge(part: torch.Tensor, idx: torch.Tensor) -> UnmaskStats:
    """Combine per-split partials [7, N, S] into the row statistics (torch, no host sync)."""
    m, s, t, best, best_x, l1, l2 = part.unbind(0)
    M = m.max(1).values                                       # [N]
    w = torch.exp(m - M[:, None])
    S, Tt = (s * w).sum(1), (t * w).sum(1)
    j = best.argmax(1, keepdim=True)                          # first split on ties = lower index
    token = idx.gather(1, j)[:, 0].long()
    prob = torch.exp(best_x.gather(1, j)[:, 0] - M) / S
    top = torch.cat([l1, l2], 1).topk(2, dim=1).values
    p12 = torch.exp(top - M[:, None]) / S[:, None]
    return UnmaskStats(token, prob, p12[:, 0] - p12[:, 1], torch.log(S) + M - Tt / S)


def unmask_stats(hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 0.0, seed: int = 0,
                 exclude_id: int = -1, split_size: int | None = None) -> UnmaskStats:
    """Per-row (token, prob, margin, entropy) of ``hidden [N, D] @ weight[V, D].T`` in one pass."""
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
    part = torch.empty(7, N, n_split, dtype=torch.float32, device=hidden.device)
    idx = torch.empty(N, n_split, dtype=torch.int32, device=hidden.device)
    if N:
        _unmask_partial_kernel[(row_blocks, n_split)](
            hidden, weight, part, idx, N, V, D, hidden.stride(0), weight.stride(0), split_size, n_split,
            1.0 / temperature if temperature > 0 else 1.0, seed, exclude_id, SAMPLE=temperature > 0,
            BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_K=block_k, IEEE=is_fp32(hidden),
            UPCAST=dot_upcast(hidden), num_warps=8)
    return _merge(part, idx)


def unmask_stats_ref(hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 0.0, seed: int = 0,
                     exclude_id: int = -1, split_size: int | None = None,
                     noise: torch.Tensor | None = None) -> UnmaskStats:
    """Torch reference of :func:`unmask_stats` from materialised fp32 logits.

    With ``temperature > 0`` the noise is ``noise`` if given, else :func:`gumbel_noise` (the
    kernel's own Philox stream, so tokens match exactly). ``split_size`` is ignored.
    """
    logits = hidden.float() @ weight.float().T                                 # [N, V]
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp()
    score = logits.clone()
    if temperature > 0:
        if noise is None:
            noise = gumbel_noise(seed, *logits.shape, logits.device)
        score = logits * (1.0 / temperature) + noise
    allowed_p = probs.clone()
    if 0 <= exclude_id < logits.shape[1]:
        score[:, exclude_id] = -torch.inf
        allowed_p[:, exclude_id] = -1.0
    token = score.argmax(-1)
    top = allowed_p.topk(2, dim=-1).values
    entropy = -(probs * logp.nan_to_num(neginf=0.0)).sum(-1)
    return UnmaskStats(token, probs.gather(1, token[:, None])[:, 0], top[:, 0] - top[:, 1], entropy)
