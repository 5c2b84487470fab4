"""Fused mixture-of-experts: the routed experts' gated MLPs and the weighted combine in two grouped GEMMs.

The T*k (token, slot) assignments are grouped by expert and each expert's group is padded to a
multiple of BLOCK_M (vLLM's ``moe_align_block_size`` idea), so every row tile of a program belongs
to ONE expert and multiplies that expert's weights only; pad rows carry the sentinel id ``T*k`` and
are masked out. Then:

1. ``_gate_up_kernel``: tile of gathered ``x`` rows @ the expert's gate and up weights (both products
   in one program, sharing each loaded ``x`` tile), ``act(gate) * up`` in the epilogue, written to the
   intermediate ``[T*k, I]`` in x's dtype at each assignment's own row.
2. ``_down_kernel``: tile of intermediate rows @ the expert's down weight, times the routing weight,
   written in fp32 to ``[T*k, D]``; a torch ``sum`` over the k slots then gives ``[T, D]``.

Why not atomic adds into ``[T, D]``: fp32 atomics land in whatever order the programs run, so the
same batch can round differently from run to run, and a bf16 output flipping one ulp can change a
greedy token. Writing per slot and summing keeps the engine deterministic; the price is a
``T*k*D*4``-byte round trip (64 MiB each way at T=1024, k=8, D=2048) against ~1.6 GB of expert
weights read at that size (256 experts x 3 x 512 x 2048 x 2 B), i.e. under 10% more traffic.

Rounding follows the torch reference (:func:`dlm_backend.engine.layers.moe.routed_experts`): each
product is accumulated in fp32 and rounded to x's dtype, the activation runs in fp32 on the rounded
gate and is rounded again, the product with up is rounded, the down product is rounded before it is
scaled by the fp32 routing weight, and the combine stays fp32 until the final cast.

The launcher is free of host syncs (the grid depends only on T, k, E and the tile size, an upper
bound on the padded rows), so it can sit inside a captured CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from dlm_backend.engine.kernels._common import dot_upcast, is_fp32, next_pow2
from dlm_backend.engine.kernels.attention import _dot

ACT_CODES = {"silu": 0, "gelu_tanh": 1}


@triton.jit
def _act(g, ACT: tl.constexpr):
    """fp32 activation. gelu_tanh uses 0.5 * (1 + tanh(y)) == sigmoid(2y): no cancellation for negative
    inputs (1 + tanh(y) computed directly is exactly 0 in fp32 below y = -9, i.e. x < -5.15)."""
    if ACT == 0:
        r = g / (1.0 + tl.exp(-g))
    else:
        y = 0.7978845608028654 * (g + 0.044715 * g * g * g)     # sqrt(2/pi) * (g + 0.044715 g^3)
        # exp(-2y) overflows fp32 from g ~ -10 (the cube grows fast); capped at e^80 the result is
        # g * 1.8e-35 where the reference's 1 + tanh is exactly 0: an absolute error below 1e-33.
        r = g / (1.0 + tl.exp(tl.minimum(-2.0 * y, 80.0)))
    return r


@triton.jit
def _round(v, dt: tl.constexpr, RNE: tl.constexpr):
    """fp32 ``v`` rounded to ``dt`` (the rounding torch does when a bf16/fp16 op writes its output), kept
    in fp32. RNE: round to nearest even by hand, for bf16 under Triton 3.x's interpreter, whose
    fp32->bf16 cast truncates (about half of all values land one ulp, 0.4%, toward zero)."""
    if RNE:
        b = v.to(tl.uint32, bitcast=True)
        r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    else:
        r = v.to(dt).to(tl.float32)
    return r


@triton.jit
def _gate_up_kernel(x_ptr, g_ptr, u_ptr, h_ptr, ids_ptr, blk_e_ptr, n_assign, E, I, D,
                    sx_t, sx_d, sg_e, sg_i, sg_d, su_e, su_i, su_d,
                    TOP_K: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, RNE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(blk_e_ptr + pid_m)                          # this tile's expert; E = tile past the last group
    if e < E:
        ids = tl.load(ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))   # [M] assignment ids, n_assign = pad
        m_ok = ids < n_assign
        tok = (ids // TOP_K).to(tl.int64)                   # assignment t*k + slot reads x row t
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < I
        g_base = g_ptr + e.to(tl.int64) * sg_e + offs_n[None, :].to(tl.int64) * sg_i
        u_base = u_ptr + e.to(tl.int64) * su_e + offs_n[None, :].to(tl.int64) * su_i
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, D, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < D
            xt = tl.load(x_ptr + tok[:, None] * sx_t + offs_k[None, :] * sx_d,
                         mask=m_ok[:, None] & k_ok[None, :], other=0.0)                  # [M, K]
            w_ok = k_ok[:, None] & n_ok[None, :]
            gt = tl.load(g_base + offs_k[:, None] * sg_d, mask=w_ok, other=0.0)         # [K, N] = gate[e].T
            ut = tl.load(u_base + offs_k[:, None] * su_d, mask=w_ok, other=0.0)         # [K, N] = up[e].T
            acc_g += _dot(xt, gt, IEEE, UPCAST)
            acc_u += _dot(xt, ut, IEEE, UPCAST)
        dt = h_ptr.dtype.element_ty
        a = _round(_act(_round(acc_g, dt, RNE), ACT), dt, RNE)      # F.linear rounds, so does act
        h = _round(a * _round(acc_u, dt, RNE), dt, RNE).to(dt)         # exact cast: already rounded
        tl.store(h_ptr + ids[:, None].to(tl.int64) * I + offs_n[None, :], h,
                 mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, wt_ptr, y_ptr, ids_ptr, blk_e_ptr, n_assign, E, I, D, sw_e, sw_d, sw_i,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 IEEE: tl.constexpr, UPCAST: tl.constexpr, RNE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(blk_e_ptr + pid_m)
    if e < E:
        ids = tl.load(ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))   # [M]
        m_ok = ids < n_assign
        rows = ids.to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                     # output columns (D)
        n_ok = offs_n < D
        w_base = w_ptr + e.to(tl.int64) * sw_e + offs_n[None, :].to(tl.int64) * sw_d
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, I, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < I
            ht = tl.load(h_ptr + rows[:, None] * I + offs_k[None, :],
                         mask=m_ok[:, None] & k_ok[None, :], other=0.0)                  # [M, K]
            wt = tl.load(w_base + offs_k[:, None] * sw_i, mask=k_ok[:, None] & n_ok[None, :],
                         other=0.0)                                                       # [K, N] = down[e].T
            acc += _dot(ht, wt, IEEE, UPCAST)
        route = tl.load(wt_ptr + rows, mask=m_ok, other=0.0)                             # [M] fp32
        y = _round(acc, h_ptr.dtype.element_ty, RNE) * route[:, None]                   # F.linear rounds
        tl.store(y_ptr + rows[:, None] * D + offs_n[None, :], y, mask=m_ok[:, None] & n_ok[None, :])


def _tiles(n_assign: int, E: int, I: int, D: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, kernel 1's BLOCK_N and BLOCK_K, kernel 2's BLOCK_N and BLOCK_K).

    Rows per tile follow the mean rows per expert: LLaDA2-mini (E=256, k=8) averages 0.03 at T=1 and
    32 at T=1024, so small batches take 16 (tl.dot's minimum) and waste little on padding. Under one row
    an expert (decode-sized batches) every tile is a lone weight-streaming program, so columns are cut
    to 32 to double the programs: at T=1 kernel 1 gets 8 experts x 512/32 = 128, about an H200's 132 SMs.
    """
    avg = n_assign / E
    bm = 16 if avg <= 16 else 32 if avg <= 64 else 64
    wide = 32 if avg < 1 else 64

    def fit(n: int, cap: int) -> int:
        return min(cap, max(16, next_pow2(n)))

    return bm, fit(I, wide), fit(D, 64), fit(D, wide), fit(I, 64)


def align_by_expert(topk_idx: torch.Tensor, E: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Group the assignments by expert, each group padded to a multiple of ``block_m``. No host sync.

    ``topk_idx`` holds ids in ``[0, E]``; ``E`` marks an assignment to an expert another rank holds
    (tensor parallelism), which gets no row. Returns ``ids`` [P] int32 (assignment ``t*k + slot`` per
    padded row, ``T*k`` on pad rows) and ``block_expert`` [P / block_m] int32 (the expert of each tile,
    ``E`` for tiles past the last group), with ``P = T*k + min(E, T*k) * (block_m - 1)`` rounded up to
    ``block_m``: the most any routing pads to.
    """
    flat = topk_idx.reshape(-1)                                                    # [n]
    n, dev = flat.numel(), flat.device
    order = torch.argsort(flat, stable=True)                                      # assignments by expert
    # scatter_add, not bincount: CUDA bincount reads the max back to the host to size its output.
    counts = torch.zeros(E + 1, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))[:E]
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = padded.cumsum(0)                                                     # [E]
    first = (pad_end - padded) - (counts.cumsum(0) - counts)                       # pad start - sorted start
    e_sorted = flat[order]
    P = triton.cdiv(n + min(E, n) * (block_m - 1), block_m) * block_m
    dest = F.pad(first, (0, 1))[e_sorted] + torch.arange(n, device=dev)           # padded row of each
    dest = torch.where(e_sorted < E, dest, P)                                     # another rank's: row P, dropped
    ids = torch.full((P + 1,), n, dtype=torch.int32, device=dev)
    ids[dest] = order.to(torch.int32)
    starts = torch.arange(0, P, block_m, device=dev)
    block_expert = torch.searchsorted(pad_end, starts, right=True).to(torch.int32)  # E past the end
    return ids[:P], block_expert


def fused_moe(x: torch.Tensor, topk_idx: torch.Tensor, topk_weight: torch.Tensor, gate: torch.Tensor,
              up: torch.Tensor, down: torch.Tensor, activation: str = "silu", foreign: bool = False) -> torch.Tensor:
    """``sum_k w[t,k] * down_e(act(gate_e(x_t)) * up_e(x_t))`` with ``e = topk_idx[t,k]`` (Triton).

    x: [T, D] (fp32, fp16 or bf16; any strides); topk_idx: [T, k] int64 (or int32), every entry in
    [0, E) (not checked: that would sync with the host), or in [0, E] with ``foreign``, where E is
    another rank's expert: never computed, it adds nothing; topk_weight: [T, k] (read as fp32);
    gate, up: [E, I, D] and down: [E, D, I] in x's dtype, any strides (views of a fused gate_up
    tensor or a transposed down work without a copy). Returns [T, D] in x's dtype.
    """
    if activation not in ACT_CODES:
        raise ValueError(f"fused_moe: activation {activation!r} is not supported; use one of {sorted(ACT_CODES)}")
    T, D = x.shape
    E, I, _ = gate.shape
    k = topk_idx.shape[1]
    assert gate.shape == up.shape == (E, I, D) and down.shape == (E, D, I), (gate.shape, up.shape, down.shape)
    assert topk_idx.shape == topk_weight.shape == (T, k), (topk_idx.shape, topk_weight.shape)
    assert gate.dtype == up.dtype == down.dtype == x.dtype, (x.dtype, gate.dtype, up.dtype, down.dtype)
    n = T * k
    if n == 0:
        return torch.zeros_like(x)
    bm, bn1, bk1, bn2, bk2 = _tiles(n, E, I, D)
    ids, block_expert = align_by_expert(topk_idx.long(), E, bm)
    route = topk_weight.reshape(-1).to(torch.float32).contiguous()                # [n]
    h = torch.empty(n, I, dtype=x.dtype, device=x.device)                         # [T*k, I]
    # Pad rows are never written: every real row of h and y is written by exactly one tile, and
    # another rank's assignments by none (their rows of y stay 0).
    y = (torch.zeros if foreign else torch.empty)(n, D, dtype=torch.float32, device=x.device)   # [T*k, D]
    # dot_upcast(x): interpreter and bf16, the case that needs the fp32 dot operands and the hand rounding.
    ieee, upcast, tiles = is_fp32(x), dot_upcast(x), block_expert.numel()
    _gate_up_kernel[(tiles, triton.cdiv(I, bn1))](
        x, gate, up, h, ids, block_expert, n, E, I, D, *x.stride(), *gate.stride(), *up.stride(),
        TOP_K=k, ACT=ACT_CODES[activation], BLOCK_M=bm, BLOCK_N=bn1, BLOCK_K=bk1, IEEE=ieee, UPCAST=upcast,
        RNE=upcast, num_warps=4)
    _down_kernel[(tiles, triton.cdiv(D, bn2))](
        h, down, route, y, ids, block_expert, n, E, I, D, *down.stride(),
        BLOCK_M=bm, BLOCK_N=bn2, BLOCK_K=bk2, IEEE=ieee, UPCAST=upcast, RNE=upcast,
        num_warps=4)
    return y.view(T, k, D).sum(1).to(x.dtype)                                     # fp32 combine, one cast
