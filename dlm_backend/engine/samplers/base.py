"""Sampler interface: the engine owns the block loop, a sampler decides each pass's commits.

For every running request and every denoising pass the runner hands the sampler the logits of the
masked slots of the current block (``StepInput``); the sampler answers which of those slots to
commit and with which tokens (``Commit``). Per-block state (a transfer schedule, timesteps) comes
from ``begin_block`` and is kept on the sequence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from dlm_backend.engine.params import KNOB_NAMES, Knob, SamplingParams
from dlm_backend.engine.samplers.random import ReplayRandom, TorchRandom
from dlm_backend.errors import DLMError, PluginError


@dataclass(frozen=True)
class TokenInfo:
    """Special token ids of the loaded checkpoint."""

    mask_id: int                  # -1: none (a uniform-noise family: its free slots hold random tokens)
    eos_ids: tuple[int, ...] = ()
    eot_ids: tuple[int, ...] = ()
    vocab_size: int = 0


@dataclass
class StepInput:
    logits: torch.Tensor          # [N, V] for the N candidate slots of the block, model dtype
    positions: list[int]          # their canvas positions, ascending
    step: int                     # pass index inside the current block, from 0
    block_state: object           # what begin_block returned
    params: SamplingParams
    #: the request's draws, its one source of randomness (samplers/random.py: ``multinomial``,
    #: ``sample``, ``randint``, ``rand``), seeded from ``params.seed`` or replaying a recorded run
    random: TorchRandom | ReplayRandom
    tokens: TokenInfo
    #: block families: each candidate's current token and whether it is still masked (every
    #: candidate is masked unless the sampler asks for committed slots too: ``edits``,
    #: ``whole_sub_block``)
    current: list[int] = field(default_factory=list)
    masked: list[bool] = field(default_factory=list)


@dataclass
class Commit:
    indices: list[int]            # rows of StepInput.logits to commit
    token_ids: list[int]          # the token for each
    #: what conditions the request's next pass, if anything: DiffusionGemma's processed logits
    #: [N, V]; the runner turns them into the model's input (``model.conditioning_input``) before
    #: the sequence keeps them
    conditioning: object = None


class Sampler(ABC):
    """A decoding strategy. Subclasses set ``name`` and implement :meth:`step`."""

    name: ClassVar[str]
    #: the sampler's own knobs, name -> :class:`Knob` (its doc, type, range and ``default``): they join
    #: the knob table when the sampler is registered, so ``SamplingParams(name=...)`` and the front
    #: doors take them, checked by the Knob's rules; read one with ``params.get(name)``. A name the
    #: table already has (a built-in knob or one of its other names) is refused.
    knobs: ClassVar[dict[str, Knob]] = {}
    #: the request schedules (``DiffusionLM.schedule``: "full", "block", ...) this rule decodes,
    #: named by the reference it reproduces; None: any (a rule that reads only the block's slots).
    #: A request naming it on a model of another schedule is refused, naming the ones that fit.
    schedules: ClassVar[tuple[str, ...] | None] = None
    #: block length when the request leaves it unset; None = one block over the whole canvas.
    default_block_length: ClassVar[int | None] = 32
    #: whether ``steps`` sets a fixed number of passes per block (False: adaptive rules).
    uses_steps: ClassVar[bool] = False
    #: whether greedy passes can decide from per-slot (token, confidence) alone
    #: (:meth:`step_from_stats`), so the kernel path never builds the [N, V] logits.
    uses_unmask_stats: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, spec in cls.__dict__.get("knobs", {}).items():      # checked once, where it is declared
            if not isinstance(spec, Knob) or not name.isidentifier():
                raise PluginError(f"{cls.__name__}.knobs[{name!r}] must be a dlm_backend.engine.params.Knob "
                                  "under a Python name.")
            if name in KNOB_NAMES or name == "options":           # options: the field holding their values
                raise PluginError(f"{cls.__name__} declares the knob {name!r}, which the knob table already has "
                                  "(a built-in knob or another name of one). Read the built-in one with "
                                  "params.get(name), or give the sampler's own knob another name.")
            try:
                spec.check(name, spec.default)
            except DLMError as exc:
                raise PluginError(f"{cls.__name__}.knobs[{name!r}]: its default breaks its own rule. {exc}") from None

    def validate(self, params: SamplingParams) -> None:
        """Raise SamplingParamsError for parameters this sampler cannot honour."""

    def block_length(self, params: SamplingParams) -> int:
        size = params.block_length or self.default_block_length or params.max_tokens
        return min(size, params.max_tokens)

    def steps_for_block(self, params: SamplingParams, start: int, end: int) -> int:
        """Passes for the block over reply slots ``[start, end)``: ``steps`` spread evenly over the canvas.

        With ``max_tokens % block_length == 0`` and ``steps % num_blocks == 0`` this is the reference's
        ``steps // num_blocks``. Otherwise each block gets the share that falls on its slots, so the
        blocks' passes add up to ``steps`` (a block gets at least 1, so only ``steps`` below the
        number of blocks is exceeded).
        """
        total = params.steps or params.max_tokens
        return max(1, total * end // params.max_tokens - total * start // params.max_tokens)

    def begin_block(self, num_masked: int, steps: int, params: SamplingParams) -> object:
        """Per-block state, built when a block starts with ``num_masked`` masked slots."""
        return None

    @abstractmethod
    def step(self, inp: StepInput) -> Commit:
        """Choose the slots to commit in this pass (at least one when any are masked)."""

    # -- block-diffusion families (engine/requests/block_sequence.py) ---------------------------------------------

    #: the sampler rewrites committed slots of the current block (LLaDA2.1 token editing): it is
    #: handed every slot of the block past the prompt, with ``StepInput.current`` and ``.masked``
    edits: ClassVar[bool] = False
    #: the sampler is handed every slot of the current sub-block, committed ones flagged in
    #: ``StepInput.masked`` (Fast-dLLM v2 draws a token for each, so a seeded run draws what the
    #: reference draws); only masked slots may be committed
    whole_sub_block: ClassVar[bool] = False
    #: a block's first slot is the argmax of the pass that cached the previous block (Fast-dLLM v2)
    ar_first_token: ClassVar[bool] = False
    #: the canvases it decodes: "mask" (slots start as the mask token) or "uniform" (random tokens;
    #: a model's ``noise`` must match). A uniform-noise sampler also implements ``begin_canvas``.
    noise: ClassVar[str] = "mask"

    def begin_canvas(self, random, vocab_size: int, length: int, params: SamplingParams) -> object:
        """Uniform noise: a canvas's state, its ``length`` starting tokens drawn through ``random``
        (engine/requests/uniform_sequence.py keeps it as the block state; the sampler's own type)."""
        raise TypeError(f"{type(self).__name__} decodes masked canvases; it has no begin_canvas")

    def sub_block(self, params: SamplingParams) -> int | None:
        """Slots of a block decided left to right, one sub-block at a time (None: the whole block)."""
        return None

    def block_done(self, block_state, passes: int, masks_before: int, masks_left: int, edits: int,
                   params: SamplingParams) -> bool:
        """Whether the current block is finished after its ``passes``-th pass (default: no masked
        slot left)."""
        return masks_left == 0

    def stops_at_block_end(self, params: SamplingParams) -> bool:
        """Without ``eos_early_stop``: end the request after the block in which a stop token appears
        (LLaDA2.0, SDAR) rather than generating every block and cutting the output (LLaDA2.1)."""
        return True

    def step_from_stats(self, stats, inp: StepInput) -> Commit:
        """Like :meth:`step` for a greedy pass, from ``UnmaskStats`` of the masked slots (token and
        fp32 confidence per slot) instead of ``inp.logits`` (None here). Only called when
        ``uses_unmask_stats``."""
        raise TypeError(f"{type(self).__name__} declares uses_unmask_stats but has no step_from_stats")


# -- shared helpers ---------------------------------------------------------------------------


def predict_tokens(logits: torch.Tensor, temperature: float, random: TorchRandom | ReplayRandom,
                   mask_id: int) -> torch.Tensor:
    """LLaDA/Fast-dLLM token choice: argmax, or Gumbel-max in float64 when temperature > 0.

    The mask token itself is never predicted (it would leave the slot masked); for every real
    checkpoint this changes nothing, since the mask id's logit is never the largest.
    """
    if 0 <= mask_id < logits.shape[-1]:
        logits = logits.clone()
        logits[:, mask_id] = -torch.inf
    if temperature == 0:
        return logits.argmax(dim=-1)
    noisy = logits.to(torch.float64)
    noise = random.rand(tuple(noisy.shape), torch.float64)
    return (noisy.exp() / (-torch.log(noise)) ** temperature).argmax(dim=-1)


def top_k_indices(confidence: torch.Tensor, k: int) -> list[int]:
    """The k highest confidences; ties go to the lower position, on every device."""
    k = min(k, confidence.shape[0])
    if k <= 0:
        return []
    order = torch.sort(confidence, descending=True, stable=True).indices
    return order[:k].tolist()


def gather(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return values.gather(-1, index[:, None])[:, 0]
