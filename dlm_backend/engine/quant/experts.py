"""Quantized MoE experts: E quantized ``[N, K]`` weights standing in for one stacked ``[E, N, K]``
parameter (``StackedExperts.gate_proj``, ``GemmaExperts.gate_up_proj``, ...).

``stack[e]`` is expert ``e``'s :class:`~dlm_backend.engine.quant.weight.QuantizedWeight`, which is
all :func:`~dlm_backend.engine.layers.moe.routed_experts` reads (``F.linear(h, gate[e])``), so the
quantized experts run through the same sort-once, gather-back combine as float ones. ``stack[:, a:b]``
keeps output rows ``a:b`` of every expert (DiffusionGemma splits its fused gate/up that way):
split once at load by :meth:`split_rows`, then each half is an ordinary stack.
"""

from __future__ import annotations

import torch
from torch import nn

from dlm_backend.engine.quant.weight import QuantizedWeight


class QuantizedExperts(nn.Module):
    """A stack of E quantized expert weights of one shape ``[N, K]``."""

    def __init__(self, experts: list[QuantizedWeight]):
        super().__init__()
        self.experts = nn.ModuleList(experts)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.experts), *self.experts[0].shape))

    @property
    def kind(self) -> str:
        return self.experts[0].kind

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.experts)

    def __len__(self) -> int:
        return len(self.experts)

    def __getitem__(self, index) -> QuantizedWeight | QuantizedExperts:
        """Expert ``index``'s weight, or (a slice: a rank's partition of the experts) a smaller stack."""
        if isinstance(index, slice):
            return QuantizedExperts(list(self.experts[index]))
        return self.experts[index]

    def split_rows(self, at: int) -> tuple[QuantizedExperts, QuantizedExperts]:
        """(rows ``:at``, rows ``at:``) of every expert: a fused gate/up stack as two stacks."""
        return (QuantizedExperts([e.rows(slice(0, at)) for e in self.experts]),
                QuantizedExperts([e.rows(slice(at, None)) for e in self.experts]))

    def prepare(self, device, dtype: torch.dtype) -> QuantizedExperts:
        for e in self.experts:
            e.prepare(device, dtype)
        return self


def is_quantized(weight) -> bool:
    """Whether a layer's weight (or stacked experts) is held quantized."""
    return isinstance(weight, (QuantizedWeight, QuantizedExperts))
