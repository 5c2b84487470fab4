"""Nemotron-Labs-Diffusion's three decoders (NVIDIA's ``modeling_nemotron_labs_diffusion.py``), one
sampler each; engine/requests/causal_block_sequence.py schedules their passes.

* ``nemotron`` (``generate``): blocks of ``block_length`` after the prompt, each opened by the token
  the previous causal pass predicts, its other slots denoised over the cache. With
  ``remasking="low_confidence"`` a pass commits its share of the block's masks (spread over
  ``block_length`` passes: one a pass), the most confident ones; with ``"low_confidence_dynamic"``
  (the reference's ``threshold=``) every mask at least ``threshold`` confident and always the most
  confident one. Above temperature 0 the token is a float64 Gumbel-max draw, its confidence the
  softmax probability of the plain logits.
* ``nemotron_ar`` (``ar_generate``): one token a causal pass (blocks of one slot).
* ``nemotron_spec`` (``linear_spec_generate``): self-speculation. A block of ``block_length`` is
  drafted by diffusion (every mask in one pass, or with ``draft_threshold`` above 0 the masks at
  least that confident, else the best, pass after pass), then one causal pass verifies it: the
  drafted tokens the model predicts autoregressively are kept, up to the first it does not, plus
  the model's own token there. The output is the autoregressive one; each verify keeps 1 to
  ``block_length`` tokens.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.params import Knob, SamplingParams
from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput, gather, predict_tokens, top_k_indices
from dlm_backend.engine.samplers.llada import transfer_schedule
from dlm_backend.engine.samplers.threshold import threshold_select
from dlm_backend.errors import SamplingParamsError


class NemotronSampler(Sampler):
    """Block diffusion with causal context (the reference ``generate``)."""

    name = "nemotron"
    schedules = ("causal_block",)       # block diffusion with causal context
    #: how engine/requests/causal_block_sequence.py schedules the passes: "block", "ar" or "spec"
    causal_mode = "block"

    def validate(self, params: SamplingParams) -> None:
        if params.remasking not in ("low_confidence", "low_confidence_dynamic"):
            raise SamplingParamsError(f"{self.name} commits by confidence: remasking must be low_confidence (one "
                                      "token a pass) or low_confidence_dynamic (every slot above threshold), not "
                                      f"{params.remasking!r}.", param="remasking")

    def begin_block(self, num_masked: int, steps: int, params: SamplingParams) -> list[int]:
        return transfer_schedule(num_masked, steps)

    def step(self, inp: StepInput) -> Commit:
        p = inp.params
        x0 = predict_tokens(inp.logits, p.temperature, inp.random, inp.tokens.mask_id)
        confidence = gather(torch.softmax(inp.logits, dim=-1), x0)      # in the logits' dtype, as the reference
        if p.remasking == "low_confidence_dynamic":
            chosen = threshold_select(confidence, p.threshold)
        else:
            schedule = inp.block_state
            k = schedule[inp.step] if inp.step < len(schedule) else len(inp.positions)
            chosen = top_k_indices(confidence, max(k, 1))
        return Commit(chosen, x0[chosen].tolist())


class NemotronARSampler(NemotronSampler):
    """Autoregressive decoding (the reference ``ar_generate``): every token from a causal pass."""

    name = "nemotron_ar"
    causal_mode = "ar"
    default_block_length = 1


class NemotronSpecSampler(Sampler):
    """Self-speculation (the reference ``linear_spec_generate``): this sampler drafts, a causal pass verifies."""

    name = "nemotron_spec"
    schedules = ("causal_block",)       # self-speculation with causal context
    causal_mode = "spec"
    knobs = {"draft_threshold": Knob(
        "nemotron_spec: a draft pass commits the masks at least this confident, else the most confident one, "
        "until none is left (0: every mask in one pass)", float, low=0, high=1, default=0.0, checkpoint=True)}

    def step(self, inp: StepInput) -> Commit:
        p = inp.params
        x0 = predict_tokens(inp.logits, p.temperature, inp.random, inp.tokens.mask_id)
        tau = p.get("draft_threshold")
        if not tau:
            chosen = list(range(len(inp.positions)))
        else:
            chosen = threshold_select(gather(torch.softmax(inp.logits, dim=-1), x0), tau)
        return Commit(chosen, x0[chosen].tolist())
