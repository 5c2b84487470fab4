"""What the engine hands back: a finished generation and the streamed deltas before it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    """One generated token's log-probability at the pass that committed it, and the likeliest
    alternatives there (``logprobs`` of them, most likely first). A token the response template
    fixed (a forced prefix, a JSON skeleton's punctuation) was never sampled: 0.0, no alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class CanvasFrame:
    """The active window of the output after one denoising pass (``stream_canvas``): what a diffusion
    model shows that an autoregressive one cannot, the draft refining in parallel.

    ``start`` is the window's first slot as an index into the output; ``token_ids`` the committed
    token per slot (None: still masked); ``draft_ids`` the model's current guess for each masked slot
    (None where committed); ``committed`` the output indices this pass committed; ``pass_index``
    counts the request's denoising passes from 1.
    """

    pass_index: int
    start: int
    token_ids: list[int | None]
    draft_ids: list[int | None]
    committed: list[int]


@dataclass
class GenerationOutput:
    """A finished request.

    ``token_ids`` are the generated tokens up to (not including) the stop token; ``text`` is their
    decoding, cut before a matched stop string. ``finish_reason`` is ``"stop"`` (EOS, end of turn or a
    stop string), ``"length"`` (the canvas was filled), ``"abort"`` or ``"error"``.
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str
    num_forward_passes: int
    stop_reason: str | int | None = None
    #: block families: passes that only cached keys and values (a prompt's prefill, finished blocks)
    num_cache_passes: int = 0
    metrics: dict = field(default_factory=dict)
    #: with ``logprobs``: one per token of ``token_ids``
    logprobs: list[TokenLogprob] | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def usage(self) -> dict:
        """OpenAI's ``usage`` of this generation."""
        prompt, completion = self.num_prompt_tokens, self.num_generated_tokens
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@dataclass
class StreamChunk:
    """Newly committed output: the tokens (and text) that can no longer change, in order.

    The last chunk of a request has ``finished=True`` and carries the whole ``output``.
    """

    request_id: str
    delta_token_ids: list[int]
    delta_text: str
    finished: bool = False
    finish_reason: str | None = None
    output: GenerationOutput | None = None
    error: str | None = None
    #: with ``logprobs``: one per token of ``delta_token_ids``
    delta_logprobs: list[TokenLogprob] | None = None
    #: with ``stream_canvas``: the frames of the passes since the last chunk, in order
    canvas: list[CanvasFrame] = field(default_factory=list)
