"""The full-sequence families (LLaDA, Dream): one canvas, bidirectional attention, blocks left to right.

The canvas is ``prompt + [mask] * max_tokens``; blocks of ``block_length`` slots after the prompt are
denoised left to right. Committed tokens never change, so the *committed prefix* (generated tokens
up to the first still-masked slot) is final: it is what streaming emits and where EOS and stop
strings are looked for. A request finishes as soon as that prefix reaches a stop token, without
denoising the rest of the canvas.

KV cache modes (Fast-dLLM's): ``none`` recomputes the whole canvas every pass (reference-exact);
with ``prefix`` and ``dual`` each block's first pass writes every position's keys and values into
the request's pages, and the passes after it feed ``[block start, end)`` (prefix) or the block alone
(dual), reading the other positions from the pages (stale until the next block start, exactly as
in Fast-dLLM's ``generate_with_dual_cache``).
"""

from __future__ import annotations

from dlm_backend.engine.requests.sequence import Pass, Sequence


class CanvasSequence(Sequence):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.canvas = self.prompt_token_ids + self.template + [self.mask_id] * (
            self.params.max_tokens - len(self.template))
        self.block_index = 0
        self._advance()

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
    def kv_positions(self) -> int:
        return 0 if self.params.cache == "none" else self.length

    def new_block_state(self) -> object:
        steps = self.sampler.steps_for_block(self.params, self.block_start - self.prompt_len,
                                             self.block_end - self.prompt_len)
        return self.sampler.begin_block(len(self.masked_in_block), steps, self.params)

    def plan(self, shift: int) -> Pass:
        mode, cfg = self.params.cache, self.params.cfg_scale > 0
        if mode == "none":
            return Pass(0, self.length, self.masked_in_block, cfg=cfg)
        if self.step_in_block == 0:               # block start: refresh every position's K/V
            start, end = 0, self.length
        else:
            start, end = self.block_start - shift, (self.length if mode == "prefix" else self.block_end)
        return Pass(start, end, self.masked_in_block, paged=True, kv_end=self.length)

    def apply(self, step: Pass, commit=None, ar_tokens=None) -> None:
        self.write([step.candidates[i] for i in commit.indices], commit.token_ids)
        self.num_forward_passes += 1
        self.step_in_block += 1
        self._advance()

    def _advance(self) -> None:
        """Extend the committed prefix (finishing at a stop token or a full canvas) and move the
        block cursor past blocks that have no masked slot left."""
        if self.scan_prefix(self.length):
            return
        if self.prefix_end == self.length:
            self.finish("length", output_end=self.length)
            return
        while not self.masked_in_block:
            self.block_index += 1
            self.step_in_block = 0
            self.block_state = None
