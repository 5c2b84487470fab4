"""DiffusionGemma's published ``generate`` (transformers ``DiffusionGemmaGenerationMixin``): a uniform-noise
canvas, refined with entropy-bounded acceptance and renoising.

A canvas starts as ``L`` random tokens (``randint`` over the vocabulary; no mask token). At step
``n = N .. 1`` (``N = max_denoising_steps``) the decoder reads the canvas and:

1. ``processed = logits / t`` with ``t = t_min + (t_max - t_min) * n / N`` (float32, as the reference);
2. one token per slot is drawn from ``softmax(processed)`` (``multinomial``) and the argmax taken;
3. slots sorted by the entropy of ``processed``, ascending, are accepted while the entropies before
   them sum to at most ``gamma`` (``entropy_bound``; the lowest is always accepted): accepted slots
   take their drawn token, the others a fresh random one (``randint``, drawn for every slot);
4. the canvas is done when its argmax equals the argmax of each of the ``stability_threshold``
   steps before it and the mean entropy is below ``confidence_threshold``, or after step 1;
5. ``processed`` conditions the next step (the runner turns it into the decoder's input).

The emitted canvas is the last **argmax**, not the sampled canvas. Draws go through the request's
``random`` in the reference's order (the initial ``randint``, then per step one ``multinomial`` over
``[L, V]`` and one ``randint``), so a seeded request draws what a reference run seeded alike draws
and a recorded run replays (samplers/random.py). Slots a response template fixes keep their token:
they are never renoised, never take part in the entropy budget or mean, and are emitted as fixed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput
from dlm_backend.errors import SamplingParamsError


@dataclass
class CanvasState:
    """One canvas's denoising: the tokens the next pass reads, the steps left, the argmax history."""

    canvas: list[int]
    steps: int                       # N
    step: int                        # n, counting down from N
    history: list[list[int]] = field(default_factory=list)   # the last stability_threshold argmax canvases
    done: bool = False


def temperature(t_min: float, t_max: float, step: int, steps: int) -> torch.Tensor:
    """The linear schedule's float32 temperature at step ``step`` of ``steps`` (counting down): the
    step is an int32 tensor divided in float32 and scaled in float32, as the reference computes it."""
    return t_min + (t_max - t_min) * (torch.tensor(step, dtype=torch.int32) / steps)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-row entropy of ``softmax(logits)`` ``[N, V] -> [N]``, computed as torch's ``Categorical`` does
    (log-normalised logits clamped to the dtype's minimum, times the probabilities), so the sort and
    the bound see the reference's values."""
    logp = logits - logits.logsumexp(dim=-1, keepdim=True)
    return -(logp.clamp(min=torch.finfo(logp.dtype).min) * torch.softmax(logp, dim=-1)).sum(-1)


def accepted_slots(entropies: torch.Tensor, bound: float) -> torch.Tensor:
    """Bool [N]: the lowest entropies while the ones before them sum to at most ``bound``."""
    ordered, order = torch.sort(entropies)
    keep = (torch.cumsum(ordered, dim=-1) - ordered) <= bound
    return torch.zeros_like(keep).scatter(0, order, keep)


class DiffusionGemmaSampler(Sampler):
    name = "diffusiongemma"
    noise = "uniform"
    schedules = ("uniform",)            # DiffusionGemma's generate: canvases of random tokens
    default_block_length = None      # the model's canvas_length

    def validate(self, params: SamplingParams) -> None:
        if params.t_max <= params.t_min:
            raise SamplingParamsError(f"Invalid SamplingParams: t_max ({params.t_max}) must be above t_min "
                                      f"({params.t_min}): the temperature falls from t_max to t_min.", param="t_max")

    def begin_canvas(self, random, vocab_size: int, length: int, params: SamplingParams) -> CanvasState:
        tokens = random.randint(vocab_size, (length,)).tolist()
        return CanvasState(tokens, params.max_denoising_steps, params.max_denoising_steps)

    def step(self, inp: StepInput) -> Commit:
        state, p = inp.block_state, inp.params
        processed = inp.logits.float() / temperature(p.t_min, p.t_max, state.step, state.steps)   # [L, V]
        free = torch.tensor(inp.masked, dtype=torch.bool, device=processed.device)               # [L]
        current = torch.tensor(inp.current, dtype=torch.long, device=processed.device)
        drawn = inp.random.multinomial(torch.softmax(processed, dim=-1, dtype=torch.float32)).to(current.device)
        argmax = torch.where(free, processed.argmax(dim=-1), current)
        h = entropy(processed)
        accepted = accepted_slots(h.masked_fill(~free, 0.0), p.gamma) | ~free    # fixed slots cost nothing
        noise = inp.random.randint(processed.shape[-1], tuple(current.shape)).to(current.device)
        canvas = torch.where(accepted, torch.where(free, drawn, current), noise)
        argmax_list = argmax.tolist()
        n = p.stability_threshold
        stable = n == 0 or (len(state.history) == n and all(a == argmax_list for a in state.history))
        if n:
            state.history = (state.history + [argmax_list])[-n:]
        confident = bool(h[free].mean() < p.confidence_threshold) if bool(free.any()) else True
        state.done = (stable and confident) or state.step == 1
        state.step -= 1
        state.canvas = argmax_list if state.done else canvas.tolist()
        every = list(range(len(state.canvas)))
        return Commit(every, state.canvas, conditioning=processed)
