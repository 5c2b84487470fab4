"""Bidirectional, cache-aware attention over a packed batch.

The runner packs every sequence's query window into one ``[T, ...]`` token tensor (no padding), so
linear layers see all requests at once while attention runs per sequence: a row never sees another
request's keys or a pad, which is what makes outputs batch-invariant. Per-forward metadata travels
in a context (as in nano-vllm) so model code keeps the signature ``forward(input_ids, positions)``.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dlm_backend.engine.kernels import use_kernels


@dataclass
class Segment:
    """One sequence's slice of the packed batch.

    ``rows``: its rows in the packed tensors. ``pos_start``: canvas position of its first query row.
    ``cache``: a :class:`~dlm_backend.engine.cache.KVCache` to write the new keys/values into (at
    ``pos_start..``) and to attend over in full; ``None`` attends over the new keys only.
    """

    rows: slice
    pos_start: int
    cache: object | None = None


@dataclass
class AttentionContext:
    """Per-forward attention metadata: the packed segments, or ``rows=(B, L)`` for B equal rows
    without cache (training), which runs as one batched attention call."""

    segments: list[Segment] = field(default_factory=list)
    rows: tuple[int, int] | None = None
    #: with ``rows``: ``[B, L, L]`` bool, which keys each query may see (packed training rows hold
    #: several examples; ``None`` = all of its row).
    attend: torch.Tensor | None = None
    #: static-shape batch (engine/graphs.py): an object whose ``attend(q, k, v, layer)`` does it all.
    batch: object | None = None
    #: per-forward int32 launch metadata for the kernel path, built on first use (one H2D copy).
    _meta: dict = field(default_factory=dict, repr=False)


_local = threading.local()


@contextlib.contextmanager
def attention_context(ctx: AttentionContext):
    previous = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = previous


def get_context() -> AttentionContext:
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        raise RuntimeError("attention called outside attention_context(); the runner sets it")
    return ctx


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """q: [T, H, D], k/v: [T, Hkv, D] (rotated) -> [T, H, D]."""
    ctx = get_context()
    if ctx.batch is not None:
        return ctx.batch.attend(q, k, v, layer)
    if use_kernels(q) and ctx.attend is None:
        return _attention_kernel_path(ctx, q, k, v, layer)
    n_rep = q.shape[1] // k.shape[1]
    if ctx.rows is not None:
        B, L = ctx.rows
        qb, kb, vb = (t.view(B, L, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))  # [B, H, L, D]
        if n_rep > 1:
            kb, vb = kb.repeat_interleave(n_rep, dim=1), vb.repeat_interleave(n_rep, dim=1)
        mask = None if ctx.attend is None else ctx.attend[:, None]                          # [B, 1, L, L]
        o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, is_causal=False)
        return o.transpose(1, 2).reshape(q.shape)
    out = torch.empty_like(q)
    for seg in ctx.segments:
        qs = q[seg.rows].transpose(0, 1)                          # [H, q, D]
        ks, vs = k[seg.rows].transpose(0, 1), v[seg.rows].transpose(0, 1)   # [Hkv, q, D]
        if seg.cache is not None:
            ks, vs = seg.cache.write(layer, seg.pos_start, ks, vs)  # [Hkv, L, D]
        if n_rep > 1:
            ks = ks.repeat_interleave(n_rep, dim=0)
            vs = vs.repeat_interleave(n_rep, dim=0)
        o = F.scaled_dot_product_attention(qs[None], ks[None], vs[None], attn_mask=None, is_causal=False)
        out[seg.rows] = o[0].transpose(0, 1)
    return out


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_len: torch.Tensor) -> torch.Tensor:
    """Torch attention for a static-shape batch (engine/graphs.py): q [B, M, Hq, D] (every sequence
    has M rows), k/v [B, Hkv, L, D] with keys ``0..k_len[b]`` valid. A key mask instead of slicing
    keeps it free of host syncs, so it can be captured in a CUDA graph."""
    n_rep = q.shape[2] // k.shape[1]
    kb, vb = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)         # [B, Hq, L, D]
    keep = torch.arange(k.shape[2], device=k.device)[None, :] < k_len[:, None]   # [B, L]
    o = F.scaled_dot_product_attention(q.transpose(1, 2), kb, vb, attn_mask=keep[:, None, None, :])
    return o.transpose(1, 2)                                                      # [B, M, Hq, D]


def _i32(values: list[int], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def _attention_kernel_path(ctx: AttentionContext, q, k, v, layer: int) -> torch.Tensor:
    """The Triton flash kernel: one launch for all uncached rows (their keys packed in ``k``, seen
    through a batch stride of 0), one per cached sequence (its own cache tensor). No repeat_interleave."""
    from dlm_backend.engine.kernels.attention import attention as flash

    dev = q.device
    if ctx.rows is not None:
        B, L = ctx.rows
        if "rows" not in ctx._meta:
            ctx._meta["rows"] = (_i32(list(range(0, B * L + 1, L)), dev), _i32([0] * B, dev), _i32([L] * B, dev))
        kb, vb = (t.view(B, L, t.shape[1], t.shape[2]).transpose(1, 2) for t in (k, v))   # [B, Hkv, L, D]
        return flash(q, kb, vb, *ctx._meta["rows"], L)
    out = torch.empty_like(q)
    plain = [s for s in ctx.segments if s.cache is None]
    if plain:
        if "plain" not in ctx._meta:
            # Each uncached segment attends over its own rows of k/v: k_start = its first row. Their
            # queries are gathered only when the segments are not already the leading rows.
            cu, starts, lens = [0], [], []
            for s in plain:
                n = s.rows.stop - s.rows.start
                cu.append(cu[-1] + n)
                starts.append(s.rows.start)
                lens.append(n)
            contiguous = starts == cu[:-1]
            index = None if contiguous else torch.cat([torch.arange(s.rows.start, s.rows.stop) for s in plain]).to(dev)
            ctx._meta["plain"] = (_i32(cu, dev), _i32(starts, dev), _i32(lens, dev), max(lens), index, cu[-1])
        cu, starts, lens, max_q, index, total = ctx._meta["plain"]
        qp = q if index is None else q[index]
        kv = [t.transpose(0, 1)[None].expand(len(plain), -1, -1, -1) for t in (k, v)]  # [B, Hkv, T, D]
        o = flash(qp, kv[0], kv[1], cu, starts, lens, max_q)
        if index is None:
            out[:total] = o[:total]
        else:
            out[index] = o
    for i, seg in enumerate(ctx.segments):
        if seg.cache is None:
            continue
        ks, vs = seg.cache.write(layer, seg.pos_start, k[seg.rows].transpose(0, 1), v[seg.rows].transpose(0, 1))
        key = ("seg", i)
        if key not in ctx._meta:
            n = seg.rows.stop - seg.rows.start
            ctx._meta[key] = (_i32([0, n], dev), _i32([0], dev), _i32([ks.shape[1]], dev), n)
        cu, ks0, kl, n = ctx._meta[key]
        out[seg.rows] = flash(q[seg.rows], ks[None], vs[None], cu, ks0, kl, n)
    return out
