"""Attention for packed training rows, one example at a time, examples grouped by length.

A packed row of 512 tokens holds several examples; attending over the whole row with a
block-diagonal mask computes 512 x 512 scores a row, of which a row of ~100-token examples keeps
about a fifth. One attention call per example avoids that but is many small calls, which
measured slower on 2 cores (1.96 against 1.84 s a step, on r1's machine). Here the examples of a step are
gathered into a few length buckets (32, 48, 64, ... 512 tokens: each at most 1.5x the previous), one
``[n, S, S]`` attention call per bucket, and scattered back: a handful of calls per layer at about a
third of the block-diagonal scores; short buckets skip torch's flash kernel (MATH_UP_TO).
Autoregressive examples (the annealed start of a run) are causal inside their bucket. It pays with
bf16 products (1.62x against 1.44x for the row mask); in float32 it was 9% slower than the row mask,
so only ``--precision bf16`` runs use it (probes/bench_train_step.py).

Plugged in as the forward context's attention backend (``ForwardContext(ExampleAttention(...))``),
so the model code is unchanged.

The block layout (``--block-size``, block_layout.py) narrows each example's mask further with
:func:`block_visible`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Up to this bucket length attention runs as plain products and a softmax: on 2 cores, forward and
# backward over [48, 4, 128, 64] in bf16 took 18 ms that way against 44 ms in torch's CPU flash kernel
# (64 tokens: 11 against 37 ms); from 192 tokens on the flash kernel is as fast or faster (flash
# against plain: 192 tokens 54 against 56 ms, 256: 51 against 62, 384: 40 against 52).
MATH_UP_TO = 128
BUCKETS = (32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def block_visible(q_block: torch.Tensor, q_noisy: torch.Tensor, k_block: torch.Tensor,
                  k_noisy: torch.Tensor) -> torch.Tensor:
    """Which keys a query of a block-layout example sees (arguments broadcast: queries ``[..., S, 1]``,
    keys ``[..., 1, S]``). A clean token sees the clean tokens of its own block and every earlier one,
    as the engine's cache passes compute them; a noisy token sees the clean tokens of earlier blocks
    and the noisy tokens of its own block, as a denoise pass reads the cache and feeds its block."""
    clean_key = ~k_noisy & (k_block <= q_block - q_noisy.long())
    return clean_key | (k_noisy & q_noisy & (k_block == q_block))


class ExampleAttention:
    """Per-example attention over a packed ``[B, L]`` batch flattened to ``T = B * L`` tokens.

    ``ex``: ``[B, L]`` example index of each token, ``-1`` for a row's unused tail (whose output is 0:
    no loss reads it and no example sees it). ``causal``: ``[E]`` bool, examples that attend causally.
    Each example's tokens must be contiguous in its row, as PackedBatches lays them out. ``block`` and
    ``noisy`` (``[B, L]``, the block layout's) restrict each example further by :func:`block_visible`.
    """

    def __init__(self, ex: torch.Tensor, causal: torch.Tensor, block: torch.Tensor | None = None,
                 noisy: torch.Tensor | None = None):
        flat, dev = ex.reshape(-1), ex.device                                     # [T]
        self.tokens = flat.numel()
        used = (flat >= 0).nonzero(as_tuple=True)[0]                              # [U] flat indices
        E = int(flat.max()) + 1 if used.numel() else 0
        length = torch.bincount(flat[used], minlength=E)                          # [E]
        start = torch.full((E,), self.tokens, dtype=torch.long, device=dev)
        start.scatter_reduce_(0, flat[used], used, "amin")                       # [E] first token
        self.groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        dst = []
        lower = 0
        for size in BUCKETS:
            members = ((length > lower) & (length <= size)).nonzero(as_tuple=True)[0]   # [n]
            lower = size
            if members.numel() == 0:
                continue
            offs = torch.arange(size, device=dev)                                 # [S]
            valid = offs[None, :] < length[members, None]                         # [n, S]
            index = torch.where(valid, start[members, None] + offs, 0)            # [n, S] into [T]
            keep = valid[:, None, :] & (~causal[members, None, None] | (offs[None, :, None] >= offs[None, None, :]))
            if block is not None:
                blk, copy = block.reshape(-1)[index], noisy.reshape(-1)[index]   # [n, S]
                keep &= block_visible(blk[:, :, None], copy[:, :, None], blk[:, None, :], copy[:, None, :])
            # a padded query row sees key 0 alone: an all-False row would make SDPA return NaN
            keep |= ~valid[:, :, None] & (offs == 0)[None, None, :]
            self.groups.append((index, valid, keep[:, None]))                     # mask [n, 1, S, S]
            dst.append(index[valid])
        end = torch.full((E,), -1, dtype=torch.long, device=dev).scatter_reduce_(0, flat[used], used, "amax")
        if not torch.equal(end - start + 1, length):
            raise ValueError("each example's tokens must be contiguous in its row, as PackedBatches lays them out")
        longest = int(length.max()) if E else 0
        if longest > BUCKETS[-1]:
            raise ValueError(f"an example of {longest} tokens exceeds the largest bucket ({BUCKETS[-1]})")
        order = torch.cat(dst) if dst else torch.empty(0, dtype=torch.long, device=dev)  # [U], bucket order
        # where each flat token finds its output in [bucket outputs..., one zero row for the tails]
        self.gather = torch.full((self.tokens,), order.numel(), dtype=torch.long, device=dev)
        self.gather[order] = torch.arange(order.numel(), device=dev)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, Hkv, D] (rotated) -> [T, H, D]."""
        n_rep = q.shape[1] // k.shape[1]
        outs = []
        for index, valid, keep in self.groups:
            qb, kb, vb = (t[index].transpose(1, 2) for t in (q, k, v))            # [n, H(kv), S, D]
            if n_rep > 1:
                kb, vb = kb.repeat_interleave(n_rep, dim=1), vb.repeat_interleave(n_rep, dim=1)
            if index.shape[1] <= MATH_UP_TO:
                scores = (qb @ kb.transpose(-1, -2)) * qb.shape[-1] ** -0.5       # [n, H, S, S]
                o = scores.masked_fill(~keep, float("-inf")).softmax(-1).to(vb.dtype) @ vb
            else:
                o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=keep)   # [n, H, S, D]
            outs.append(o.transpose(1, 2)[valid])                                 # [u, H, D]
        outs.append(q.new_zeros(1, *q.shape[1:]))
        return torch.cat(outs)[self.gather]                                       # [T, H, D]
