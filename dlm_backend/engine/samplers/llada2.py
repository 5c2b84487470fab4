"""LLaDA2's published ``generate`` rules: LLaDA2.0's low-confidence threshold and LLaDA2.1's token
editing (inclusionAI, ``modeling_llada2_moe.py``).

``llada2`` (2.0): per block a schedule spreads the block's ``L`` slots over ``steps`` passes
(``L // steps`` each, one more for the first ``L % steps``; ``steps`` defaults to ``L``). A pass
commits every masked slot whose confidence is strictly above ``threshold`` when there are at least
the schedule's count of them, else the count most confident. Without ``eos_early_stop`` a request
ends after the block in which a stop token appears.

``llada2_edit`` (2.1): a pass commits masked slots the same way with ``num_to_transfer`` as the
count, and also rewrites committed slots of the block (never the prompt) whose new argmax differs
with confidence above ``editing_threshold``. A block is done when a pass that started with no mask
edits nothing, or after ``max_post_steps`` passes with no mask. Without ``eos_early_stop`` every
block is generated and the output cut at the first stop token.

Both are token-exact to the references on float32 checkpoints (``dlm parity``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput
from dlm_backend.engine.samplers.blockwise import above_or_top, draw
from dlm_backend.engine.samplers.llada import transfer_schedule


class LLaDA2Sampler(Sampler):
    name = "llada2"
    schedules = ("block",)              # LLaDA2's generate: block diffusion
    uses_steps = True
    uses_unmask_stats = True

    def steps_for_block(self, params: SamplingParams, start: int, end: int) -> int:
        return params.steps or params.block_length

    def begin_block(self, num_masked, steps, params):
        # The reference spreads the whole block (prompt tail included) over the passes.
        return transfer_schedule(params.block_length, steps)

    def _count(self, schedule: list[int], step: int) -> int:
        return schedule[step] if step < len(schedule) else 0

    def step(self, inp: StepInput) -> Commit:
        return self._decide(*draw(inp), inp)

    def step_from_stats(self, stats, inp: StepInput) -> Commit:
        return self._decide(stats.token, stats.prob, inp)

    def _decide(self, token: torch.Tensor, confidence: torch.Tensor, inp: StepInput) -> Commit:
        chosen = above_or_top(confidence, inp.params.threshold, self._count(inp.block_state, inp.step))
        return Commit(chosen, token[chosen].tolist())

    def block_done(self, block_state, passes, masks_before, masks_left, edits, params) -> bool:
        # The reference's loop is ``for step in range(steps)``: it moves on after the schedule even
        # if a slot is left (only when the model predicts the mask token itself).
        return masks_left == 0 or passes >= len(block_state)


@dataclass
class _EditState:
    post_passes: int = 0            # passes that started with no masked slot in the block


class LLaDA2EditSampler(Sampler):
    name = "llada2_edit"
    schedules = ("block",)              # LLaDA2.1's generate: block diffusion
    edits = True

    def begin_block(self, num_masked, steps, params):
        return _EditState()

    def stops_at_block_end(self, params: SamplingParams) -> bool:
        return False

    def step(self, inp: StepInput) -> Commit:
        p = inp.params
        token, confidence = draw(inp)
        masked = torch.tensor(inp.masked, dtype=torch.bool)
        current = torch.tensor(inp.current, dtype=torch.long)
        to_unmask = above_or_top(confidence.masked_fill(~masked, -torch.inf), p.threshold, p.num_to_transfer)
        edit = ~masked & (confidence > p.editing_threshold) & (token != current)
        chosen = sorted(set(to_unmask) | set(edit.nonzero()[:, 0].tolist()))
        return Commit(chosen, token[chosen].tolist())

    def block_done(self, block_state, passes, masks_before, masks_left, edits, params) -> bool:
        if masks_before == 0:
            block_state.post_passes += 1
            if edits == 0:
                return True
        # The reference checks at the top of its loop: one more pass with no mask would be too many.
        return masks_left == 0 and block_state.post_passes + 1 > params.max_post_steps
