"""Entropy-bounded (EB) sampler: commit low-entropy slots until their summed entropy passes gamma.

Masked slots sorted by entropy ascending, H_1 <= H_2 <= ...: the first is always committed, the n-th
while H_1 + ... + H_(n-1) <= gamma (EB-Sampler, arXiv 2505.24857; SGLang ``eb_sampling``). Unlike a
probability threshold it adapts to how spread-out the whole distribution is, not just its top.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput, predict_tokens


def entropy_bounded_count(sorted_entropy: list[float], gamma: float) -> int:
    """How many of the ascending entropies to commit: slot n joins while the ones before sum <= gamma."""
    n, total = 1, 0.0
    while n < len(sorted_entropy):
        total += sorted_entropy[n - 1]
        if total > gamma:
            break
        n += 1
    return n


class EntropyBoundedSampler(Sampler):
    name = "entropy_bounded"

    def step(self, inp: StepInput) -> Commit:
        logits = inp.logits.float()
        mask_id = inp.tokens.mask_id
        if 0 <= mask_id < logits.shape[-1]:
            logits = logits.clone()
            logits[:, mask_id] = -torch.inf
        x0 = predict_tokens(logits, inp.params.temperature, inp.random, mask_id)
        logp = torch.log_softmax(logits, dim=-1)
        entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)      # [N]
        order = torch.sort(entropy, stable=True)
        n = entropy_bounded_count(order.values.tolist(), inp.params.gamma)
        chosen = sorted(order.indices[:n].tolist())
        return Commit(chosen, x0[chosen].tolist())
