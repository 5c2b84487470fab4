"""Mixture-of-experts: the routed experts' computation, shared by every MoE family.

Routers differ by family (LLaDA2's sigmoid, group-limited top-k with an expert bias; Qwen3-MoE's
softmax top-k) and live with their models; once a router has chosen ``topk_idx`` and ``topk_weight``
per token, every family runs the same gated MLP per expert and the same weighted combine:
:func:`experts`, which runs the fused Triton kernel (``dlm_backend.engine.kernels.moe``) on the
kernel path and :func:`routed_experts`, its torch reference, otherwise. Expert weights are stacked
``[E, ...]`` tensors (the loader fills them from per-expert checkpoint tensors, see
``DiffusionLM.stacked_name``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlm_backend.engine.layers.attention import triton_enabled

ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


def routed_experts(x: torch.Tensor, topk_idx: torch.Tensor, topk_weight: torch.Tensor, gate: torch.Tensor,
                   up: torch.Tensor, down: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """``sum_k w[t,k] * down_e(act(gate_e(x_t)) * up_e(x_t))`` with ``e = topk_idx[t,k]``.

    x: [T, D]; topk_idx: [T, k] int64; topk_weight: [T, k] float32; gate, up: [E, I, D]; down: [E, D, I].
    An id equal to E marks an assignment to an expert another rank holds (tensor parallelism): skipped.
    Each expert runs on its own tokens in x's dtype; the combine accumulates in float32 and casts back
    (LLaDA2's and Qwen3-MoE's order). This is the fused MoE kernel's torch reference.
    """
    act = ACTIVATIONS[activation]
    E = gate.shape[0]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)             # [T, D]
    k = topk_idx.shape[1]
    order = topk_idx.reshape(-1).argsort(stable=True)                           # assignments grouped by expert
    expert_of = topk_idx.reshape(-1)[order]
    # ids == E (another rank's experts, sorted last) are not counted, so never computed here
    counts = torch.bincount(expert_of, minlength=E).tolist()[:E]                # one host sync a layer
    token_of, weight_of = order // k, topk_weight.reshape(-1)[order]
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        token, w = token_of[start:start + n], weight_of[start:start + n]        # this expert's rows
        h = x[token]                                                              # [n, D]
        y = F.linear(act(F.linear(h, gate[e])) * F.linear(h, up[e]), down[e])   # [n, D]
        out.index_add_(0, token, y.float() * w[:, None].float())
        start += n
    return out.to(x.dtype)


def experts(x: torch.Tensor, topk_idx: torch.Tensor, topk_weight: torch.Tensor, gate: torch.Tensor,
            up: torch.Tensor, down: torch.Tensor, activation: str = "silu", foreign: bool = False) -> torch.Tensor:
    """:func:`routed_experts` (same arguments and result): the fused Triton kernel on the kernel
    path, the torch reference otherwise. ``foreign``: ``topk_idx`` may hold E (another rank's expert,
    ``StackedExperts.forward`` under tensor parallelism)."""
    if triton_enabled():
        from dlm_backend.engine.kernels.moe import fused_moe

        return fused_moe(x, topk_idx, topk_weight, gate, up, down, activation, foreign)
    return routed_experts(x, topk_idx, topk_weight, gate, up, down, activation)
