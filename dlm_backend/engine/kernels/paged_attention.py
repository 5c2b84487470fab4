"""Flash-style attention over the paged KV pool, full or block-causal (Triton).

Layout and semantics are those of :mod:`dlm_backend.engine.layers.paged_attention` (its
``paged_attention_ref`` is this kernel's reference): packed queries ``q [T, Hq, D]``, sequence b owns
rows ``cu_q[b]:cu_q[b+1]`` at positions ``q_start[b] ..``, and attends over its keys at positions
``0 .. kv_len[b]`` stored in ``k_cache, v_cache [num_pages, page_size, Hkv, D]`` through
``page_table[b]``, either all of them (``causal_block[b] == 0``) or block-causally (``== L``: a query
at position i sees key j iff ``j // L <= i // L``). Grouped-query heads read KV head ``h // (Hq // Hkv)``.

Pages of a power of two >= 16 positions (the engine's usual 16, 32, 64) take the fast path: a key
tile is ``min(page_size, 32|64)`` keys inside one page, so one scalar page-table load per tile locates
all its rows (tl.dot needs tiles of >= 16; a power of two makes every tile a whole fraction of a page).
Any other page size (the pool's ``page_size_for`` gives 18 for blocks of 6, 48 for 24) works too:
tiles then cross pages and each key looks its page up (a [N] int gather per tile, L1-resident).

Per query tile the keys split in three ranges. Keys below the block of the tile's first query (and
below kv_len) are visible to every row: unmasked tiles. Keys from there up to ``kv_end`` = min(kv_len,
end of the block of the tile's last query) are visible to some rows: masked per element. Keys from
``kv_end`` on are visible to no row and are never loaded; that is the block-causal saving (a
2048-token block-causal prefill with L = 32 reads about half the keys of full attention).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from dlm_backend.engine.kernels._common import dot_upcast, is_fp32, next_pow2
from dlm_backend.engine.kernels.attention import _dot


@triton.jit
def _key_tile(acc, m_i, l_i, q, k_base, v_base, pt_ptr, spt_i, n0, kv_end, qpos, blk, offs_d, d_ok,
              sk_p, sk_s, sk_d, sv_p, sv_s, sv_d, qk_scale, PAGE: tl.constexpr, IN_PAGE: tl.constexpr,
              BLOCK_N: tl.constexpr, MASK: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """One online-softmax step over keys n0 .. n0 + BLOCK_N (inside one page when IN_PAGE); MASK:
    the tile holds keys past kv_end or past some row's block, so scores are masked per element."""
    offs_n = tl.arange(0, BLOCK_N)
    kpos = n0 + offs_n                                                      # [N] key positions
    if MASK:
        n_ok = kpos < kv_end                         # nothing at or past kv_end is read, even as 0 * v
    else:
        n_ok = offs_n < BLOCK_N
    if IN_PAGE:
        page = tl.load(pt_ptr + (n0 // PAGE) * spt_i).to(tl.int64)         # one physical page
        k_rows = k_base + page * sk_p + (n0 % PAGE + offs_n) * sk_s          # [N] pool rows
        v_rows = v_base + page * sv_p + (n0 % PAGE + offs_n) * sv_s
    else:
        pages = tl.load(pt_ptr + (kpos // PAGE) * spt_i, mask=n_ok, other=0).to(tl.int64)   # [N]
        k_rows = k_base + pages * sk_p + (kpos % PAGE) * sk_s
        v_rows = v_base + pages * sv_p + (kpos % PAGE) * sv_s
    kt = tl.load(k_rows[None, :] + offs_d[:, None] * sk_d,
                 mask=n_ok[None, :] & d_ok[:, None], other=0.0)             # [D, N]
    s = _dot(q, kt, IEEE, UPCAST) * qk_scale                                # [M, N], log2 domain
    if MASK:
        vis = n_ok[None, :] & ((blk == 0) | (kpos[None, :] // tl.maximum(blk, 1)
                                             <= qpos[:, None] // tl.maximum(blk, 1)))
        s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    vt = tl.load(v_rows[:, None] + offs_d[None, :] * sv_d,
                 mask=n_ok[:, None] & d_ok[None, :], other=0.0)             # [N, D]
    acc = acc * alpha[:, None] + _dot(p.to(vt.dtype), vt, IEEE, UPCAST)
    return acc, m_new, l_i


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, cu_q_ptr, q_start_ptr, kv_len_ptr, pt_ptr, blk_ptr,
    sq_t, sq_h, sq_d, sk_p, sk_s, sk_h, sk_d, sv_p, sv_s, sv_h, sv_d, so_t, so_h, so_d, spt_b, spt_i,
    qk_scale, N_REP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, IN_PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    h = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = tl.program_id(2)
    q0 = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q0
    if pid_m * BLOCK_M < q_len:
        kl = tl.load(kv_len_ptr + b)
        blk = tl.load(blk_ptr + b)
        p0 = tl.load(q_start_ptr + b)
        hk = h // N_REP
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_ok = offs_m < q_len
        d_ok = offs_d < HEAD_DIM
        # Padding rows take the last real row's position: they see what it sees (never nothing).
        qpos = p0 + tl.minimum(offs_m, q_len - 1)                           # [M]
        first = p0 + pid_m * BLOCK_M
        last = p0 + tl.minimum(pid_m * BLOCK_M + BLOCK_M, q_len) - 1
        if blk > 0:
            kv_end = tl.minimum(kl, (last // blk + 1) * blk)   # no row sees past its last block
            full_end = tl.minimum(kl, first // blk * blk)      # every row sees the blocks before its first
        else:
            kv_end = kl
            full_end = kl
        full_end = full_end // BLOCK_N * BLOCK_N                           # whole unmasked tiles only
        q = tl.load(q_ptr + (q0 + offs_m)[:, None] * sq_t + h * sq_h + offs_d[None, :] * sq_d,
                    mask=m_ok[:, None] & d_ok[None, :], other=0.0)          # [M, D]
        k_base = k_ptr + hk * sk_h
        v_base = v_ptr + hk * sv_h
        pt_row = pt_ptr + b.to(tl.int64) * spt_b
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for n0 in range(0, full_end, BLOCK_N):
            acc, m_i, l_i = _key_tile(acc, m_i, l_i, q, k_base, v_base, pt_row, spt_i, n0, kv_end, qpos,
                                      blk, offs_d, d_ok, sk_p, sk_s, sk_d, sv_p, sv_s, sv_d, qk_scale,
                                      PAGE, IN_PAGE, BLOCK_N, False, IEEE, UPCAST)
        for n0 in range(full_end, kv_end, BLOCK_N):
            acc, m_i, l_i = _key_tile(acc, m_i, l_i, q, k_base, v_base, pt_row, spt_i, n0, kv_end, qpos,
                                      blk, offs_d, d_ok, sk_p, sk_s, sk_d, sv_p, sv_s, sv_d, qk_scale,
                                      PAGE, IN_PAGE, BLOCK_N, True, IEEE, UPCAST)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]                    # kv_len 0: zeros, not NaN
        tl.store(o_ptr + (q0 + offs_m)[:, None] * so_t + h * so_h + offs_d[None, :] * so_d,
                 out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def _check(q, k_cache, v_cache, cu_q, q_start, kv_len, page_table, causal_block):
    B = kv_len.shape[0]
    assert q.dim() == 3 and k_cache.dim() == 4 and v_cache.shape == k_cache.shape, (q.shape, k_cache.shape)
    assert q.shape[1] % k_cache.shape[2] == 0, "query heads must be a multiple of KV heads"
    assert q.shape[2] == k_cache.shape[3], "q and the pool disagree on head_dim"
    assert cu_q.shape == (B + 1,) and q_start.shape == (B,) and causal_block.shape == (B,)
    assert page_table.dim() == 2 and page_table.shape[0] == B, page_table.shape
    # int32 throughout: the kernel's per-sequence bounds must have one type in both branches of
    # `if blk > 0` (compiled Triton rejects int32/int64 mixes there; the interpreter would not notice).
    meta = (cu_q, q_start, kv_len, page_table, causal_block)
    assert all(t.dtype == torch.int32 and t.device == q.device for t in meta), [t.dtype for t in meta]
    return B


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_q: torch.Tensor,
                    q_start: torch.Tensor, kv_len: torch.Tensor, page_table: torch.Tensor,
                    causal_block: torch.Tensor, max_q_len: int, scale: float | None = None) -> torch.Tensor:
    """Attention of packed queries over their sequences' paged keys, full or block-causal (Triton).

    q: [T, Hq, D]; k_cache, v_cache: [P, page_size, Hkv, D] (any page_size; powers of two >= 16 fast);
    cu_q: [B+1] row offsets; q_start, kv_len, causal_block: [B]; page_table: [B, max_pages] (int32,
    all on q's device); ``max_q_len`` = max rows of one sequence (a host int, so the launch never
    syncs). Returns o: [T, Hq, D] in q's dtype; matches ``layers.paged_attention.paged_attention_ref``.
    """
    B = _check(q, k_cache, v_cache, cu_q, q_start, kv_len, page_table, causal_block)
    T, Hq, D = q.shape
    o = torch.empty_like(q)
    if T == 0 or B == 0:
        return o
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    page = k_cache.shape[1]
    block_d = max(16, next_pow2(D))
    block_m = 64 if max_q_len > 32 else max(16, next_pow2(max_q_len))
    # 64-key tiles up to D=64, 32 beyond (the [M, D] + [D, N] + [N, D] tiles fit registers at D=128);
    # with pages of a power of two >= 16, never more than a page: one page-table load per tile.
    block_n = 64 if block_d <= 64 else 32
    in_page = page >= 16 and page & (page - 1) == 0
    if in_page:
        block_n = min(page, block_n)
    # Query heads vary fastest in the grid: the Hq // Hkv programs reading one KV head (and the other
    # heads of the sequence) run side by side, so a sequence's pages come from HBM about once, then L2.
    grid = (Hq, triton.cdiv(max_q_len, block_m), B)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, o, cu_q, q_start, kv_len, page_table, causal_block,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *o.stride(), *page_table.stride(),
        scale * 1.4426950408889634, N_REP=Hq // k_cache.shape[2], HEAD_DIM=D, PAGE=page, IN_PAGE=in_page,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, IEEE=is_fp32(q), UPCAST=dot_upcast(q),
        num_warps=4 if block_d <= 64 else 8)
    return o
