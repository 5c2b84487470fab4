"""The LM head's greedy choice and its confidence, without [N, V] logits on the kernel path."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from dlm_backend.engine.layers.attention import triton_enabled


class UnmaskStats(NamedTuple):
    """Per-row greedy statistics of the LM head."""

    token: torch.Tensor      # [N] int64 chosen token (argmax; the excluded id never)
    prob: torch.Tensor       # [N] fp32 softmax probability of that token over the whole vocabulary


def greedy_confidence(hidden: torch.Tensor, weight: torch.Tensor, exclude_id: int = -1) -> UnmaskStats:
    """Torch reference of the fused unmasking kernel: fp32 logits, softmax over every token,
    ``exclude_id`` (the mask id) never chosen, the first index on ties."""
    return greedy_from_logits(F.linear(hidden, weight), exclude_id)


def greedy_from_logits(logits: torch.Tensor, exclude_id: int = -1) -> UnmaskStats:
    """:func:`greedy_confidence` from the logits ``[N, V]`` themselves."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    if 0 <= exclude_id < logits.shape[1]:          # out of place: the caller's logits stay as they are
        logits = logits.index_fill(1, torch.tensor([exclude_id], device=logits.device), -torch.inf)
    token = logits.argmax(-1)
    return UnmaskStats(token, probs.gather(1, token[:, None])[:, 0])


def unmask_stats(hidden: torch.Tensor, weight: torch.Tensor, exclude_id: int = -1) -> UnmaskStats:
    """:func:`greedy_confidence`, by the one-pass Triton kernel on the kernel path (a quantized head
    runs its own product)."""
    if triton_enabled() and isinstance(weight, torch.Tensor):
        from dlm_backend.engine.kernels.unmask import unmask_stats as fused

        return UnmaskStats(*fused(hidden, weight, exclude_id=exclude_id))
    return greedy_confidence(hidden, weight, exclude_id)


def vocab_parallel_stats(tp, logits: torch.Tensor, vocab: int, exclude_id: int = -1) -> UnmaskStats:
    """:func:`greedy_from_logits` of a vocabulary-parallel head, from this rank's logits
    ``[N, ceil(V / world)]``: each rank sends four numbers a row (its max, the sum of exp below it, its
    best choosable logit and that token's id) instead of its logits, and every rank merges them as the
    fused kernel merges its vocabulary splits. At LLaDA-8B's 126k vocabulary and two ranks that is 32
    bytes a row where the logits would be 253 kB."""
    lo, hi = tp.vocab(vocab)
    ids = torch.arange(logits.shape[1], device=logits.device) + lo                    # [v] global ids
    logits = logits.float().masked_fill(ids >= hi, -torch.inf)                         # the last rank's padding
    m = logits.max(1).values                                                           # [N]
    s = torch.exp(logits - m[:, None]).sum(1).nan_to_num(0.0)        # 0 for a rank with no ids
    choosable = logits.masked_fill(ids == exclude_id, -torch.inf)
    j = choosable.argmax(1, keepdim=True)                                             # first index on ties
    mine = torch.stack([m, s, choosable.gather(1, j)[:, 0], ids[j[:, 0]].float()], dim=1)   # [N, 4]
    # float64 on the wire: the ids stay exact (float32 is exact only to 2^24) and the values lose nothing.
    every = tp.gather_last(mine.double()).view(len(m), tp.world, 4)                   # [N, R, 4]
    m, s, best, token = every.unbind(-1)
    top = m.max(1).values                                                              # [N]
    total = (s * torch.exp(m - top[:, None])).sum(1)
    r = best.argmax(1, keepdim=True)                                                  # the lowest rank on ties
    prob = torch.exp(best.gather(1, r)[:, 0] - top) / total
    return UnmaskStats(token.gather(1, r)[:, 0].long(), prob.float())
