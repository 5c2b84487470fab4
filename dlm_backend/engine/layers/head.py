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
    """:func:`greedy_confidence`, by the one-pass Triton kernel on the kernel path."""
    if triton_enabled():
        from dlm_backend.engine.kernels.unmask import unmask_stats as fused

        return UnmaskStats(*fused(hidden, weight, exclude_id=exclude_id))
    return greedy_confidence(hidden, weight, exclude_id)
