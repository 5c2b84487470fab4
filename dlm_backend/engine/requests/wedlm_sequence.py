"""WeDLM's decoding (schedule ``wedlm``): blocks of masks after the prompt, each pass a causal forward
over the sequence reordered so that every committed token precedes every mask.

The canvas is the prompt, then ``max_tokens`` masks, decoded in blocks of ``L`` aligned to the
prompt's end (not to position 0, unlike engine/requests/block_sequence.py); the last block is what is
left of ``max_tokens``. A pass over block ``[s, e)`` feeds, in this order, the positions before ``s``
(every one committed), the block's committed slots, then its masked ones, each at its own rotary
position (``Pass.order``), causally: each mask is predicted at its own row (no shift) from the whole
committed sequence and the masks before it. That is ``generate_wedlm``'s topological reordering,
whose reference recomputes everything each pass.

Keys of the positions before ``s`` depend on nothing after them, so the request's pages keep them:
a pass feeds only the positions not yet cached (the prompt and the previous block, in order, on the
block's first pass; later passes just the block) and reads the rest from the pages. The block's own
keys change order every pass, so its slots are rewritten each time and count as cached only once
the next block starts. There is no separate cache pass: the forward count is the reference's. Full
prompt pages are shared between requests (causal keys depend on the prompt alone). ``cache="dual"``
is ``"prefix"`` here; with ``cache="none"`` every pass feeds ``[0, e)`` as the reference does.

Committed tokens are final, so the output is final up to the first mask and the request ends at the
first final stop token (the reference itself generates all ``max_tokens``).
"""

from __future__ import annotations

from dlm_backend.engine.kv import page_hashes
from dlm_backend.engine.requests.sequence import Pass, Sequence
from dlm_backend.errors import SamplingParamsError

CAUSAL = 1              # attention blocks of one position: causal (also the pages' hash seed)


class WeDLMSequence(Sequence):
    """One request decoded as ``generate_wedlm`` decodes it (see the module docstring); any mask
    sampler that commits masked slots of the block decides its passes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        s = self.sampler
        if s.edits or s.whole_sub_block or s.ar_first_token or s.sub_block(self.params):
            raise SamplingParamsError(f"Sampler {self.params.sampler!r} rewrites committed slots, decides "
                                      "sub-blocks or an autoregressive first token, which WeDLM's reordered passes "
                                      "do not have. Use sampler 'wedlm' (or threshold, factor, entropy_bounded).",
                                      param="sampler")
        P = self.prompt_len
        self.output_limit = P + self.params.max_tokens
        slots = self.params.max_tokens
        self.canvas = self.prompt_token_ids + self.template[:slots] + [self.mask_id] * (slots - len(self.template))
        self.block_start = P
        self._advance()

    # -- derived state ---------------------------------------------------------------------

    @property
    def block_end(self) -> int:
        return min(self.block_start + self.block_length, self.output_limit)

    @property
    def kv_positions(self) -> int:
        return self.length if self.paged else 0

    def prefix_hashes(self, page_size: int) -> list[bytes]:
        """Every full prompt page: its causal keys depend on the prompt's tokens alone."""
        if not self.paged:
            return []
        return page_hashes(self.prompt_token_ids, page_size, self.prompt_len // page_size, seed=CAUSAL,
                           salt=self.params.cache_salt or "")

    # -- passes ----------------------------------------------------------------------------

    def order(self, first: int) -> list[int]:
        """Positions ``first..`` as the next pass feeds them: the committed prefix in order, then the
        block's committed slots, then its masked ones."""
        s, e = self.block_start, self.block_end
        block = range(s, e)
        return (list(range(first, s)) + [i for i in block if self.canvas[i] != self.mask_id]
                + [i for i in block if self.canvas[i] == self.mask_id])

    def new_block_state(self) -> object:
        start, end = self.block_start - self.prompt_len, self.block_end - self.prompt_len
        steps = self.sampler.steps_for_block(self.params, start, end)
        return self.sampler.begin_block(len(self.masks_in_block), steps, self.params)

    def plan(self, shift: int) -> Pass:
        first = self.num_cached if self.paged else 0
        masks = self.masks_in_block
        return Pass(first, self.block_end, masks, paged=self.paged, kv_end=self.block_end if self.paged else 0,
                    block_size=CAUSAL, order=self.order(first), shift=0)

    def apply(self, step: Pass, commit=None, ar_tokens: list[int] | None = None) -> None:
        masks_before = len(step.candidates)
        self.write([step.candidates[i] for i in commit.indices], commit.token_ids)
        self.num_forward_passes += 1
        self.step_in_block += 1
        if step.paged:                  # the block's slots hold this pass's order: not clean yet
            self.num_cached = max(self.num_cached, self.block_start)
        if self.sampler.block_done(self.block_state, self.step_in_block, masks_before, len(self.masks_in_block),
                                   0, self.params):
            self._next_block()
        self._advance()

    # -- transitions -----------------------------------------------------------------------

    def _next_block(self) -> None:
        self.block_start = self.block_end
        self.step_in_block = 0
        self.block_state = None

    def _advance(self) -> None:
        if self.scan_prefix(self.output_limit):
            return
        # A block with no mask (a response template fixed it) has nothing to decode.
        while self.block_start < self.output_limit and self.step_in_block == 0 and not self.masks_in_block:
            self._next_block()
        if self.block_start >= self.output_limit:
            self.finish("length", output_end=self.output_limit)
