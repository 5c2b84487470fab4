"""What the engine shows beyond text, in the shapes the front doors send: token logprobs as OpenAI's
``logprobs.content`` entries, and canvas frames with each slot's text; and :class:`Observed`, which
puts both on a streamed generation's chat events."""

from __future__ import annotations

from dlm_backend.chat.messages import ChatDelta
from dlm_backend.engine.outputs import CanvasFrame, TokenLogprob


def _piece(tokenizer, token_id: int) -> str:
    """One token's text as a piece of the answer (a byte-level piece of a longer character may
    decode to U+FFFD alone; ``bytes`` carries its exact bytes)."""
    return tokenizer.decode([token_id]) if tokenizer is not None else str(token_id)


def _entry(tokenizer, token_id: int, logprob: float) -> dict:
    text = _piece(tokenizer, token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def openai_logprobs(tokenizer, logprobs: list[TokenLogprob] | None) -> list[dict] | None:
    """OpenAI's ``choices[].logprobs.content``: per token its text, logprob, UTF-8 bytes and the
    requested ``top_logprobs`` alternatives (None when the request asked for none)."""
    if logprobs is None:
        return None
    return [{**_entry(tokenizer, lp.token_id, lp.logprob),
             "top_logprobs": [_entry(tokenizer, t, v) for t, v in lp.top]} for lp in logprobs]


def completion_logprobs(tokenizer, logprobs: list[TokenLogprob] | None, offset: int = 0) -> dict | None:
    """The legacy ``/v1/completions`` shape: ``tokens``, ``token_logprobs``, ``top_logprobs`` (one
    {text: logprob} per token) and ``text_offset`` (each token's start in the text, from ``offset``)."""
    if logprobs is None:
        return None
    tokens = [_piece(tokenizer, lp.token_id) for lp in logprobs]
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{_piece(tokenizer, t): v for t, v in lp.top} for lp in logprobs],
            "text_offset": offsets}


def canvas_frame(tokenizer, frame: CanvasFrame) -> dict:
    """A canvas frame for a client: each slot's committed text (None: masked) and the model's draft
    text for masked slots, with the ids beside them and the pass's committed output indices."""
    def texts(ids):
        return [None if t is None else _piece(tokenizer, t) for t in ids]
    return {"pass": frame.pass_index, "start": frame.start, "tokens": texts(frame.token_ids),
            "draft": texts(frame.draft_ids), "committed": frame.committed, "token_ids": frame.token_ids,
            "draft_ids": frame.draft_ids}


class Observed:
    """A streamed generation's canvas frames and token logprobs, put on the events its text makes:
    frames on an event of their own as they come, logprobs on the next content event (the splitter
    may hold text back, so they go out with the text that follows them)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.logprobs = tokenizer, None

    def events(self, chunk, events: list[ChatDelta]) -> list[ChatDelta]:
        out = [ChatDelta(canvas=[canvas_frame(self.tokenizer, f) for f in chunk.canvas])] if chunk.canvas else []
        if chunk.delta_logprobs:
            self.logprobs = (self.logprobs or []) + openai_logprobs(self.tokenizer, chunk.delta_logprobs)
        for event in events:
            if event.content and self.logprobs is not None:
                event.logprobs, self.logprobs = self.logprobs, None
            out.append(event)
        return out


def finished(tokenizer, event: ChatDelta) -> ChatDelta:
    """``event``, its result (the last event's) given the answer's token logprobs in OpenAI's shape."""
    if event.result is not None and event.result.logprobs is None:
        event.result.logprobs = openai_logprobs(tokenizer, event.result.output.logprobs)
    return event
