"""LLaDA's published ``generate``: a fixed number of tokens per pass, chosen by confidence.

Per block the masked count m is spread over S passes (``m // S`` each, one more for the first
``m % S``); each pass commits that many of the block's masked slots with the highest confidence
(softmax probability of the predicted token in the model dtype, or uniform noise for ``random``).
Greedy output is token-exact to the reference sampler (tests/parity/test_parity.py).
"""

from __future__ import annotations

import torch

from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput, gather, predict_tokens, top_k_indices


def transfer_schedule(num_masked: int, steps: int) -> list[int]:
    """Tokens to commit at each pass of a block (reference ``get_num_transfer_tokens``)."""
    base, remainder = divmod(num_masked, steps)
    return [base + (1 if i < remainder else 0) for i in range(steps)]


class LLaDASampler(Sampler):
    name = "llada"
    schedules = ("full",)               # LLaDA's generate: a full-sequence canvas
    uses_steps = True

    def begin_block(self, num_masked, steps, params):
        return transfer_schedule(num_masked, steps)

    def step(self, inp: StepInput) -> Commit:
        p, logits, info = inp.params, inp.logits, inp.tokens
        if p.logits_eos_inf:
            logits = logits.clone()
            logits[:, list(info.eos_ids)] = -torch.inf
        x0 = predict_tokens(logits, p.temperature, inp.random, info.mask_id)
        if p.confidence_eos_eot_inf:
            # The reference's chained assignment hits the logits themselves at temperature 0 (so EOS
            # and end-of-turn both lose their confidence) and only end-of-turn above 0. Mirror it.
            logits = logits.clone()
            hit = list(info.eot_ids) + (list(info.eos_ids) if p.temperature == 0 else [])
            logits[:, hit] = -torch.inf
        if p.remasking == "low_confidence":
            confidence = gather(torch.softmax(logits, dim=-1), x0)
        else:
            confidence = inp.random.rand(tuple(x0.shape))
        schedule = inp.block_state
        # Past the schedule (only when a pass could not commit), take everything that is left.
        k = schedule[inp.step] if inp.step < len(schedule) else len(inp.positions)
        chosen = top_k_indices(confidence, max(k, 1))
        return Commit(chosen, x0[chosen].tolist())
