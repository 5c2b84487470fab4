"""The uniform-noise families (DiffusionGemma): canvases of random tokens after the prompt, one at a time,
each encoded into the KV cache once it is final.

The output is ``ceil(max_tokens / L)`` canvases of ``L`` (``canvas_length``) slots starting right
after the prompt (not aligned to position 0, unlike engine/requests/block_sequence.py). The model is an encoder and
a decoder with shared weights, and a request's passes alternate between them:

* a **cache** pass is the encoder: causal over the positions not yet cached (the prompt, then each
  finished canvas, pads included as the reference), writing their keys and values;
* a **denoise** pass is the decoder over the current canvas: bidirectional over the cached prefix
  and the canvas, with the previous step's self-conditioning (:attr:`conditioning`, a device tensor
  the runner keeps here). Its keys and values go to the canvas's own pages, read by nobody else and
  overwritten by the canvas's cache pass.

During denoising ``canvas`` holds the noisy tokens the next pass reads; nothing of a canvas is
committed until the sampler says it is done, then its argmax tokens are, all at once: that is what
streaming emits, where stop tokens are looked for (the reference pads after the first EOS; the
output ends there) and what the next cache pass encodes. Slots a response template fixes keep their
token throughout; a canvas the template fixes whole (to the end of the output) is not denoised.
Keys and values of every position are kept, sliding-window layers included (their window is a mask
and attention reads only the keys it shows): exact and simple, at 220 KB a position for the 26B-A4B
in bf16 where a window-sized ring would keep 1023 positions of its 25 sliding layers
(docs/architecture.md).
"""

from __future__ import annotations

from dlm_backend.engine.requests.sequence import Pass, Sequence


class UniformSequence(Sequence):
    def __init__(self, prompt_token_ids, params, sampler, tokens, request_id=None, response_template=None,
                 tokenizer=None):
        super().__init__(prompt_token_ids, params, sampler, tokens, request_id, response_template, tokenizer)
        self.block_length = L = self.params.block_length       # the canvas: never cut to max_tokens
        self.vocab_size = tokens.vocab_size
        P = self.prompt_len
        self.output_limit = P + self.params.max_tokens
        slots = -(-self.params.max_tokens // L) * L
        free = self.mask_id
        self.canvas = self.prompt_token_ids + self.template[:slots] + [free] * (slots - len(self.template))
        self.fixed = [t != free for t in self.canvas]          # the prompt and the template's tokens
        self.canvas_start = P
        #: the decoder's self-conditioning input for the next pass (None: the canvas's first pass)
        self.conditioning = None
        #: the first canvas's starting tokens instead of random ones (the reference's decoder_input_ids;
        #: the random draw is still made, as the reference makes it): set before the first pass
        self.start_canvas: list[int] | None = None
        self._skip_fixed()

    @property
    def canvas_end(self) -> int:
        return self.canvas_start + self.block_length

    @property
    def kv_positions(self) -> int:
        return self.length

    def prefix_hashes(self, page_size: int) -> list[bytes]:
        """None are shared. The causal encoder's keys of a full prompt page depend on nothing after it,
        but a prompt encoded from a cached page on differs from one encoded whole in the last bits
        (1e-5 in the logits), and 48 self-conditioned steps turn that into other tokens: the same
        seed must give the same text."""
        return []

    # -- passes ----------------------------------------------------------------------------

    def plan(self, shift: int) -> Pass:
        start, end = self.canvas_start, self.canvas_end
        if self.num_cached < start:
            return Pass(self.num_cached, start, [], paged=True, kv_end=start, block_size=1, kind="cache")
        return Pass(start, end, list(range(start, end)), paged=True, kv_end=end,
                    masked=[not f for f in self.fixed[start:end]], decoder=True, conditioning=self.conditioning)

    def new_block_state(self) -> object:
        """The canvas's first tokens, drawn through the request's draws (the runner has given them) in
        the reference's order, written into the canvas the decoder pass reads."""
        start, end = self.canvas_start, self.canvas_end
        state = self.sampler.begin_canvas(self.random, self.vocab_size, self.block_length, self.params)
        if self.start_canvas is not None:
            state.canvas, self.start_canvas = list(self.start_canvas), None
        state.canvas = [self.canvas[p] if self.fixed[p] else t for p, t in zip(range(start, end), state.canvas)]
        self.write(range(start, end), state.canvas)
        return state

    def apply(self, step: Pass, commit=None, ar_tokens: list[int] | None = None) -> None:
        if step.kind == "cache":
            self.num_cache_passes += 1
            self.num_cached = step.end
            return
        self.num_forward_passes += 1
        self.step_in_block += 1
        self.conditioning = commit.conditioning
        self.write([step.candidates[i] for i in commit.indices], commit.token_ids)
        if self.block_state.done:
            self._commit_canvas()

    # -- transitions -----------------------------------------------------------------------

    def _commit_canvas(self) -> None:
        start, end = self.canvas_start, self.canvas_end
        stop = next((i for i in range(max(start, self.template_end), min(end, self.output_limit))
                     if self.canvas[i] in self.stop_ids), None)
        if stop is not None:
            self.prefix_end = stop
            self.finish("stop", stop_reason=self.canvas[stop], output_end=stop)
            return
        self.prefix_end = min(end, self.output_limit)
        if end >= self.output_limit:
            self.finish("length", output_end=self.output_limit)
            return
        self.canvas_start, self.block_state, self.conditioning, self.step_in_block = end, None, None, 0
        self._skip_fixed()

    def _skip_fixed(self) -> None:
        """Commit canvases a response template fixes to the end of the output without denoising them."""
        while not self.is_finished and all(self.fixed[self.canvas_start:min(self.canvas_end, self.output_limit)]):
            self._commit_canvas()
