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
    n_rep = q.shape[1] // k.shape[1]
    if ctx.rows is not None:
        B, L = ctx.rows
        qb, kb, vb = (t.view(B, L, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))  # [B, H, L, D]
        if n_rep > 1:
            kb, vb = kb.repeat_interleave(n_rep, dim=1), vb.repeat_interleave(n_rep, dim=1)
        o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=None, is_causal=False)
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
