"""WeDLM's published block sampler (Tencent; ``WeDLMForCausalLM.generate_wedlm`` in
``hf_compat/modeling_wedlm.py``).

Each pass reads every masked slot of the block, takes ``softmax(logits / temperature)`` and each
slot's most likely token with its probability as the confidence. ``remasking="low_confidence"``
(the reference's ``confidence_threshold=0``) commits the single most confident slot (the first on
ties, as torch's argmax); ``"low_confidence_dynamic"`` (``confidence_threshold=threshold > 0``)
commits every slot whose confidence is at least ``threshold``, else the single most confident one.

The reference never samples: temperature only scales the confidences, so every temperature is
deterministic and matched; temperature 0 (the engine's greedy) scales by 1, the reference's default.
``top_p``/``top_k`` are arguments the reference leaves unused, so they are refused rather than
silently ignored. The mask token is never chosen (a real checkpoint never predicts it; the
reference would leave such a slot looking masked for the next block); its probability stays in the
softmax, so every other slot's confidence is the reference's.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput
from dlm_backend.errors import SamplingParamsError

RULES = ("low_confidence", "low_confidence_dynamic")
BLOCK = 16              # the official engine's decoding window (example.py's wedlm_window_size)


def wedlm_select(confidence: torch.Tensor, threshold: float | None) -> list[int]:
    """Rows at or above ``threshold`` (None: none), else the first most confident row."""
    if threshold is not None:
        above = (confidence >= threshold).nonzero()[:, 0].tolist()
        if above:
            return above
    return [int(confidence.argmax())]


class WeDLMSampler(Sampler):
    name = "wedlm"
    schedules = ("wedlm",)              # generate_wedlm: blocks after the prompt, reordered causal passes
    default_block_length = BLOCK
    uses_unmask_stats = True            # greedy: token and fp32 probability are all a pass needs

    def validate(self, params: SamplingParams) -> None:
        if params.remasking not in RULES:
            raise SamplingParamsError(f"Sampler 'wedlm' takes remasking {' or '.join(RULES)} (one slot a pass, or "
                                      f"every slot at least threshold confident), got {params.remasking!r}.",
                                      param="remasking")
        if params.top_k is not None or (params.top_p is not None and params.top_p < 1):
            raise SamplingParamsError("Sampler 'wedlm' takes the most likely token of each slot, as WeDLM's "
                                      "generate_wedlm does; it has no top_k or top_p. Leave them unset.",
                                      param="top_k" if params.top_k is not None else "top_p")

    @staticmethod
    def _threshold(params: SamplingParams) -> float | None:
        return params.threshold if params.remasking == "low_confidence_dynamic" else None

    def step(self, inp: StepInput) -> Commit:
        logits = inp.logits.float() / (inp.params.temperature or 1.0)
        probs = torch.softmax(logits, dim=-1)                                  # [N, V], the mask included
        mask_id = inp.tokens.mask_id
        choosable = probs
        if 0 <= mask_id < probs.shape[-1]:
            choosable = probs.index_fill(1, torch.tensor([mask_id], device=probs.device), -1.0)
        token = choosable.argmax(dim=-1)
        confidence = probs.gather(1, token[:, None])[:, 0]
        chosen = wedlm_select(confidence, self._threshold(inp.params))
        return Commit(chosen, token[chosen].tolist())

    def step_from_stats(self, stats, inp: StepInput) -> Commit:
        chosen = wedlm_select(stats.prob, self._threshold(inp.params))
        return Commit(chosen, stats.token[chosen].tolist())
