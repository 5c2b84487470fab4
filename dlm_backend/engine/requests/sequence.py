"""One request: prompt, canvas, status, its KV pages and its output so far. Plain Python, no tensors.

How a request is decoded pass by pass depends on the model family: :class:`CanvasSequence`
(engine/requests/canvas_sequence.py) for the full-sequence families (LLaDA, Dream), :class:`BlockSequence`
(engine/requests/block_sequence.py) for the block-diffusion families, :class:`UniformSequence` (engine/requests/uniform_sequence.py)
for the uniform-noise one (DiffusionGemma). Each describes each forward it needs as a
:class:`Pass`, which the runner packs with the other requests' passes into one batch.
"""

from __future__ import annotations

import itertools
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum, auto

from dlm_backend.engine.outputs import CanvasFrame, GenerationOutput, StreamChunk, TokenLogprob
from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.requests.detokenizer import Detokenizer
from dlm_backend.engine.samplers.base import Sampler, TokenInfo


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass
class Pass:
    """One forward of one request.

    Positions ``start..end`` are fed. With ``paged`` their keys and values are written into the
    request's pages and attention reads its pages at positions ``0..kv_end``; without, attention
    runs over the fed positions alone. ``block_size`` makes attention block-causal (None:
    bidirectional). ``candidates`` are the positions whose predictions this pass decides (read at
    ``position - shift``): a ``denoise`` pass hands them to the sampler, a ``cache`` pass (a prompt's
    prefill, a finished block's keys) takes their argmax (Fast-dLLM's first token of a block) or has
    none. ``cfg`` adds classifier-free guidance's unconditional copy (LLaDA). ``block_size`` 1 is
    causal (DiffusionGemma's encoder); ``decoder`` marks a pass of an encoder-decoder family's
    decoder (DiffusionGemma's denoising), whose rows add ``conditioning`` (the request's
    self-conditioning input, [n, D] on the device; None: nothing yet) to their embeddings.

    ``order`` feeds the canvas positions in another order than ``start..end`` (WeDLM's topological
    reordering: committed slots first, then the masked ones): row i holds ``canvas[order[i]]`` at
    rotary position ``order[i]``, its keys go to slot ``start + i`` and (block-)causal attention
    follows the rows, not the positions. ``shift`` reads this pass's candidates at another offset
    than the model's ``logits_shift`` (a family whose denoise passes read a slot at itself and whose
    causal passes read the next token one row back).
    """

    start: int
    end: int
    candidates: list[int]
    paged: bool = False
    kv_end: int = 0
    block_size: int | None = None
    kind: str = "denoise"
    cfg: bool = False
    masked: list[bool] = field(default_factory=list)     # per candidate: still masked (empty: all are)
    decoder: bool = False
    conditioning: object = None
    order: list[int] | None = None
    shift: int | None = None

    @property
    def num_tokens(self) -> int:
        return (self.end - self.start) * (2 if self.cfg else 1)

    @property
    def fed(self) -> list[int]:
        """The canvas position each fed row holds (also its rotary position)."""
        return self.order if self.order is not None else list(range(self.start, self.end))

    def rows(self, row0: int, shift: int) -> list[int]:
        """The rows (from ``row0``) holding each candidate's prediction, read ``shift`` positions back
        (this pass's own ``shift`` where it has one); a slot whose source is not fed (the first slot
        of a shifted pass) is read at the first row."""
        shift = self.shift if self.shift is not None else shift
        if self.order is None:
            return [row0 + max(p - shift - self.start, 0) for p in self.candidates]
        at = {p: i for i, p in enumerate(self.order)}
        return [row0 + at.get(p - shift, 0) for p in self.candidates]


@dataclass
class ScheduledBatch:
    """The requests of one forward and the pass each one runs, planned once by the scheduler."""

    seqs: list[Sequence] = field(default_factory=list)
    passes: list[Pass] = field(default_factory=list)

    @classmethod
    def of(cls, seqs: list[Sequence], shift: int) -> ScheduledBatch:
        """``seqs``, each with its next pass (``shift``: the model's ``logits_shift``)."""
        batch = cls()
        for seq in seqs:
            batch.add(seq, seq.plan(shift))
        return batch

    def add(self, seq: Sequence, step: Pass) -> None:
        self.seqs.append(seq)
        self.passes.append(step)

    def __len__(self) -> int:
        return len(self.seqs)


class Sequence(ABC):
    """What every request has, whatever its family; subclasses decide the passes."""

    _ids = itertools.count()

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams, sampler: Sampler,
                 tokens: TokenInfo, request_id: str | None = None,
                 response_template: list[int | None] | None = None, tokenizer=None):
        self.seq_id = next(self._ids)
        self.request_id = request_id or f"dlm-{self.seq_id}"
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.sampler = sampler
        self.mask_id = tokens.mask_id
        ends = () if params.ignore_eos else tokens.eos_ids + tokens.eot_ids
        self.stop_ids = frozenset(ends) | frozenset(params.stop_token_ids)
        # A response template fixes some output tokens up front (None = free slot): a forced prefix,
        # or a JSON skeleton whose value slots alone are denoised. A stop token inside its slots does
        # not end the request: the skeleton's fixed tail comes after it.
        self.template = [tokens.mask_id if t is None else t for t in (response_template or [])]
        self.template_end = len(self.prompt_token_ids) + len(self.template)
        self.canvas: list[int] = []
        self.block_length = sampler.block_length(params)
        self.step_in_block = 0
        self.block_state = None
        self.num_forward_passes = 0            # passes whose predictions the sampler decided
        self.num_cache_passes = 0              # passes that only wrote keys and values (prefill, commit)
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.prefix_end = self.prompt_len      # canvas index up to which the output is final
        self.output_end: int | None = None     # canvas index where the output ends, once known
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.num_emitted = 0                   # generated tokens already streamed
        self.error: str | None = None
        self.pages: list[int] = []             # KV pages, logical order (engine/kv)
        self.num_cached = 0                    # positions 0..num_cached hold clean keys and values
        self.hashes: list[bytes] = []          # prefix-cache names of its full prompt pages (set when admitted)
        self.num_shared = 0                    # leading pages shared with other requests
        self.published = 0                     # prompt pages offered to the prefix cache
        self.random = None                     # the sampler's draws (samplers/random.py), set by the runner
        self.detokenizer = Detokenizer(tokenizer, params.stop, len(self.template)) if tokenizer is not None else None
        self.token_logprobs: dict[int, TokenLogprob] = {}      # canvas position -> at the pass that committed it
        self.frames: list[CanvasFrame] = []                     # stream_canvas: not yet streamed

    # -- derived state ---------------------------------------------------------------------

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def length(self) -> int:
        return len(self.canvas)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def committed_token_ids(self) -> list[int]:
        """Final generated tokens so far (the output once finished)."""
        end = self.output_end if self.output_end is not None else self.prefix_end
        return self.canvas[self.prompt_len:end]

    @property
    def kv_positions(self) -> int:
        """Positions whose keys and values need pages (0: this request never pages)."""
        return 0

    @property
    def paged(self) -> bool:
        """Whether its keys and values stay in pages between passes (``cache`` other than "none")."""
        return self.params.cache != "none"

    @property
    def masks_in_block(self) -> list[int]:
        """The masked positions of the current block ``[block_start, block_end)`` (a schedule that
        decodes block by block defines both)."""
        return [i for i in range(self.block_start, self.block_end) if self.canvas[i] == self.mask_id]

    def prefix_hashes(self, page_size: int) -> list[bytes]:
        """Hashes of the full prompt pages others may share (none unless block-causal)."""
        return []

    def clean_prompt_pages(self, page_size: int) -> list[tuple[int, bytes]]:
        """(page, hash) of shareable prompt pages whose keys and values were written since the last
        call: the engine offers them to the prefix cache."""
        hashes = self.hashes
        ready = min(len(hashes), self.num_cached // page_size, len(self.pages))
        out = [(self.pages[i], hashes[i]) for i in range(self.published, ready)]
        self.published = max(self.published, ready)
        return out

    # -- what the subclasses provide ---------------------------------------------------------

    @abstractmethod
    def plan(self, shift: int) -> Pass:
        """The next forward this request needs. Pure: the scheduler sizes a step with it and the
        runner runs what it returned; nothing changes until :meth:`begin_pass`."""

    def begin_pass(self, step: Pass) -> None:
        """What a planned pass starts, right before the runner packs it: a denoising pass that opens
        a block (or a uniform canvas) builds the sampler's state for it. Needs :attr:`random` (the
        runner sets it first): a uniform canvas draws its first tokens here."""
        if step.kind == "denoise" and self.block_state is None:
            self.block_state = self.new_block_state()

    @abstractmethod
    def new_block_state(self) -> object:
        """The sampler's state for the block (or canvas) about to be denoised."""

    @abstractmethod
    def apply(self, step: Pass, commit=None, ar_tokens: list[int] | None = None) -> None:
        """Record a finished pass: the sampler's ``commit`` (denoise) or the argmax of a cache pass."""

    # -- shared transitions ----------------------------------------------------------------

    def write(self, positions: list[int], token_ids: list[int]) -> None:
        for pos, tok in zip(positions, token_ids):
            self.canvas[pos] = tok

    def note_logprobs(self, positions: list[int], values: list[TokenLogprob]) -> None:
        """Each position's token log-probability at the pass committing it (a later commit replaces it)."""
        self.token_logprobs.update(zip(positions, values))

    def logprobs_for(self, start: int, end: int) -> list[TokenLogprob] | None:
        """The output's logprobs at canvas positions ``start..end`` (None unless asked for)."""
        if self.params.logprobs is None:
            return None
        fixed = self.template_end
        return [TokenLogprob(self.canvas[p], 0.0) if p < fixed and self.template[p - self.prompt_len] != self.mask_id
                else self.token_logprobs.get(p, TokenLogprob(self.canvas[p], 0.0)) for p in range(start, end)]

    def scan_prefix(self, limit: int) -> bool:
        """Extend the final prefix over committed tokens up to ``limit``; finish at a stop token past
        the template (True when the request finished)."""
        while self.prefix_end < limit and self.canvas[self.prefix_end] != self.mask_id:
            if self.canvas[self.prefix_end] in self.stop_ids and self.prefix_end >= self.template_end:
                self.finish("stop", stop_reason=self.canvas[self.prefix_end], output_end=self.prefix_end)
                return True
            self.prefix_end += 1
        return False

    def finish(self, reason: str, stop_reason=None, output_end: int | None = None) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        if output_end is not None:
            self.output_end = output_end
        elif self.output_end is None:
            self.output_end = self.prefix_end

    def fail(self, exc: BaseException) -> None:
        """End this request alone after an engine failure (others keep running)."""
        self.error = f"{type(exc).__name__}: {exc}"
        self.finish("error")

    # -- output ----------------------------------------------------------------------------

    def take_chunk(self, now: float) -> StreamChunk:
        """What this request committed since the last chunk (stop strings applied); the last chunk,
        once finished, carries the whole output."""
        delta_text = self.detokenizer.update(self) if self.detokenizer is not None else ""
        tokens = self.committed_token_ids
        if tokens and self.first_token_time is None:
            self.first_token_time = now
        delta_ids = tokens[self.num_emitted:]
        P, emitted = self.prompt_len, self.num_emitted
        self.num_emitted = len(tokens)
        frames, self.frames = self.frames, []
        output = None
        if self.is_finished:
            output = GenerationOutput(
                request_id=self.request_id, prompt_token_ids=self.prompt_token_ids, token_ids=tokens,
                text=self.detokenizer.text if self.detokenizer is not None else None,
                finish_reason=self.finish_reason, stop_reason=self.stop_reason,
                num_forward_passes=self.num_forward_passes, num_cache_passes=self.num_cache_passes,
                metrics={"latency_s": now - self.arrival_time,
                         "ttft_s": (self.first_token_time or now) - self.arrival_time},
                logprobs=self.logprobs_for(P, P + len(tokens)))
        return StreamChunk(self.request_id, delta_ids, delta_text, self.is_finished, self.finish_reason, output,
                           error=self.error, delta_logprobs=self.logprobs_for(P + emitted, P + len(tokens)),
                           canvas=frames)
