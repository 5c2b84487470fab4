"""Fast-dLLM confidence-aware parallel decoding (threshold rule).

Each pass commits every masked slot of the block whose predicted token has probability >= tau
(float64 softmax, as Fast-dLLM computes it), and always the single most confident one, so a block
of n slots needs between 1 and n passes. Token-exact to Fast-dLLM's ``generate(threshold=...)``.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput, gather, predict_tokens


def threshold_select(confidence: torch.Tensor, tau: float) -> list[int]:
    """Indices with confidence >= tau, plus the argmax (first index on ties)."""
    keep = confidence >= tau
    keep[confidence.argmax()] = True
    return keep.nonzero()[:, 0].tolist()


class ThresholdSampler(Sampler):
    name = "threshold"
    uses_unmask_stats = True

    def step(self, inp: StepInput) -> Commit:
        x0 = predict_tokens(inp.logits, inp.params.temperature, inp.random, inp.tokens.mask_id)
        confidence = gather(torch.softmax(inp.logits.to(torch.float64), dim=-1), x0)
        chosen = threshold_select(confidence, inp.params.threshold)
        return Commit(chosen, x0[chosen].tolist())

    def step_from_stats(self, stats, inp: StepInput) -> Commit:
        # Same rule on the fused kernel's fp32 confidence (the logits path uses float64 softmax).
        chosen = threshold_select(stats.prob, inp.params.threshold)
        return Commit(chosen, stats.token[chosen].tolist())
