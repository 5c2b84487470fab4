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

    As the published LLaDA2 ``moe_infer``: one sort of the T*k assignments by expert, each expert's
    MLP on its contiguous run, the weighted terms in one [m, D] fp32 buffer in that order, then k
    row-gathers back and k - 1 adds: k + 1 ops a layer whatever the expert count, where a per-expert
    ``index_add_`` made one a touched expert (18.7k calls, 11% of a 128-token LLaDA2 run on CPU).
    Each token adds its terms in ascending expert id, the order the per-expert scatter used, so the
    result is bit-identical to it and the parity fixtures stay token-exact.
    """
    act = ACTIVATIONS[activation]
    E, D = gate.shape[0], x.shape[1]
    T, k = topk_idx.shape
    flat = topk_idx.reshape(-1)
    order = flat.argsort(stable=True)                                           # assignments grouped by expert
    # ids == E (another rank's experts, sorted last) are not counted, so never computed here
    counts = torch.bincount(flat[order], minlength=E).tolist()[:E]              # one host sync a layer
    m = sum(counts)                                                             # this rank's assignments
    token, weight = order[:m] // k, topk_weight.reshape(-1)[order[:m], None].float()
    terms = torch.empty(m + 1, D, dtype=torch.float32, device=x.device)         # every row < m is written
    terms[m] = 0.0                                                              # row m: for foreign ids
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        # Each expert gathers its rows into a fresh buffer rather than slicing one [m, D] gather: CPU
        # GEMMs round fp32 differently at an unaligned start (up to 2e-6 apart over 300 random shapes),
        # and x.index_select per expert moves the bytes one [m, D] gather would.
        h = x.index_select(0, token[start:start + n])                           # [n, D]
        y = F.linear(act(F.linear(h, gate[e])) * F.linear(h, up[e]), down[e])   # [n, D]
        torch.mul(y.float(), weight[start:start + n], out=terms[start:start + n])
        start += n
    pos = torch.empty_like(order)
    pos[order] = torch.arange(order.numel(), device=order.device)               # each assignment's row
    by_expert = topk_idx.argsort(dim=1, stable=True)                            # each token's slots by expert
    rows = pos.view(T, k).gather(1, by_expert).clamp_(max=m)                    # [T, k]; foreign -> zero row
    # Slot by slot into one reused [T, D] buffer: a single [T*k, D] gather then .sum(1) reads the
    # same bytes but allocates k times more, and measured 1.35x slower (T=544, D=256, E=16, k=4, one
    # thread); .sum(1) would also not promise this addition order.
    out = terms.index_select(0, rows[:, 0])
    buf = torch.empty_like(out)
    for j in range(1, k):
        torch.index_select(terms, 0, rows[:, j], out=buf)
        out.add_(buf)
    return out.to(x.dtype)


def experts(x: torch.Tensor, topk_idx: torch.Tensor, topk_weight: torch.Tensor, gate: torch.Tensor,
            up: torch.Tensor, down: torch.Tensor, activation: str = "silu", foreign: bool = False) -> torch.Tensor:
    """:func:`routed_experts` (same arguments and result): the fused Triton kernel on the kernel
    path, the torch reference otherwise. ``foreign``: ``topk_idx`` may hold E (another rank's expert,
    ``StackedExperts.forward`` under tensor parallelism). Quantized experts (``QuantizedExperts``)
    run on the torch path, each expert's product on its quantized kernel."""
    if triton_enabled() and isinstance(gate, torch.Tensor):
        from dlm_backend.engine.kernels.moe import fused_moe

        return fused_moe(x, topk_idx, topk_weight, gate, up, down, activation, foreign)
    return routed_experts(x, topk_idx, topk_weight, gate, up, down, activation)
