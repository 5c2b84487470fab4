"""Running a chat request: to the end (complete) or as events (stream), for sync and async callers.

What to run is decided once, by :meth:`Plan.passes`; these four functions only run the passes it
yields, with the engine's sync or async calls, and turn a streamed pass into events. A ``timeout``
(seconds, or a front door's :class:`Deadline` that began with its call) bounds all of a request's
passes together.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from typing import AsyncIterator, Iterator

from dlm_backend.chat.messages import ChatDelta, ChatRequest, ChatResult
from dlm_backend.chat.plan import Call, Json, Plan
from dlm_backend.chat.tool_calls import CLOSE, OPEN
from dlm_backend.errors import RequestTimeoutError


class Deadline:
    """A request's ``timeout`` in seconds (None: none) from now, as the time each step has left."""

    def __init__(self, timeout: float | None):
        self.timeout = timeout
        self._end = None if timeout is None else time.monotonic() + timeout

    @classmethod
    def of(cls, timeout: "float | Deadline | None") -> "Deadline":
        return timeout if isinstance(timeout, Deadline) else cls(timeout)

    def left(self) -> float | None:
        """Seconds left (None without a timeout); a RequestTimeoutError once none are."""
        if self._end is None:
            return None
        rest = self._end - time.monotonic()
        if rest <= 0:
            raise self.expired()
        return rest

    def expired(self) -> RequestTimeoutError:
        return RequestTimeoutError(f"The request did not finish within its timeout of {self.timeout:.3g} s; "
                                   "it was aborted and its engine slot freed.")

    # ``with deadline:`` names the whole request's timeout in a pass's RequestTimeoutError
    def __enter__(self) -> "Deadline":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if isinstance(exc, RequestTimeoutError) and self.timeout is not None:
            raise self.expired() from None


def complete(llm, request: ChatRequest, plan: Plan | None = None, timeout: float | Deadline | None = None) -> ChatResult:
    """Run one chat request to the end (``plan``: the request already planned)."""
    deadline = Deadline.of(timeout)
    plan = plan or Plan(llm, request)
    passes, out = plan.passes(), None
    with deadline:
        while (step := passes.next(out)) is not None:
            out = llm.generate(prompt_token_ids=[plan.prompt_ids], sampling_params=step.params,
                               response_template=step.template, timeout=deadline.left())[0]
    return passes.result


async def acomplete(llm, request: ChatRequest, plan: Plan | None = None, timeout: float | Deadline | None = None) -> ChatResult:
    """``complete`` without blocking the event loop (planning, and reading an answer with JSON
    validation, run in a worker thread)."""
    deadline = Deadline.of(timeout)
    plan = plan or await asyncio.to_thread(Plan, llm, request)
    passes, out = plan.passes(), None
    with deadline:
        while (step := await asyncio.to_thread(passes.next, out)) is not None:
            out = (await llm.agenerate(prompt_token_ids=[plan.prompt_ids], sampling_params=step.params,
                                       response_template=step.template, timeout=deadline.left()))[0]
    return passes.result


def stream(llm, request: ChatRequest, plan: Plan | None = None, timeout: float | Deadline | None = None) -> Iterator[ChatDelta]:
    """Content as it is committed, tool calls once complete, then the final result."""
    deadline = Deadline.of(timeout)
    plan = plan or Plan(llm, request)
    passes, out, events, shown = plan.passes(stream=True), None, None, _Shown(plan)
    with deadline:
        while (step := passes.next(out)) is not None:
            if not step.streamed:
                yield from shown.grow(step.settled)
                out = llm.generate(prompt_token_ids=[plan.prompt_ids], sampling_params=step.params,
                                   response_template=step.template, timeout=deadline.left())[0]
                continue
            events = _Splitter(plan)
            for chunk in llm.stream(prompt_token_ids=plan.prompt_ids, sampling_params=step.params,
                                    response_template=step.template, timeout=deadline.left()):
                yield from events.feed(chunk.delta_text)
                out = chunk.output
    yield from shown.finish(passes.result)
    yield from _closing(events, passes.result, shown)


async def astream(llm, request: ChatRequest, plan: Plan | None = None,
                  timeout: float | Deadline | None = None) -> AsyncIterator[ChatDelta]:
    """``stream`` without blocking the event loop."""
    deadline = Deadline.of(timeout)
    plan = plan or await asyncio.to_thread(Plan, llm, request)
    passes, out, events, shown = plan.passes(stream=True), None, None, _Shown(plan)
    with deadline:
        while (step := await asyncio.to_thread(passes.next, out)) is not None:
            if not step.streamed:
                for event in shown.grow(step.settled):
                    yield event
                out = (await llm.agenerate(prompt_token_ids=[plan.prompt_ids], sampling_params=step.params,
                                           response_template=step.template, timeout=deadline.left()))[0]
                continue
            events = _Splitter(plan)
            chunks = llm.astream(prompt_token_ids=plan.prompt_ids, sampling_params=step.params,
                                 response_template=step.template, timeout=deadline.left())
            async with aclosing(chunks):          # closed early (client gone): the request is aborted
                async for chunk in chunks:
                    for event in events.feed(chunk.delta_text):
                        yield event
                    out = chunk.output
    for event in shown.finish(passes.result):
        yield event
    for event in _closing(events, passes.result, shown):
        yield event


class _Shown:
    """An answer written a value at a time, streamed as it is written: each value's pass settles more
    of it. Structured output goes out as content (the JSON settled so far, always a prefix of the
    answer); a forced call as tool-call chunks in OpenAI's streaming form (the first with the call's
    id and name, the rest with argument text only), as its arguments settle."""

    def __init__(self, plan: Plan):
        self.plan, self.text, self.started = plan, "", False

    @property
    def json(self) -> bool:
        shape = self.plan.shape
        return isinstance(shape, Json) and shape.plan.templated

    @property
    def call(self) -> bool:
        shape = self.plan.shape
        return isinstance(shape, Call) and shape.written

    def grow(self, settled: str | None) -> list[ChatDelta]:
        if settled is None or not (self.json or self.call):
            return []
        if self.call:
            head = self.plan.shape.head
            if not settled.startswith(head):
                return []
            settled = settled[len(head):]
        if not settled.startswith(self.text) or settled == self.text:
            return []
        delta, self.text = settled[len(self.text):], settled
        if self.json:
            return [ChatDelta(content=delta)]
        chunk = {"function": {"arguments": delta}}
        if not self.started:
            self.started = True
            chunk = {"id": self.plan.call_id, "type": "function",
                     "function": {"name": self.plan.shape.name, "arguments": delta}}
        return [ChatDelta(tool_call=chunk, index=0)]

    def finish(self, result: ChatResult) -> list[ChatDelta]:
        """The rest of the answer once it is done."""
        if self.json:
            return self.grow(result.content)
        if self.call and result.tool_calls:
            return self.grow(self.plan.shape.head + result.tool_calls[0]["function"]["arguments"])
        return []


def _closing(events: "_Splitter | None", result: ChatResult, shown: _Shown) -> list[ChatDelta]:
    """The events a stream ends with: the rest of a streamed answer, or a whole one that was not
    streamed (``shown``: an answer already sent as it was written)."""
    if events is not None:
        return events.close(result)
    whole = [ChatDelta(content=result.content)] if result.content and not shown.text else []
    if not shown.started:
        whole += [ChatDelta(tool_call=call, index=i) for i, call in enumerate(result.tool_calls)]
    return whole + [ChatDelta(result=result)]


class _Splitter:
    """Turns committed text deltas into content deltas and whole tool calls, in order."""

    def __init__(self, plan: Plan):
        self.plan, self.buffer = plan, ""
        # Structured output and forced calls are read back from their skeleton at the end (close);
        # what the canvas holds around the slots is not content (a forced call has none).
        shape = plan.shape
        self.quiet = isinstance(shape, Json) or (isinstance(shape, Call) and shape.written)
        self.raw = plan.tools is not None and not self.quiet

    def feed(self, delta: str) -> list[ChatDelta]:
        if self.quiet:
            return []
        if not self.raw:
            return [ChatDelta(content=delta)] if delta else []
        self.buffer += delta
        events = []
        while True:
            start = self.buffer.find(OPEN)
            if start == -1:
                keep = next((n for n in range(len(OPEN) - 1, 0, -1) if self.buffer.endswith(OPEN[:n])), 0)
                text, self.buffer = self.buffer[:len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
                if text:
                    events.append(ChatDelta(content=text))
                return events
            if start:
                events.append(ChatDelta(content=self.buffer[:start]))
            end = self.buffer.find(CLOSE, start)
            if end == -1:
                self.buffer = self.buffer[start:]
                return events
            self.buffer = self.buffer[end + len(CLOSE):]

    def close(self, result: ChatResult) -> list[ChatDelta]:
        # Structured output is sent whole: the raw canvas around the value slots is not the answer
        # (a slot may hold text past its closing quote), the JSON read back from the slots is.
        events = [ChatDelta(content=result.content)] if isinstance(self.plan.shape, Json) else []
        # Text held back because it might have begun a call ("... <", or cut off at "<tool_") is content.
        if self.raw and self.buffer and not self.buffer.startswith(OPEN):
            events.append(ChatDelta(content=self.buffer))
        # A malformed call was held back like any call; it is content after all (as in complete()).
        events += [ChatDelta(content=bad["text"]) for bad in result.invalid_tool_calls]
        events += [ChatDelta(tool_call=call, index=i) for i, call in enumerate(result.tool_calls)]
        return events + [ChatDelta(result=result)]
