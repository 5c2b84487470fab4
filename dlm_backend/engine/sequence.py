"""One request: prompt, canvas, block cursor, status and its output so far. Plain Python, no tensors."""

from __future__ import annotations

import itertools
import time
from enum import Enum, auto

from dlm_backend.engine.detokenizer import Detokenizer
from dlm_backend.engine.outputs import GenerationOutput, StreamChunk
from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.samplers.base import Sampler, TokenInfo


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """The canvas is ``prompt + [mask] * max_tokens``; blocks of it are denoised left to right.

    Committed tokens never change, so the *committed prefix* (generated tokens up to the first
    still-masked slot) is final: it is what streaming emits and where EOS and stop strings are
    looked for. A request finishes as soon as that prefix reaches a stop token, without denoising
    the rest of the canvas.
    """

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
        self.stop_ids = frozenset() if params.ignore_eos else frozenset(tokens.eos_ids + tokens.eot_ids)
        # A response template fixes some output tokens up front (None = free slot): a forced prefix,
        # or a JSON skeleton whose value slots alone are denoised.
        template = [tokens.mask_id if t is None else t for t in (response_template or [])]
        self.canvas = self.prompt_token_ids + template + [tokens.mask_id] * (params.max_tokens - len(template))
        # A stop token inside the template's slots does not end the request: the skeleton's fixed
        # tail ("}, closing tags) comes after, and models trained to pad with EOS put one in a
        # short value's spare slots. Decoding skips it, so the value reads clean.
        self.template_end = len(self.prompt_token_ids) + len(template)
        self.block_length = sampler.block_length(params)
        self.block_index = 0
        self.step_in_block = 0
        self.block_state = None
        self.num_forward_passes = 0
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.prefix_end = self.prompt_len      # canvas index of the first uncommitted slot
        self.output_end: int | None = None     # canvas index where the output ends, once known
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.num_emitted = 0                   # generated tokens already streamed
        self.error: str | None = None
        self.detokenizer = Detokenizer(tokenizer, params.stop, len(template)) if tokenizer is not None else None
        self._advance()

    # -- derived state ---------------------------------------------------------------------

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def length(self) -> int:
        return len(self.canvas)

    @property
    def num_blocks(self) -> int:
        return -(-self.params.max_tokens // self.block_length)

    @property
    def block_start(self) -> int:
        return self.prompt_len + self.block_index * self.block_length

    @property
    def block_end(self) -> int:
        return min(self.block_start + self.block_length, self.length)

    @property
    def masked_in_block(self) -> list[int]:
        mask = self.mask_id
        return [i for i in range(self.block_start, self.block_end) if self.canvas[i] == mask]

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def committed_token_ids(self) -> list[int]:
        """Final generated tokens so far (the output once finished)."""
        end = self.output_end if self.output_end is not None else self.prefix_end
        return self.canvas[self.prompt_len:end]

    def window(self, shift: int) -> tuple[int, int, bool]:
        """Canvas range ``[start, end)`` to feed in this pass, and whether it goes through the cache.

        ``shift`` is the model's logit shift: a shifted model reads slot i's logits at i - 1, so the
        window starts one earlier to include that row.
        """
        mode = self.params.cache
        if mode == "none":
            return 0, self.length, False
        if self.step_in_block == 0:               # block start: refresh every position's K/V
            return 0, self.length, True
        start = self.block_start - shift
        return start, (self.length if mode == "prefix" else self.block_end), True

    # -- transitions -----------------------------------------------------------------------

    def begin_block_if_needed(self) -> None:
        if self.block_state is None:
            steps = self.sampler.steps_for_block(self.params, self.block_start - self.prompt_len,
                                                 self.block_end - self.prompt_len)
            self.block_state = self.sampler.begin_block(len(self.masked_in_block), steps, self.params)

    def commit(self, positions: list[int], token_ids: list[int]) -> None:
        """Write one pass's choices and advance the block cursor and the committed prefix."""
        for pos, tok in zip(positions, token_ids):
            self.canvas[pos] = tok
        self.num_forward_passes += 1
        self.step_in_block += 1
        self._advance()

    def _advance(self) -> None:
        """Extend the committed prefix (finishing at a stop token or a full canvas) and move the
        block cursor past blocks that have no masked slot left."""
        while self.prefix_end < self.length and self.canvas[self.prefix_end] != self.mask_id:
            if self.canvas[self.prefix_end] in self.stop_ids and self.prefix_end >= self.template_end:
                self.finish("stop", stop_reason=self.canvas[self.prefix_end], output_end=self.prefix_end)
                return
            self.prefix_end += 1
        if self.prefix_end == self.length:
            self.finish("length", output_end=self.length)
            return
        while not self.masked_in_block:
            self.block_index += 1
            self.step_in_block = 0
            self.block_state = None

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
        self.num_emitted = len(tokens)
        output = None
        if self.is_finished:
            output = GenerationOutput(
                request_id=self.request_id, prompt_token_ids=self.prompt_token_ids, token_ids=tokens,
                text=self.detokenizer.text if self.detokenizer is not None else None,
                finish_reason=self.finish_reason, stop_reason=self.stop_reason,
                num_forward_passes=self.num_forward_passes,
                metrics={"latency_s": now - self.arrival_time,
                         "ttft_s": (self.first_token_time or now) - self.arrival_time})
        return StreamChunk(self.request_id, delta_ids, delta_text, self.is_finished, self.finish_reason, output,
                           error=self.error)
