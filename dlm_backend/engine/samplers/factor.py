"""Fast-dLLM's factor rule: commit the n most confident slots while (n + 1)(1 - c_n) < f.

Sorted confidences c_1 >= c_2 >= ...: the n-th is accepted while c_n > 1 - f / (n + 1) (paper,
arXiv 2505.22618, Thm. 1), scanning from the top and stopping at the first failure; the top-1 is
always committed. Larger f commits more per pass.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput, gather, predict_tokens


def factor_count(sorted_confidence: list[float], factor: float) -> int:
    n = 1
    while n < len(sorted_confidence) and (n + 2) * (1 - sorted_confidence[n]) < factor:
        n += 1
    return n


class FactorSampler(Sampler):
    name = "factor"

    def step(self, inp: StepInput) -> Commit:
        x0 = predict_tokens(inp.logits, inp.params.temperature, inp.random, inp.tokens.mask_id)
        confidence = gather(torch.softmax(inp.logits.to(torch.float64), dim=-1), x0)
        order = torch.sort(confidence, descending=True, stable=True)
        n = factor_count(order.values.tolist(), inp.params.factor)
        chosen = sorted(order.indices[:n].tolist())
        return Commit(chosen, x0[chosen].tolist())
