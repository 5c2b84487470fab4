"""The block-diffusion families (LLaDA2.x, SDAR/TraDo, Fast-dLLM v2): autoregressive across blocks,
diffusion inside a block.

Blocks of ``L`` positions are aligned to absolute position 0, as every reference aligns them: the
canvas is the prompt, then masks up to the end of the block holding ``prompt + max_tokens`` (the
output is cut there), and the first decoded block is ``P // L``, so a prompt's tail shares it.
Attention is block-causal: a position sees its own block and every earlier one. So the keys and
values of a finished block never change, and the request's pages hold them:

* a **cache** pass writes the keys and values of positions not yet cached (the prompt's full blocks,
  then each finished block) and reads the argmax at the next block's first slot where the family
  predicts it autoregressively (Fast-dLLM v2);
* a **denoise** pass feeds the current block, attends to the pages and its own block, and lets the
  sampler commit (or, for editing samplers, rewrite) slots of the block. With ``cache="dual"``, a
  pass whose sub-block starts with a committed slot feeds just the sub-block and reads the rest of
  the block from the pages, as the block's last full pass wrote them (Fast-dLLM v2's block cache).

With ``cache="none"`` every denoise pass recomputes ``[0, block end)`` instead, as the Hugging Face
``generate`` of LLaDA2 does. Non-editing samplers' committed tokens never change, so the output is
final up to the first mask; an editing sampler's block is final once the block is done.

Every request decodes on its own, whatever else shares its forwards. Fast-dLLM v2's eval sampler
(``batch_sample``) does not: its rows share decisions (when the block cache is rebuilt, which rows get
a block's autoregressive first token, how long a finished row stays). Requests that join one
:class:`BatchSample` (``BlockSequence.join_batch``) are decoded as that function decodes its rows.
"""

from __future__ import annotations

from dlm_backend.engine.kv import page_hashes
from dlm_backend.engine.requests.batch_sample import BatchSample
from dlm_backend.engine.requests.sequence import Pass, Sequence


class BlockSequence(Sequence):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.block_length = L = self.params.block_length      # the model's block: never cut to max_tokens
        P = self.prompt_len
        self.output_limit = P + self.params.max_tokens
        slots = -(-self.output_limit // L) * L - P
        self.canvas = self.prompt_token_ids + self.template[:slots] + [self.mask_id] * (slots - len(self.template))
        self.block_start = (P // L) * L
        self.block_written = False                       # a full-block pass wrote this block's keys
        self.group: BatchSample | None = None           # decoded in lock-step with other rows (join_batch)
        self._advance()

    def join_batch(self, rows: list[BlockSequence]) -> None:
        """Decode this request as one row of Fast-dLLM v2's ``batch_sample`` together with the requests
        already in ``rows`` (in row order; this one is appended). Every row must be queued before the
        first step and run in the same steps (the scheduler's limits must let the whole batch in)."""
        self.group = rows[0].group if rows else BatchSample()
        rows.append(self)
        self.group.add(self)

    # -- derived state ---------------------------------------------------------------------

    @property
    def block_end(self) -> int:
        return min(self.block_start + self.block_length, self.length)

    @property
    def kv_positions(self) -> int:
        return self.length if self.paged else 0

    def prefix_hashes(self, page_size: int) -> list[bytes]:
        """Full prompt pages before the first decoded block (whose keys depend on nothing after
        them), when pages hold whole blocks; the block length is part of the name. A family that
        reads the first slot's token from the prompt's last position keeps that page its own, so
        its cache pass computes it."""
        if not self.paged or page_size % self.block_length or self.group is not None:
            return []
        first = (self.prompt_len // self.block_length) * self.block_length
        pages = (first - 1 if self.sampler.ar_first_token else first) // page_size
        # another block length is another attention mask, so other keys and values
        return page_hashes(self.prompt_token_ids, page_size, max(pages, 0), seed=self.block_length,
                           salt=self.params.cache_salt or "")

    def _sub_block(self) -> tuple[int, int]:
        """The current sub-block: the first ``sub_block`` slice of the block that has masks."""
        size = self.sampler.sub_block(self.params) or self.block_length
        for start in range(self.block_start, self.block_end, size):
            end = min(start + size, self.block_end)
            if any(self.canvas[i] == self.mask_id for i in range(start, end)):
                return start, end
        return self.block_start, self.block_end

    def _candidates(self, sub_start: int, sub_end: int) -> list[int]:
        if self.sampler.edits:                  # masked slots, and committed ones past prompt and template
            return [i for i in range(max(self.block_start, self.prompt_len), self.block_end)
                    if self.canvas[i] == self.mask_id or i >= self.template_end]
        if self.sampler.whole_sub_block:
            return list(range(sub_start, sub_end))
        return [i for i in range(sub_start, sub_end) if self.canvas[i] == self.mask_id]

    # -- passes ----------------------------------------------------------------------------

    def new_block_state(self) -> object:
        start, end = self.block_start - self.prompt_len, self.block_end - self.prompt_len
        steps = self.sampler.steps_for_block(self.params, start, end)
        return self.sampler.begin_block(len(self.masks_in_block), steps, self.params)

    def plan(self, shift: int) -> Pass:
        if self.group is not None:
            return self.group.plan(self)
        L, start, end = self.block_length, self.block_start, self.block_end
        ar = self.sampler.ar_first_token and start < self.length and self.canvas[start] == self.mask_id and start
        if self.paged and self.num_cached < start:
            return Pass(self.num_cached, start, [start] if ar else [], paged=True, kv_end=start, block_size=L,
                        kind="cache")
        if ar:                                          # no pages: the block's first token from [0, start)
            return Pass(0, start, [start], block_size=L, kind="cache")
        sub_start, sub_end = self._sub_block()
        cands = self._candidates(sub_start, sub_end)
        masked = [self.canvas[i] == self.mask_id for i in cands]
        if not self.paged:
            return Pass(0, end, cands, block_size=L, masked=masked)
        if self.params.cache == "dual" and self.block_written and self.canvas[sub_start] != self.mask_id:
            return Pass(sub_start, sub_end, cands, paged=True, kv_end=end, block_size=L, masked=masked)
        return Pass(start, end, cands, paged=True, kv_end=end, block_size=L, masked=masked)

    def apply(self, step: Pass, commit=None, ar_tokens: list[int] | None = None) -> None:
        if self.group is not None:
            self.group.apply(self, step, commit, ar_tokens)
            return
        if step.kind == "cache":
            self.num_cache_passes += 1
            if step.paged:
                self.num_cached = step.end
            if ar_tokens:
                self.write(step.candidates, ar_tokens)
            self._advance()
            return
        masks_before = len(self.masks_in_block)
        positions = [step.candidates[i] for i in commit.indices]
        edits = sum(self.canvas[p] != self.mask_id and self.canvas[p] != t for p, t in zip(positions, commit.token_ids))
        self.write(positions, commit.token_ids)
        self.num_forward_passes += 1
        self.step_in_block += 1
        self.block_written = self.block_written or step.start == self.block_start
        if self.sampler.block_done(self.block_state, self.step_in_block, masks_before, len(self.masks_in_block),
                                   edits, self.params):
            self._finish_block()
        self._advance()

    # -- transitions -----------------------------------------------------------------------

    def _finish_block(self) -> None:
        end = self.block_end
        if self.sampler.edits:
            self.prefix_end = min(end, self.output_limit)
        if not self.params.eos_early_stop and self.sampler.stops_at_block_end(self.params):
            stop = self._first_stop(end)
            if stop is not None:
                self._stop_at(stop)
                return
        self.block_start = end
        self.step_in_block = 0
        self.block_state = None
        self.block_written = False

    def _advance(self) -> None:
        if self.is_finished:
            return
        early = self.params.eos_early_stop
        if not self.sampler.edits:
            # Committed slots are final up to the first mask. Without early stop a stop token holds the
            # output there until the sampler's rule ends the request, so nothing past it is streamed.
            while self.prefix_end < self.output_limit and self.canvas[self.prefix_end] != self.mask_id:
                if self.canvas[self.prefix_end] in self.stop_ids and self.prefix_end >= self.template_end:
                    if early:
                        self._stop_at(self.prefix_end)
                        return
                    break
                self.prefix_end += 1
        elif early and self._first_stop(self.prefix_end) is not None:
            self._stop_at(self._first_stop(self.prefix_end))
            return
        if not self.sampler.edits:
            # A block with no masked slot left in the output has nothing to decode: the response template
            # fixed it, or Fast-dLLM's autoregressive first token was the output's last slot. (A block
            # with one still decodes the slots past the output's end as well, as the references do.)
            while self.block_start < self.output_limit and self.step_in_block == 0 and self.mask_id not in \
                    self.canvas[self.block_start:min(self.block_end, self.output_limit)]:
                self._finish_block()
                if self.is_finished:
                    return
        if self.block_start >= self.output_limit:
            stop = self._first_stop(self.output_limit)
            if stop is not None:
                self._stop_at(stop)
            else:
                self.finish("length", output_end=self.output_limit)

    def _first_stop(self, end: int) -> int | None:
        return next((i for i in range(self.template_end, min(end, self.output_limit))
                     if self.canvas[i] in self.stop_ids), None)

    def _stop_at(self, pos: int) -> None:
        self.prefix_end = pos
        self.finish("stop", stop_reason=self.canvas[pos], output_end=pos)
