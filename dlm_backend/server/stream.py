"""Server-sent events for streamed chat and text completions, and a response that always closes them."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import aclosing
from typing import AsyncIterator

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse

from dlm_backend import chat
from dlm_backend.errors import DLMError, EngineError
from dlm_backend.server.errors import error_body

log = logging.getLogger("dlm_backend.server")
DISCONNECT_POLL_S = 0.25


class ClosingStreamingResponse(StreamingResponse):
    """A stream that closes its body generator however it ends, then calls ``on_close``.

    When the client leaves, Starlette cancels the streaming task but leaves the generator suspended
    for the garbage collector to finalize, so its engine request could run on for nobody until then
    (the load test saw a dropped stream run to the end). Closing it here aborts the request at once;
    ``on_close`` gives the request's server slot back even if the stream never started: it runs when
    the whole response call ends, since a streaming task cancelled before its first step (the client
    gone at once) never enters ``stream_response`` and so never reaches a ``finally`` there.
    """

    def __init__(self, content, on_close=None, **kwargs):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):     # the task is being cancelled: still close
                await self.body_iterator.aclose()
            self._close_now()

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()     # the engine request aborts here, not at GC
            self._close_now()

    def _close_now(self) -> None:
        on_close, self.on_close = self.on_close, None        # once, whichever path gets here first
        if on_close is not None:
            on_close()


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"


def sse_error(exc: Exception) -> str:
    """An error after the 200 went out: OpenAI clients raise on an ``error`` event."""
    if not isinstance(exc, DLMError):
        log.error("stream failed: %s: %s", type(exc).__name__, exc)
        exc = EngineError(f"Internal error ({type(exc).__name__}); the server keeps running.")
    return sse(error_body(500 if isinstance(exc, EngineError) else 400, str(exc), getattr(exc, "param", None)))


async def chat_events(llm, plan, base: dict, include_usage: bool, include_canvas: bool = False) -> AsyncIterator[str]:
    """A streamed chat completion: role, content and tool-call deltas, finish, usage, [DONE]; a
    failure after the 200 is an error event, then [DONE]. With ``include_canvas`` each denoising
    pass also sends a chunk with no choices and its canvas frame under ``dlm_canvas`` (as the usage
    chunk carries ``usage``): clients that did not ask never see one."""
    base = {**base, "object": "chat.completion.chunk"}
    yield sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    try:
        # aclosing: an early close (client gone) reaches the engine stream and aborts its request.
        async with aclosing(chat.astream(llm, plan.request, plan)) as deltas:
            async for delta in deltas:
                for frame in delta.canvas if include_canvas else ():
                    yield sse({**base, "choices": [], "dlm_canvas": frame})
                for event in _chat_event(base, delta, include_usage):
                    yield event
    except Exception as exc:  # noqa: BLE001 - every failure reaches the client as an event
        yield sse_error(exc)
    yield DONE


def _chat_event(base: dict, delta, include_usage: bool) -> list[str]:
    if delta.result is not None:
        events = [sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": delta.result.finish_reason}]})]
        return events + ([sse({**base, "choices": [], "usage": delta.result.usage})] if include_usage else [])
    if delta.tool_call is not None:
        call = {"index": delta.index, **delta.tool_call}
        return [sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]})]
    if delta.content:
        choice = {"index": 0, "delta": {"content": delta.content}, "finish_reason": None}
        if delta.logprobs is not None:
            choice["logprobs"] = {"content": delta.logprobs}
        return [sse({**base, "choices": [choice]})]
    return []


async def completion_events(llm, ids, params, base: dict, include_usage: bool) -> AsyncIterator[str]:
    """A streamed text completion: text deltas (with their logprobs when asked), finish, usage,
    [DONE]; canvas frames as choice-less chunks when the request asked for them (``stream_canvas``)."""
    base = {**base, "object": "text_completion"}
    try:
        async with aclosing(llm.astream(prompt_token_ids=ids, sampling_params=params)) as chunks:
            offset = 0
            async for chunk in chunks:
                for frame in chunk.canvas:          # a token-id prompt may have no tokenizer: ids stand in
                    yield sse({**base, "choices": [], "dlm_canvas": chat.canvas_frame(llm.engine.tokenizer, frame)})
                finish = chunk.finish_reason if chunk.finished else None
                if chunk.delta_text or finish:
                    logprobs = None if chunk.delta_logprobs is None else \
                        chat.completion_logprobs(llm.engine.tokenizer, chunk.delta_logprobs, offset)
                    offset += len(chunk.delta_text)
                    yield sse({**base, "choices": [{"index": 0, "text": chunk.delta_text, "finish_reason": finish,
                                                    "logprobs": logprobs}]})
                if chunk.finished and include_usage:
                    yield sse({**base, "choices": [], "usage": chunk.output.usage})
    except Exception as exc:  # noqa: BLE001
        yield sse_error(exc)
    yield DONE


def streamed(events, slot) -> ClosingStreamingResponse:
    """The response for a stream that owns ``slot`` from here on (built first: a slot handed to a
    response that was never made would never come back)."""
    response = ClosingStreamingResponse(events, media_type="text/event-stream")
    response.on_close = slot.hand_over()
    return response


async def unless_disconnected(http: Request, work):
    """Await ``work``; if the client goes away first, cancel it (freeing its engine slot) and return None."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await http.is_disconnected():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
