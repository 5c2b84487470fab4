"""Block diffusion with causal context (Nemotron-Labs-Diffusion): the keys and values in the pages are
always autoregressive ones, and diffusion only drafts.

A causal **cache** pass writes the keys of every position not yet cached and reads the model's
next-token prediction at the last one (the slot after it, read one row back); a bidirectional
**denoise** pass feeds the current block, attends to the pages and the whole block, and writes
nothing that stays. Blocks start right after the prompt (not at multiples of the block length, as
the block-causal families align them), and the sampler (samplers/nemotron.py) picks one of three
ways through them:

* ``block``: each block opens with the cache pass's prediction in its first slot, its other slots
  are denoised, then a cache pass over the finished block writes its keys and opens the next;
* ``ar``: the same with blocks of one slot, so every token comes from a cache pass;
* ``spec``: a block of ``block_length`` opened the same way is drafted by denoise passes, then one
  causal **verify** pass over it keeps the drafted slots the model predicts autoregressively (up
  to the first it does not) and writes its own prediction in the slot after them; the keys of the
  kept slots stay in the pages and the next block opens at that slot.

A stop token ends the request where it is committed, once every slot before it is: the reference
stops denoising a block then (``block``) or keeps nothing after it (``spec``).
"""

from __future__ import annotations

from dlm_backend.engine.kv import page_hashes
from dlm_backend.engine.requests.sequence import Pass, Sequence
from dlm_backend.errors import SamplingParamsError

MODES = ("block", "ar", "spec")


class CausalBlockSequence(Sequence):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # a rule that reads only the block's slots (threshold, factor, ...: no schedules) denoises blocks
        self.mode = getattr(self.sampler, "causal_mode", "block" if self.sampler.schedules is None else None)
        if self.mode not in MODES:
            raise SamplingParamsError(
                f"Sampler {self.params.sampler!r} does not decode with causal context; this model's samplers are "
                "nemotron (block diffusion), nemotron_ar (autoregressive), nemotron_spec (self-speculation) and the "
                "rules that read only a block's slots (threshold, factor, entropy_bounded).", param="sampler")
        L = self.block_length = 1 if self.mode == "ar" else self.params.block_length
        P = self.prompt_len
        self.output_limit = P + self.params.max_tokens
        # spec: a draft block may start at the output's last slot; block: whole blocks, the output cut
        slots = self.params.max_tokens + L if self.mode == "spec" else -(-self.params.max_tokens // L) * L
        self.canvas = self.prompt_token_ids + self.template[:slots] + [self.mask_id] * (slots - len(self.template))
        self.block_start = P
        self._advance()

    # -- derived state ---------------------------------------------------------------------

    @property
    def block_end(self) -> int:
        return min(self.block_start + self.block_length, self.length)

    @property
    def kv_positions(self) -> int:
        return self.length

    def fixed(self, pos: int) -> bool:
        """Whether the response template fixes slot ``pos`` (no pass may change it)."""
        return self.prompt_len <= pos < self.template_end and self.template[pos - self.prompt_len] != self.mask_id

    def prefix_hashes(self, page_size: int) -> list[bytes]:
        """Full prompt pages before the last prompt position (whose prediction opens the first block,
        so the prefill computes it): causal keys depend on nothing after them."""
        pages = (self.prompt_len - 1) // page_size if self.prompt_len else 0
        return page_hashes(self.prompt_token_ids, page_size, pages, seed=1, salt=self.params.cache_salt or "")

    # -- passes ----------------------------------------------------------------------------

    def new_block_state(self) -> object:
        return self.sampler.begin_block(len(self.masks_in_block), self.block_length, self.params)

    def plan(self, shift: int) -> Pass:
        start, end = self.block_start, self.block_end
        if self.num_cached < start:             # the prompt's prefill, or the finished block's keys
            opens = [start] if start < self.length and self.canvas[start] == self.mask_id else []
            return Pass(self.num_cached, start, opens, paged=True, kv_end=start, block_size=1, kind="cache",
                        shift=1)
        masks = self.masks_in_block
        if masks or self.mode != "spec":
            return Pass(start, end, masks, paged=True, kv_end=end, masked=[True] * len(masks))
        return Pass(start, end, list(range(start + 1, end + 1)), paged=True, kv_end=end, block_size=1,
                    kind="cache", shift=1)       # verify: the causal prediction of every drafted slot

    def apply(self, step: Pass, commit=None, ar_tokens: list[int] | None = None) -> None:
        if step.kind == "cache":
            self.num_cache_passes += 1
            if step.start == self.block_start and self.mode == "spec":
                self._verify(ar_tokens)
            else:
                self.num_cached = step.end
                if ar_tokens and not self.fixed(step.candidates[0]):
                    self.write(step.candidates, ar_tokens)
        else:
            self.write([step.candidates[i] for i in commit.indices], commit.token_ids)
            self.num_forward_passes += 1
            self.step_in_block += 1
        self._advance()

    def _verify(self, predicted: list[int]) -> None:
        """Keep the drafted slots the causal pass predicted (each read from the slot before it), then its
        own prediction after them; the rest of the block is drafted again."""
        c, L = self.block_start, self.block_end - self.block_start
        kept = 1
        while kept < L and (self.fixed(c + kept) or self.canvas[c + kept] == predicted[kept - 1]):
            kept += 1
        nxt = c + kept
        if not self.fixed(nxt):
            self.canvas[nxt] = predicted[kept - 1]
        for pos in range(nxt + 1, c + L):
            if not self.fixed(pos):
                self.canvas[pos] = self.mask_id
        self.num_cached = self.block_start = nxt          # the kept slots' causal keys stay
        self.step_in_block, self.block_state = 0, None

    # -- transitions -----------------------------------------------------------------------

    def _advance(self) -> None:
        if self.is_finished:
            return
        # spec: a block's drafted slots are not output until a verify keeps them
        limit = self.block_start + 1 if self.mode == "spec" else self.length
        if self.scan_prefix(min(limit, self.output_limit)):
            return
        if self.prefix_end >= self.output_limit:
            self.finish("length", output_end=self.output_limit)
            return
        if self.mode == "spec":
            return
        # a block with no mask left is done (the template may have filled it, or it is one slot)
        while self.block_start < self.output_limit and self.mask_id not in self.canvas[self.block_start:self.block_end]:
            self.block_start = self.block_end
            self.step_in_block, self.block_state = 0, None
