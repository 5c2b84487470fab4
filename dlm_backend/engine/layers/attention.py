"""Attention dispatch and the engine's packed attention.

Model code calls ``attention(q, k, v, layer)`` and never knows how the batch is laid out: the
runner sets a :class:`ForwardContext` around each forward naming an attention *backend* (an object
with ``attend(q, k, v, layer)``) and whether the Triton kernels run. The engine's backends are
:class:`PackedAttention` (below: every sequence's query window packed into one ``[T, ...]`` batch,
attention per sequence over its own keys), the paged pool's (layers/paged_attention.py) and the
static block step of engine/forward/cuda_graphs.py;
code outside the engine (a training loop) brings its own. Per-forward metadata travels in the
context, as in nano-vllm, so models keep the signature ``forward(input_ids, positions)``.

Attention runs per sequence: a row never sees another request's keys or a pad, which is what makes
outputs batch-invariant.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class DecoderRows:
    """Rows of a forward that run an encoder-decoder family's decoder (DiffusionGemma's denoising
    passes; its other rows are encoder rows writing keys and values): ``rows [n]`` int64 and the
    self-conditioning input each row adds to its embedding, ``conditioning [n, D]`` (zeros on a
    canvas's first pass, where the reference has none)."""

    rows: torch.Tensor
    conditioning: torch.Tensor


@dataclass
class ForwardContext:
    """How one forward runs: its attention backend, whether layers use their Triton kernels
    (decided once per engine, see :func:`dlm_backend.engine.kernels.resolve_kernels`) and, for an
    encoder-decoder family, which rows are decoder rows (None: all are encoder rows)."""

    attention: object = None
    triton: bool = False
    decoder: DecoderRows | None = None


_local = threading.local()


@contextlib.contextmanager
def forward_context(ctx: ForwardContext):
    """Run the enclosed model calls with ``ctx`` (thread-local, restored on exit)."""
    previous = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = previous


def current_context() -> ForwardContext | None:
    return getattr(_local, "ctx", None)


def triton_enabled() -> bool:
    """Whether the layers of the forward in progress run their Triton kernels (False outside one)."""
    ctx = getattr(_local, "ctx", None)
    return ctx is not None and ctx.triton


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, window: int | None = None,
              scale: float | None = None) -> torch.Tensor:
    """q: [T, H, D], k/v: [T, Hkv, D] (rotated) -> [T, H, D], by the current backend.

    ``window`` (a sliding-window layer: Gemma's 1024) hides keys ``window`` or more positions back:
    a causal or block-causal query at i sees keys j > i - window; a bidirectional pass sees its own
    fed positions whole and, before them, the keys j > start - window (DiffusionGemma's decoder over
    its cache, as Hugging Face's sliding cache keeps the last window - 1 positions). ``scale`` is the
    softmax scale (None: 1/sqrt(D); Gemma 4's is 1.0, its q/k norms stand in for it). Backends take
    both as keywords; they are only passed when set, so a backend without them keeps working for
    models that use neither.
    """
    ctx = current_context()
    if ctx is None or ctx.attention is None:
        raise RuntimeError("attention called outside forward_context(); the runner sets it")
    if window is None and scale is None:
        return ctx.attention.attend(q, k, v, layer)
    return ctx.attention.attend(q, k, v, layer, window=window, scale=scale)


@dataclass
class Segment:
    """One sequence's slice of the packed batch, attending over its own rows only.

    ``rows``: its rows in the packed tensors. ``pos_start``: canvas position of its first query row.
    ``block_size``: ``None`` attends bidirectionally; L makes attention block-causal with blocks of
    L aligned to position 0 (a query at position i sees a key at j iff j // L <= i // L), as the
    block-diffusion families (LLaDA2, SDAR, Fast-dLLM v2) are trained and decoded. Requests that
    keep keys and values between passes attend over the paged pool instead (layers/paged_attention.py).
    """

    rows: slice
    pos_start: int
    block_size: int | None = None

    def mask(self, n_keys: int, key_start: int, device, window: int | None = None) -> torch.Tensor | None:
        """The bool [q, k] block-causal mask for keys at positions ``key_start..`` (None if bidirectional),
        keys ``window`` or more positions behind a query hidden (a bidirectional segment sees its own
        rows whole: see :func:`attention`)."""
        if self.block_size is None:
            return None
        q = torch.arange(self.pos_start, self.pos_start + self.rows.stop - self.rows.start, device=device)
        k = torch.arange(key_start, key_start + n_keys, device=device)
        mask = (k[None, :] // self.block_size) <= (q[:, None] // self.block_size)
        return mask if window is None else mask & (k[None, :] > q[:, None] - window)


@dataclass
class PackedAttention:
    """Attention for packed segments, each over its own keys."""

    segments: list[Segment]
    #: per-forward int32 launch metadata for the kernel path, built at the first layer (one H2D copy).
    _meta: dict = field(default_factory=dict, repr=False)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, window: int | None = None,
               scale: float | None = None) -> torch.Tensor:
        if triton_enabled() and all(s.block_size is None for s in self.segments) and scale is None:
            return self._kernel(q, k, v)               # a bidirectional segment sees its rows whole: no window
        out = torch.empty_like(q)
        for seg in self.segments:
            qs = q[seg.rows].transpose(0, 1)                                   # [H, q, D]
            ks, vs = k[seg.rows].transpose(0, 1), v[seg.rows].transpose(0, 1)  # [Hkv, q, D]
            mask = seg.mask(ks.shape[1], seg.pos_start, q.device, window)
            out[seg.rows] = sdpa(qs[None], ks[None], vs[None], mask, scale)[0].transpose(0, 1)
        return out

    def _kernel(self, q, k, v) -> torch.Tensor:
        """The Triton flash kernel, one launch for every segment (their keys packed in ``k``, seen
        through a batch stride of 0; queries gathered only when the segments are not the leading rows)."""
        from dlm_backend.engine.kernels.attention import attention as flash

        dev = q.device
        if "meta" not in self._meta:
            cu, starts, lens = [0], [], []
            for s in self.segments:
                n = s.rows.stop - s.rows.start
                cu.append(cu[-1] + n)
                starts.append(s.rows.start)
                lens.append(n)
            index = None if starts == cu[:-1] else torch.cat(
                [torch.arange(s.rows.start, s.rows.stop) for s in self.segments]).to(dev)
            self._meta["meta"] = (_i32(cu, dev), _i32(starts, dev), _i32(lens, dev), max(lens), index, cu[-1])
        cu, starts, lens, max_q, index, total = self._meta["meta"]
        kv = [t.transpose(0, 1)[None].expand(len(self.segments), -1, -1, -1) for t in (k, v)]  # [B, Hkv, T, D]
        o = flash(q if index is None else q[index], kv[0], kv[1], cu, starts, lens, max_q)
        out = torch.empty_like(q)
        if index is None:
            out[:total] = o[:total]
        else:
            out[index] = o
        return out


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
         scale: float | None = None) -> torch.Tensor:
    """The torch reference of every attention here: q [B, Hq, M, D], k/v [B, Hkv, L, D] (each key
    head shared by Hq / Hkv query heads), optional bool ``mask`` broadcastable to [B, Hq, M, L] ->
    [B, Hq, M, D]; ``scale`` None is 1/sqrt(D)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def _i32(values: list[int], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)
