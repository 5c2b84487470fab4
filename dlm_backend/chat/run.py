"""Running a chat request: to the end (complete) or as events (stream), for sync and async callers.

What to run is decided by the plan's run (:class:`Generations`). :func:`_driver` is the one driver of
a run, for every caller: a generator that yields the work each step needs, :class:`_Work` for the
CPU (the plan's next step) or :class:`_Generate` for the engine, receives its result, and yields the
events a stream sends. :func:`_stepped` steps it with the engine's blocking calls and
:func:`_astepped` with its async ones; that is all the sync and async paths do differently. A
``timeout`` (seconds, or a front door's :class:`Deadline` that began with its call) bounds all of a
request's generations together.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing, closing
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterator

from dlm_backend.chat.generations import Generations
from dlm_backend.chat.messages import ChatDelta, ChatRequest, ChatResult
from dlm_backend.chat.observed import Observed, finished
from dlm_backend.chat.plan import Call, Generation, Json, Plan
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

    # ``with deadline:`` names the whole request's timeout in a generation's RequestTimeoutError
    def __enter__(self) -> "Deadline":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if isinstance(exc, RequestTimeoutError) and self.timeout is not None:
            raise self.expired() from None


def complete(llm, request: ChatRequest, plan: Plan | None = None, timeout: float | Deadline | None = None) -> ChatResult:
    """Run one chat request to the end (``plan``: the request already planned)."""
    deadline = Deadline.of(timeout)
    plan = plan or Plan(llm, request)
    with deadline:
        [done] = _stepped(llm, plan, _driver(plan, False, deadline))
    return done.result


async def acomplete(llm, request: ChatRequest, plan: Plan | None = None, timeout: float | Deadline | None = None) -> ChatResult:
    """``complete`` without blocking the event loop (planning, and reading an answer with JSON
    validation, run in a worker thread)."""
    deadline = Deadline.of(timeout)
    plan = plan or await asyncio.to_thread(Plan, llm, request)
    with deadline:
        [done] = [event async for event in _astepped(llm, plan, _driver(plan, False, deadline))]
    return done.result


def stream(llm, request: ChatRequest, plan: Plan | None = None, timeout: float | Deadline | None = None) -> Iterator[ChatDelta]:
    """Content as it is committed, tool calls once complete, then the final result."""
    deadline = Deadline.of(timeout)
    plan = plan or Plan(llm, request)
    with deadline:
        yield from _stepped(llm, plan, _driver(plan, True, deadline))


async def astream(llm, request: ChatRequest, plan: Plan | None = None,
                  timeout: float | Deadline | None = None) -> AsyncIterator[ChatDelta]:
    """``stream`` without blocking the event loop."""
    deadline = Deadline.of(timeout)
    plan = plan or await asyncio.to_thread(Plan, llm, request)
    with deadline:
        async with aclosing(_astepped(llm, plan, _driver(plan, True, deadline))) as events:
            async for event in events:
                yield event


@dataclass(frozen=True)
class _Work:
    """CPU work the run needs next (the plan's next step: planning a value, reading an answer,
    validating JSON); an async caller runs it in a worker thread, off the event loop."""

    call: Callable
    arg: object


@dataclass(frozen=True)
class _Generate:
    """A generation for the engine: its output is sent back. A streamed one (``split`` set) turns its
    chunks into events as they come, which the stepper yields."""

    generation: Generation
    timeout: float | None
    split: "Splitter | None"

    @property
    def engine_args(self) -> dict:
        """The engine call's arguments besides the prompt."""
        g = self.generation
        return {"sampling_params": g.params, "response_template": g.template, "timeout": self.timeout}


def _driver(plan: Plan, stream: bool, deadline: Deadline):
    """One run of ``plan``: yields :class:`_Work` and :class:`_Generate` (each answered with its
    result) and, streaming, the events to send; a run to the end yields only the last event, which
    carries the result."""
    run = Generations(plan, stream)
    out, split, shown = None, None, _Shown(run)
    while (step := (yield _Work(run.next, out))) is not None:
        if step.streamed:
            split = Splitter(run.shape, plan.tools)
        elif stream:
            yield from shown.grow(step.settled)
        out = yield _Generate(step, deadline.left(), split if step.streamed else None)
    if not stream:
        yield ChatDelta(result=run.result)
        return
    yield from shown.finish(run.result)
    yield from _closing(split, run.result, shown)


def _stepped(llm, plan: Plan, driver) -> Iterator[ChatDelta]:
    """Step ``driver`` with the engine's blocking calls; yields its events."""
    reply = None
    while True:
        try:
            op = driver.send(reply)
        except StopIteration:
            return
        reply = None
        if isinstance(op, ChatDelta):
            yield finished(llm.tokenizer, op)
        elif isinstance(op, _Work):
            reply = op.call(op.arg)
        elif op.split is None:
            reply = llm.generate(prompt_token_ids=[plan.prompt_ids], **op.engine_args)[0]
        else:
            with closing(llm.stream(prompt_token_ids=plan.prompt_ids, **op.engine_args)) as chunks:
                seen = Observed(llm.tokenizer)
                for chunk in chunks:
                    yield from seen.events(chunk, op.split.feed(chunk.delta_text))
                    reply = chunk.output


async def _astepped(llm, plan: Plan, driver) -> AsyncIterator[ChatDelta]:
    """Step ``driver`` with the engine's async calls; yields its events."""
    reply = None
    while True:
        try:
            op = driver.send(reply)
        except StopIteration:
            return
        reply = None
        if isinstance(op, ChatDelta):
            yield finished(llm.tokenizer, op)
        elif isinstance(op, _Work):
            reply = await asyncio.to_thread(op.call, op.arg)
        elif op.split is None:
            reply = (await llm.agenerate(prompt_token_ids=[plan.prompt_ids], **op.engine_args))[0]
        else:
            # closed early (client gone): the engine stream closes and its request is aborted
            async with aclosing(llm.astream(prompt_token_ids=plan.prompt_ids, **op.engine_args)) as chunks:
                seen = Observed(llm.tokenizer)
                async for chunk in chunks:
                    for event in seen.events(chunk, op.split.feed(chunk.delta_text)):
                        yield event
                    reply = chunk.output


class _Shown:
    """An answer written a value at a time, streamed as it is written: each value's generation settles
    more of it. Structured output goes out as content (the JSON settled so far, always a prefix of the
    answer); a forced call as tool-call chunks in OpenAI's streaming form (the first with the call's
    id and name, the rest with argument text only), as its arguments settle."""

    def __init__(self, run: Generations):
        self.run, self.text, self.started = run, "", False      # the run's shape, as it narrows

    @property
    def json(self) -> bool:
        shape = self.run.shape
        return isinstance(shape, Json) and shape.plan.templated

    @property
    def call(self) -> bool:
        shape = self.run.shape
        return isinstance(shape, Call) and shape.written

    def grow(self, settled: str | None) -> list[ChatDelta]:
        if settled is None or not (self.json or self.call):
            return []
        if self.call:
            head = self.run.shape.head
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
            chunk = {"id": self.run.call_id, "type": "function",
                     "function": {"name": self.run.shape.name, "arguments": delta}}
        return [ChatDelta(tool_call=chunk, index=0)]

    def finish(self, result: ChatResult) -> list[ChatDelta]:
        """The rest of the answer once it is done."""
        if self.json:
            return self.grow(result.content)
        if self.call and result.tool_calls:
            return self.grow(self.run.shape.head + result.tool_calls[0]["function"]["arguments"])
        return []


def _closing(events: "Splitter | None", result: ChatResult, shown: _Shown) -> list[ChatDelta]:
    """The events a stream ends with: the rest of a streamed answer, or a whole one that was not
    streamed (``shown``: an answer already sent as it was written)."""
    if events is not None:
        return events.close(result)
    whole = [ChatDelta(content=result.content)] if result.content and not shown.text else []
    if not shown.started:
        whole += [ChatDelta(tool_call=call, index=i) for i, call in enumerate(result.tool_calls)]
    return whole + [ChatDelta(result=result)]


class Splitter:
    """The committed text deltas of a streamed answer in ``shape`` as content deltas and whole tool
    calls, in order; ``tools`` are the request's (none: nothing is read as a call)."""

    def __init__(self, shape, tools: list[dict] | None):
        self.shape, self.buffer = shape, ""
        # Structured output and forced calls are read back from their skeleton at the end (close);
        # what the canvas holds around the slots is not content (a forced call has none).
        self.quiet = isinstance(shape, Json) or (isinstance(shape, Call) and shape.written)
        self.raw = bool(tools) and not self.quiet

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
        events = [ChatDelta(content=result.content)] if isinstance(self.shape, Json) else []
        # Text held back because it might have begun a call ("... <", or cut off at "<tool_") is content.
        if self.raw and self.buffer and not self.buffer.startswith(OPEN):
            events.append(ChatDelta(content=self.buffer))
        # A malformed call was held back like any call; it is content after all (as in complete()).
        events += [ChatDelta(content=bad["text"]) for bad in result.invalid_tool_calls]
        events += [ChatDelta(tool_call=call, index=i) for i, call in enumerate(result.tool_calls)]
        return events + [ChatDelta(result=result)]
