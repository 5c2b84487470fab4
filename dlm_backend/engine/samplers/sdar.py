"""SDAR's published ``block_diffusion_generate`` (JetAstra/SDAR ``generate.py``; TraDo uses it too).

Per block a schedule spreads the block's ``L`` slots over ``steps`` passes (``L // steps`` each,
one more for the first ``L % steps``; ``steps`` defaults to ``L``). ``remasking`` picks the slots
of a pass:

* ``low_confidence_dynamic``: every masked slot strictly above ``threshold`` when there are at
  least the schedule's count of them, else the count most confident;
* ``low_confidence`` (the reference's ``low_confidence_static``): the count most confident;
* ``sequential``: the count leftmost.

The reference's top-k is not capped by the masked slots left, so with more than one token a pass
it may also rewrite committed slots with tied -inf confidence (which ones depends on torch's tie
order); here only masked slots are committed, which is what the reference does whenever its
output does not depend on that tie order. Without ``eos_early_stop`` a request ends after the
block in which a stop token appears, as the reference's stopping criteria do.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput, top_k_indices
from dlm_backend.engine.samplers.blockwise import above_or_top, draw
from dlm_backend.engine.samplers.llada import transfer_schedule
from dlm_backend.errors import SamplingParamsError

RULES = ("low_confidence_dynamic", "low_confidence", "sequential")


class SDARSampler(Sampler):
    name = "sdar"
    schedules = ("block",)              # SDAR's block_diffusion_generate
    uses_steps = True
    uses_unmask_stats = True

    def validate(self, params: SamplingParams) -> None:
        if params.remasking not in RULES:
            raise SamplingParamsError(f"sdar: remasking {params.remasking!r} is not one of SDAR's rules "
                                      f"({', '.join(RULES)}).", param="remasking")

    def steps_for_block(self, params: SamplingParams, start: int, end: int) -> int:
        return params.steps or params.block_length

    def begin_block(self, num_masked, steps, params):
        return transfer_schedule(params.block_length, steps)

    def step(self, inp: StepInput) -> Commit:
        return self._decide(*draw(inp), inp)

    def step_from_stats(self, stats, inp: StepInput) -> Commit:
        return self._decide(stats.token, stats.prob, inp)

    def _decide(self, token: torch.Tensor, confidence: torch.Tensor, inp: StepInput) -> Commit:
        schedule, rule = inp.block_state, inp.params.remasking
        count = max(schedule[inp.step] if inp.step < len(schedule) else len(inp.positions), 1)
        if rule == "low_confidence_dynamic":
            chosen = above_or_top(confidence, inp.params.threshold, count)
        elif rule == "sequential":
            chosen = list(range(min(count, len(inp.positions))))
        else:
            chosen = top_k_indices(confidence, count)
        return Commit(chosen, token[chosen].tolist())
