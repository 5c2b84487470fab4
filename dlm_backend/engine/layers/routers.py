"""MoE routers and the stacked expert weights they route to.

A router turns one token's gate logits into ``topk_idx [T, k]`` and ``topk_weight [T, k]`` (fp32);
:func:`dlm_backend.engine.layers.moe.routed_experts` then runs the chosen experts and combines them.
The families differ only here:

* :func:`grouped_sigmoid_topk`: LLaDA2 / BailingMoeV2 (DeepSeek-V3 style): sigmoid scores, an
  expert bias that steers the choice but not the weights, group-limited top-k.
* :func:`softmax_topk`: Qwen3-MoE (SDAR-MoE): softmax over every expert, top-k, optional
  renormalisation.

:class:`StackedExperts` holds E SwiGLU experts as three ``[E, ...]`` parameters; checkpoints store
them per expert (``...experts.7.gate_proj.weight``), and :func:`stacked_expert_name` tells the loader
which slice each of those tensors fills.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from dlm_backend.engine.layers.moe import experts
from dlm_backend.engine.parallel.group import build_group

_EXPERT_TENSOR = re.compile(r"^(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def stacked_expert_name(name: str) -> tuple[str, int] | None:
    """``a.experts.7.gate_proj.weight`` -> ``("a.experts.gate_proj", 7)``; None for any other name
    (``shared_experts.gate_proj.weight`` has no expert index and loads under its own name)."""
    m = _EXPERT_TENSOR.match(name)
    return (f"{m[1]}.{m[3]}", int(m[2])) if m else None


class StackedExperts(nn.Module):
    """E SwiGLU experts of width I: ``gate_proj``, ``up_proj`` [E, I, D] and ``down_proj`` [E, D, I],
    the layout :func:`~dlm_backend.engine.layers.moe.routed_experts` (and its fused kernel) reads.

    Under tensor parallelism the experts are partitioned (EP = TP, as dInfer): a rank holds experts
    ``[r E / world, (r + 1) E / world)`` whole, computes only the assignments routed to them, and the
    block's one all-reduce combines the ranks' partial sums."""

    quantized_params = ("gate_proj", "up_proj", "down_proj")     # each may be a stack of quantized experts

    def __init__(self, num_experts: int, hidden: int, width: int):
        super().__init__()
        self.tp = build_group()
        self.mine = self.tp.split(num_experts, "the experts") if self.tp else slice(0, num_experts)
        n = self.mine.stop - self.mine.start
        self.gate_proj = nn.Parameter(torch.empty(n, width, hidden))
        self.up_proj = nn.Parameter(torch.empty(n, width, hidden))
        self.down_proj = nn.Parameter(torch.empty(n, hidden, width))

    def local_index(self, expert: int) -> int | None:
        """Where checkpoint expert ``expert`` sits here (None: another rank holds it)."""
        return expert - self.mine.start if self.mine.start <= expert < self.mine.stop else None

    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weight: torch.Tensor,
                activation: str = "silu") -> torch.Tensor:
        """The routed experts' weighted sum for ``x [T, D]`` (this rank's share of it under TP)."""
        if self.tp is None:
            return experts(x, topk_idx, topk_weight, self.gate_proj, self.up_proj, self.down_proj, activation)
        n = self.mine.stop - self.mine.start
        local = topk_idx - self.mine.start
        local = local.masked_fill((local < 0) | (local >= n), n)          # n: another rank's expert
        return experts(x, local, topk_weight, self.gate_proj, self.up_proj, self.down_proj, activation,
                       foreign=True)


def grouped_sigmoid_topk(logits: torch.Tensor, expert_bias: torch.Tensor, top_k: int, n_group: int,
                         topk_group: int, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaDA2's router on fp32 ``logits [T, E]``; returns ``(topk_idx [T, k], topk_weight [T, k])``.

    The choice uses the biased scores ``sigmoid(logits) + expert_bias``: each of the ``n_group``
    groups scores the sum of its two best experts, the best ``topk_group`` groups stay, and the top
    ``top_k`` experts among them win (ordered by biased score, as the reference's ``topk``). The
    weights are the *unbiased* sigmoid scores of the winners, normalised (``+ 1e-20``, only when
    k > 1, as the reference) and scaled by ``scaling``.
    """
    scores = torch.sigmoid(logits)                                              # [T, E]
    biased = scores + expert_bias.float()
    T, E = biased.shape
    group_scores = biased.view(T, n_group, -1).topk(2, dim=-1).values.sum(-1)   # [T, G]
    groups = group_scores.topk(topk_group, dim=-1, sorted=False).indices        # [T, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    keep = keep.repeat_interleave(E // n_group, dim=1)                          # [T, E]
    topk_idx = biased.masked_fill(~keep, float("-inf")).topk(top_k, dim=-1).indices
    weight = scores.gather(1, topk_idx)                                         # [T, k]
    if top_k > 1:
        weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
    return topk_idx, weight * scaling


def softmax_topk(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-MoE's router on ``logits [T, E]``: softmax in fp32 over every expert, the ``top_k``
    largest (descending), renormalised to sum to 1 when ``renormalize``."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)                  # [T, E]
    weight, topk_idx = probs.topk(top_k, dim=-1)
    if renormalize:
        weight = weight / weight.sum(dim=-1, keepdim=True)
    return topk_idx, weight
