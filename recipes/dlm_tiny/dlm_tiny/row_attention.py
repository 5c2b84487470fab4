"""Attention over B equal rows of L tokens: the layout of the training objective's row mask, the
circuits' probes and their tests.

The engine's forward context takes any object with ``attend(q, k, v, layer)``; the engine itself only
brings backends for serving (packed requests over KV caches). Training rows are one batched
attention call instead, each row over its own tokens under an optional ``[B, L, L]`` mask (a packed
row holds several examples; causal examples see only their past). This is, operation for operation,
what the engine's old ``AttentionContext(rows=(B, L), attend=mask)`` ran, so losses, gradients and
the recipe's weights are unchanged by the move.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from dlm_backend.engine.layers import ForwardContext, forward_context


class RowAttention:
    """``B`` rows of ``L`` tokens flattened to ``T = B * L``; ``mask`` ``[B, L, L]`` bool says which
    keys each query of a row may see (``None``: its whole row)."""

    def __init__(self, B: int, L: int, mask: torch.Tensor | None = None):
        if mask is not None and tuple(mask.shape) != (B, L, L):
            raise ValueError(f"mask must be [B, L, L] = [{B}, {L}, {L}], got {list(mask.shape)}")
        self.B, self.L, self.mask = B, L, mask

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, Hkv, D] (rotated) -> [T, H, D]."""
        B, L = self.B, self.L
        n_rep = q.shape[1] // k.shape[1]
        qb, kb, vb = (t.view(B, L, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))  # [B, H, L, D]
        if n_rep > 1:
            kb, vb = kb.repeat_interleave(n_rep, dim=1), vb.repeat_interleave(n_rep, dim=1)
        m = None if self.mask is None else self.mask[:, None]                                  # [B, 1, L, L]
        o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=m, is_causal=False)
        return o.transpose(1, 2).reshape(q.shape)


def rows(B: int, L: int, mask: torch.Tensor | None = None) -> contextlib.AbstractContextManager:
    """``with rows(B, L, mask): hidden = model(ids, positions)`` over flattened ``[B * L]`` tokens.
    Layers run their torch code (``triton=False``): the recipe trains and probes with autograd."""
    return forward_context(ForwardContext(RowAttention(B, L, mask), triton=False))
