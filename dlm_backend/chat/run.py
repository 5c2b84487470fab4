"""Running a prepared chat request: to the end (complete) or as events (stream), sync and async.

Before the answer, a request may need one pass of its own (:func:`_prepass`): ``tool_choice``
"required" over several tools writes the tool name first; tools together with a response schema
let the model call a tool freely first, and only a reply without a call is answered in the schema.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import AsyncIterator, Iterator

from dlm_backend.chat.messages import ChatDelta, ChatRequest, ChatResult
from dlm_backend.chat.prepared import Prepared
from dlm_backend.engine.outputs import GenerationOutput
from dlm_backend.tool_calls import CLOSE, OPEN


def complete(llm, request: ChatRequest) -> ChatResult:
    """Run one chat request to the end."""
    prep = Prepared(llm, request)
    called = _prepass(prep, _generate(llm, prep, prep.prepass_params) if prep.prepass_params else None)
    if called is not None:
        return called
    for params in prep.attempts:
        result = prep.finish(out := _generate(llm, prep, params))
        if not prep.retry(result):
            break
        prep.spent.append(out)
    return result


async def acomplete(llm, request: ChatRequest, prep: Prepared | None = None) -> ChatResult:
    """``complete`` without blocking the event loop (``prep``: the request already prepared)."""
    prep = prep or Prepared(llm, request)
    called = _prepass(prep, await _agenerate(llm, prep, prep.prepass_params) if prep.prepass_params else None)
    if called is not None:
        return called
    for params in prep.attempts:
        result = prep.finish(out := await _agenerate(llm, prep, params))
        if not prep.retry(result):
            break
        prep.spent.append(out)
    return result


def stream(llm, request: ChatRequest) -> Iterator[ChatDelta]:
    """Content as it is committed, tool calls once complete, then the final result.

    JSON without a skeleton is validated but not sampled again here: one stream, one answer."""
    prep = Prepared(llm, request)
    called = _prepass(prep, _generate(llm, prep, prep.prepass_params) if prep.prepass_params else None)
    if called is not None:
        yield from _whole(called)
        return
    splitter = _Splitter(prep)
    for chunk in llm.stream(prompt_token_ids=prep.prompt_ids, sampling_params=prep.request.params,
                            response_template=prep.template):
        yield from splitter.feed(chunk.delta_text)
        if chunk.finished:
            yield from splitter.close(prep.finish(chunk.output))


async def astream(llm, request: ChatRequest, prep: Prepared | None = None) -> AsyncIterator[ChatDelta]:
    """``stream`` without blocking the event loop (``prep``: the request already prepared)."""
    prep = prep or Prepared(llm, request)
    called = _prepass(prep, await _agenerate(llm, prep, prep.prepass_params) if prep.prepass_params else None)
    if called is not None:
        for event in _whole(called):
            yield event
        return
    splitter = _Splitter(prep)
    stream = llm.astream(prompt_token_ids=prep.prompt_ids, sampling_params=prep.request.params,
                         response_template=prep.template)
    async with aclosing(stream) as chunks:        # closed early (client gone): the request is aborted
        async for chunk in chunks:
            for event in splitter.feed(chunk.delta_text):
                yield event
            if chunk.finished:
                for event in splitter.close(prep.finish(chunk.output)):
                    yield event


def _generate(llm, prep: Prepared, params) -> GenerationOutput:
    return llm.generate(prompt_token_ids=[prep.prompt_ids], sampling_params=params, response_template=prep.template)[0]


async def _agenerate(llm, prep: Prepared, params) -> GenerationOutput:
    return (await llm.agenerate(prompt_token_ids=[prep.prompt_ids], sampling_params=params,
                                response_template=prep.template))[0]


def _prepass(prep: Prepared, output: GenerationOutput | None) -> ChatResult | None:
    """Apply the pass before the answer (None: the request needs none); a result when it is the answer."""
    if output is None:
        return None
    if prep.choosing:
        prep.spent.append(output)
        prep.pick_tool(output.text)
        return None
    return prep.free_pass(output)


def _whole(result: ChatResult) -> list[ChatDelta]:
    """A result already complete, as the events a stream of it ends with."""
    events = [ChatDelta(content=result.content)] if result.content else []
    events += [ChatDelta(tool_call=call, index=i) for i, call in enumerate(result.tool_calls)]
    return events + [ChatDelta(result=result)]


class _Splitter:
    """Turns committed text deltas into content deltas and whole tool calls, in order."""

    def __init__(self, prep: Prepared):
        self.prep, self.buffer, self.sent_calls = prep, "", 0
        # Structured output and forced calls are read back from their skeleton at the end (close);
        # what the canvas holds around the slots is not content (finish() gives a forced call none).
        self.quiet = prep.json_plan is not None or prep.call_plan is not None
        self.raw = prep.tools is not None and not self.quiet

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
        events = [ChatDelta(content=result.content)] if self.prep.json_plan is not None else []
        # Text held back because it might have begun a call ("... <", or cut off at "<tool_") is content.
        if self.raw and self.buffer and not self.buffer.startswith(OPEN):
            events.append(ChatDelta(content=self.buffer))
        # A malformed call was held back like any call; it is content after all (as in complete()).
        events += [ChatDelta(content=bad["text"]) for bad in result.invalid_tool_calls]
        events += [ChatDelta(tool_call=call, index=i) for i, call in enumerate(result.tool_calls)]
        return events + [ChatDelta(result=result)]
