"""Tensor-parallel layers: each holds this rank's part of a checkpoint tensor and says how to read it.

Built under :func:`~dlm_backend.engine.parallel.group.building` with a group of one device, every
layer here is the plain torch layer it extends (same parameters, same forward), so a one-device
engine runs exactly what it ran before. With a group:

* :class:`ColumnLinear` keeps rows of the ``[out, in]`` weight (q/k/v, gate/up): no communication;
  a fused q/k/v keeps three row ranges (:func:`qkv_linear`); key/value heads split, or are
  replicated when the ranks outnumber them (:meth:`TPGroup.kv_heads`).
* :class:`RowLinear` keeps columns (o/down) and all-reduces its partial output, the bias added once
  after; ``reduce=False`` leaves the sum to the caller (an MoE block sums routed and shared experts
  first, then reduces once).
* :class:`VocabEmbedding` and :class:`VocabLinear` keep ``ceil(V / world)`` rows of the vocabulary;
  the embedding all-reduces (one rank holds each id), the head's logits are gathered by the model
  for the rows the sampler reads (``DiffusionLM.compute_logits``).

``load_shard(param, part)`` reads this rank's piece from a safetensors slice (``safe_open(...)
.get_slice(name)``), so a rank reads only its bytes; ``full_shape(param)`` is the checkpoint's shape,
which the loader checks before slicing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from dlm_backend.engine.parallel.group import TPGroup, build_group


class Sharded(ABC):
    """A layer whose parameters hold one rank's part of the checkpoint's tensors (the loader checks
    each tensor against :meth:`full_shape`, then stores :meth:`load_shard` of its slice)."""

    tp: TPGroup | None

    @abstractmethod
    def full_shape(self, param: str) -> tuple[int, ...]:
        """The checkpoint's shape of parameter ``param`` ("weight", "bias", ...), all ranks together."""

    @abstractmethod
    def load_shard(self, param: str, part) -> torch.Tensor:
        """This rank's piece of ``param`` from ``part``, a safetensors slice of the whole tensor."""


class ColumnLinear(nn.Linear, Sharded):
    """``nn.Linear(in, out)`` keeping the output rows ``parts`` (default: an even 1/world)."""

    quantized_params = ("weight",)          # a quantized weight may stand in (engine/quant)

    def __init__(self, in_features: int, out_features: int, bias: bool = False, what: str = "a layer's width",
                 parts: list[slice] | None = None):
        self.tp = build_group()
        if parts is None:
            parts = [self.tp.split(out_features, what) if self.tp else slice(0, out_features)]
        self.parts, self.full_out = parts, out_features
        super().__init__(in_features, sum(p.stop - p.start for p in parts), bias=bias)

    def full_shape(self, param: str) -> tuple[int, ...]:
        return (self.full_out, self.in_features) if param == "weight" else (self.full_out,)

    def load_shard(self, param: str, part) -> torch.Tensor:
        pieces = [part[p] for p in self.parts]                     # [rows, in] (or [rows] for the bias)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def kv_linear(in_features: int, kv_heads: int, heads: int, head_dim: int, bias: bool = False) -> ColumnLinear:
    """A k or v projection ``[Hkv * hd, in]`` keeping this rank's key/value heads."""
    tp = build_group()
    h = tp.kv_heads(kv_heads, heads) if tp else slice(0, kv_heads)
    return ColumnLinear(in_features, kv_heads * head_dim, bias, parts=[slice(h.start * head_dim, h.stop * head_dim)])


def local_heads(heads: int, kv_heads: int) -> tuple[int, int]:
    """(query heads, key/value heads) of this rank, for the model under construction."""
    tp = build_group()
    if tp is None:
        return heads, kv_heads
    q, kv = tp.split(heads, "the attention heads"), tp.kv_heads(kv_heads, heads)
    return q.stop - q.start, kv.stop - kv.start


def qkv_linear(in_features: int, heads: int, kv_heads: int, head_dim: int, bias: bool = False) -> ColumnLinear:
    """A fused ``[(H + 2 Hkv) * hd, in]`` q/k/v projection (LLaDA2's ``query_key_value``) keeping this
    rank's query heads and its key/value heads of both k and v: three row ranges of the full weight."""
    tp = build_group()
    q = tp.split(heads, "the attention heads") if tp else slice(0, heads)
    kv = tp.kv_heads(kv_heads, heads) if tp else slice(0, kv_heads)
    rows = [q, slice(heads + kv.start, heads + kv.stop), slice(heads + kv_heads + kv.start, heads + kv_heads + kv.stop)]
    return ColumnLinear(in_features, (heads + 2 * kv_heads) * head_dim, bias,
                        parts=[slice(r.start * head_dim, r.stop * head_dim) for r in rows])


class RowLinear(nn.Linear, Sharded):
    """``nn.Linear(in, out)`` keeping an even 1/world of the input columns; the partial products are
    summed over the ranks (``reduce``) before the bias is added, once."""

    quantized_params = ("weight",)

    def __init__(self, in_features: int, out_features: int, bias: bool = False, what: str = "a layer's width",
                 reduce: bool = True):
        self.tp = build_group()
        self.cols = self.tp.split(in_features, what) if self.tp else slice(0, in_features)
        self.full_in, self.reduce = in_features, reduce
        super().__init__(self.cols.stop - self.cols.start, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:                 # [T, in / world] -> [T, out]
        if self.tp is None:
            return super().forward(x)
        y = F.linear(x, self.weight)
        if self.reduce:
            self.tp.all_reduce(y)
        return y if self.bias is None else y + self.bias

    def full_shape(self, param: str) -> tuple[int, ...]:
        return (self.out_features, self.full_in) if param == "weight" else (self.out_features,)

    def load_shard(self, param: str, part) -> torch.Tensor:
        return part[:, self.cols] if param == "weight" else part[:]


def _vocab_rows(tp: TPGroup, vocab: int, part) -> torch.Tensor:
    """This rank's ``ceil(V / world)`` rows of a ``[V, D]`` table, zero rows padding the last rank."""
    lo, hi = tp.vocab(vocab)
    rows = part[lo:hi]
    per = -(-vocab // tp.world)
    if rows.shape[0] < per:
        rows = torch.cat([rows, rows.new_zeros(per - rows.shape[0], *rows.shape[1:])])
    return rows


class VocabEmbedding(nn.Embedding, Sharded):
    """``nn.Embedding(V, D)`` keeping this rank's rows; each id is looked up by the rank holding it and
    the others add zeros (one all-reduce, exact: a sum of one value and zeros)."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        self.tp = build_group()
        self.full_rows = num_embeddings
        rows = -(-num_embeddings // self.tp.world) if self.tp else num_embeddings
        super().__init__(rows, embedding_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:               # [T] -> [T, D]
        if self.tp is None:
            return super().forward(ids)
        lo, hi = self.tp.vocab(self.full_rows)
        outside = (ids < lo) | (ids >= hi)
        x = F.embedding((ids - lo).masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill(outside[:, None], 0))

    def full_shape(self, param: str) -> tuple[int, ...]:
        return (self.full_rows, self.embedding_dim)

    def load_shard(self, param: str, part) -> torch.Tensor:
        return _vocab_rows(self.tp, self.full_rows, part)


class VocabLinear(nn.Linear, Sharded):
    """An LM head ``[V, D]`` keeping this rank's rows; the model gathers the logits it computes from
    them (``DiffusionLM.compute_logits``), for the sampler's rows only."""

    quantized_params, quantized_role = ("weight",), "head"      # engine/quant's HEAD_METHODS say how

    def __init__(self, in_features: int, vocab: int):
        self.tp = build_group()
        self.full_rows = vocab
        super().__init__(in_features, -(-vocab // self.tp.world) if self.tp else vocab, bias=False)

    def full_shape(self, param: str) -> tuple[int, ...]:
        return (self.full_rows, self.in_features)

    def load_shard(self, param: str, part) -> torch.Tensor:
        return _vocab_rows(self.tp, self.full_rows, part)
