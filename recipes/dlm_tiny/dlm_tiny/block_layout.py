"""The block layout (``--block-size N``): dlm-tiny trained as a block-diffusion model, Fast-dLLM v2's way.

Served, a Fast-dLLM v2 checkpoint decodes blocks of N positions aligned to position 0, left to right
(engine/requests/block_sequence.py, samplers/fastdllm2.py): a cache pass runs the finished blocks block-causally and
reads the next block's first token at the position before it, autoregressively; denoise passes feed
the block with its other slots masked and read the cache. Training computes both in one forward pass,
as Fast-dLLM v2 and SDAR train: each example clean, then a noisy copy of the blocks that hold its reply
(the prompt's tail in the first of them is in the copy unmasked, as a denoise pass feeds it), under
:func:`example_attention.block_visible`. The EOS run after a reply goes on to its block's end
(objective.PackedBatches), since a served canvas is whole blocks.
The loss reads

* each masked slot of the noisy copy from the noisy output before it (the same block: Dream's shift),
  weighted 1/t, and
* each reply block's first token from the clean output before it, weighted 1. That slot is never
  masked in the copy: the engine commits it before the block's first denoise pass.

The whole-prompt masking and the autoregressive start of the Dream layout do not apply here
(checks.check_flags says so); the clean copy's first-token loss is this layout's autoregressive part.
"""

from __future__ import annotations

import torch


def noisy_start(prompt_len: int, block_size: int) -> int:
    """Where an example's noisy copy starts: the block holding its first reply token, the engine's
    first decoded block (``BlockSequence.block_start``, ``(P // L) * L``)."""
    return prompt_len // block_size * block_size


def layout_length(n: int, prompt_len: int, block_size: int) -> int:
    """Tokens an example of ``n`` clean tokens takes in a row (``block_size`` 0: the Dream layout)."""
    return 2 * n - noisy_start(prompt_len, block_size) if block_size else n


def lay_out(tokens: list[int], prompt_len: int, block_size: int) -> tuple[list[int], list[int], list[bool]]:
    """One example's ids, positions and noisy flags: the clean tokens, then the copy of its reply blocks."""
    n = len(tokens)
    if not block_size:
        return tokens, list(range(n)), [False] * n
    s = noisy_start(prompt_len, block_size)
    return tokens + tokens[s:], list(range(n)) + list(range(s, n)), [False] * n + [True] * (n - s)


def first_slots(pos: torch.Tensor, noisy: torch.Tensor, prompt_len: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[B, L]``: clean reply tokens that start a block, read autoregressively (``prompt_len`` per token).
    Never position 0, which has no output before it; the engine skips the autoregressive read there
    too (``BlockSequence.plan``: ``... and start``)."""
    return ~noisy & (pos % block_size == 0) & (pos >= prompt_len) & (pos >= 1)
