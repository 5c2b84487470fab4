"""What the block-diffusion references' samplers share: a token and its confidence per slot, and
the "above the threshold, else the most confident" commit rule.

LLaDA2, SDAR and Fast-dLLM v2 all decide a pass the same way: greedy is the argmax with its
softmax probability as confidence (LLaDA2.0's released code samples even at temperature 0; its
2.1 release and SGLang take the argmax, so does this engine); above temperature 0 the logits are
divided by it, filtered by top-k and top-p, and one token is drawn per row with its probability
under the filtered distribution as confidence. Draws go through the request's ``random``
(samplers/random.py), so a seeded request draws what a reference run seeded the same way draws,
and a recorded run can be replayed.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.samplers.base import StepInput, top_k_indices


def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``logits / temperature`` (none at 0) with top-k then top-p applied (removed tokens at -inf), fp32."""
    logits = logits.float() / (params.temperature or 1.0)
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if params.top_p is not None and params.top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True)
        drop = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1) > params.top_p
        drop[..., 1:] = drop[..., :-1].clone()           # keep the token that crosses top_p
        drop[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -torch.inf)
    return logits


def draw(inp: StepInput) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token [N], confidence [N] fp32)`` for every candidate row of ``inp.logits``.

    The mask token is never chosen (it would leave the slot masked and, in LLaDA2.1's loop, never
    end the block). Greedy: excluded from the argmax. Sampled: its probability is zeroed after the
    filters, which leaves every other row's draw what the reference draws (a multinomial draw is
    the argmax of p / E; scaling p changes nothing).
    """
    p, mask_id = inp.params, inp.tokens.mask_id
    logits = inp.logits.float()
    excluded = 0 <= mask_id < logits.shape[-1]
    if p.temperature == 0 and p.top_k is None and (p.top_p is None or p.top_p >= 1):
        probs = torch.softmax(logits, dim=-1)                                   # [N, V]
        if excluded:
            logits = logits.clone()
            logits[:, mask_id] = -torch.inf
        token = logits.argmax(dim=-1)
        return token, probs.gather(1, token[:, None])[:, 0]
    if p.temperature == 0:              # filters without temperature: the argmax survives them
        token = (logits.index_fill(1, torch.tensor([mask_id], device=logits.device), -torch.inf)
                 if excluded else logits).argmax(dim=-1)
        probs = torch.softmax(filtered_logits(logits, p), dim=-1)
        return token, probs.gather(1, token[:, None])[:, 0]
    probs = torch.softmax(filtered_logits(logits, p), dim=-1)                   # [N, V]
    weights = probs
    if excluded:
        weights = probs.clone()
        weights[:, mask_id] = 0
    token = inp.random.multinomial(weights)
    return token, probs.gather(1, token[:, None])[:, 0]


def above_or_top(confidence: torch.Tensor, threshold: float, count: int) -> list[int]:
    """Rows strictly above ``threshold`` if there are at least ``count`` of them, else the ``count``
    most confident (all rows when fewer): LLaDA2's and SDAR's dynamic rule. Rows at -inf never go."""
    live = int(torch.isfinite(confidence).sum())
    high = (confidence > threshold).nonzero()[:, 0].tolist()
    if len(high) >= count:
        return high
    return top_k_indices(confidence, min(count, live))
