"""Responses API output: the response object, its output items, and the server-sent events of a
streamed response, in OpenAI's shapes and order (what the openai client's ``Response`` and
``ResponseStreamEvent`` types parse)."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from contextlib import aclosing
from typing import AsyncIterator

from dlm_backend import chat
from dlm_backend.errors import ContextLengthError, DLMError, EngineError
from dlm_backend.server.errors import error_body

log = logging.getLogger("dlm_backend.server")


class ResponsesError(DLMError):
    """A Responses body this server cannot serve as sent (a 400); it already names the Responses field."""


#: Chat names in the chat layer's errors -> the Responses field they stand for.
_RENAMES = [(re.compile(r"\bmessages\b"), "input"), (re.compile(r"\bmax_tokens\b"), "max_output_tokens"),
            (re.compile(r"\bresponse_format\b"), "text.format"), (re.compile(r"(tools\[\d+\])\.function\."), r"\1.")]


def _renamed(text: str | None) -> str | None:
    for pattern, name in _RENAMES if text else ():
        text = pattern.sub(name, text)
    return text


def in_responses_terms(exc: DLMError) -> DLMError:
    """A chat-layer error naming the Responses field (``input``, not ``messages``;
    ``max_output_tokens``, not ``max_tokens``) in its ``param`` and message; ``exc`` itself, changed."""
    if not isinstance(exc, ResponsesError):
        exc.param = _renamed(getattr(exc, "param", None))
        exc.args = (_renamed(str(exc)),)
        if isinstance(exc, ContextLengthError) and exc.param is None:
            exc.param = "input"                 # the prompt is what is too long
    return exc


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def shell(body, plan, model: str) -> dict:
    """The response object before any output: the request's settings as served (the sampling
    parameters in effect, the tools in Responses form), ``status`` "in_progress"."""
    params = plan.params
    tools = [{"type": "function", "name": t["name"], "description": t.get("description"),
              "parameters": t.get("parameters"), "strict": t.get("strict")} for t in body.tools or []]
    fmt = (body.text or {}).get("format") or {"type": "text"}
    if fmt.get("type") == "json_schema":
        fmt = {**fmt, "name": fmt.get("name") or "response"}
    return {"id": _id("resp"), "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "background": False, "error": None, "incomplete_details": None, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "max_tool_calls": None, "model": model, "output": [],
            "parallel_tool_calls": body.parallel_tool_calls is not False, "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,                         # nothing is kept, whatever the request asked
            "temperature": params.temperature, "text": {"format": fmt, "verbosity": "medium"},
            "tool_choice": body.tool_choice or "auto", "tools": tools,
            "top_p": 1.0 if params.top_p is None else params.top_p, "truncation": "disabled", "usage": None,
            "user": body.user, "safety_identifier": body.safety_identifier,
            "prompt_cache_key": body.prompt_cache_key, "metadata": body.metadata or {}}


def _usage(result: chat.ChatResult) -> dict:
    usage = result.usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    # cache_write_tokens: the prefix cache does not count the pages a request adds to it.
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"]}


def _finished(head: dict, result: chat.ChatResult, output: list[dict]) -> dict:
    """The response once ``result`` is in: "incomplete" (reason max_output_tokens) when the answer
    ran out of tokens, else "completed"."""
    cut = result.finish_reason == "length"
    return {**head, "status": "incomplete" if cut else "completed", "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "usage": _usage(result),
            "dlm": {"num_forward_passes": result.num_forward_passes}}


def _message(text: str, status: str, item_id: str | None = None) -> dict:
    return {"id": item_id or _id("msg"), "type": "message", "status": status, "role": "assistant",
            "content": [_part(text)]}


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call(call_id: str, name: str, arguments: str, status: str, item_id: str | None = None) -> dict:
    return {"id": item_id or _id("fc"), "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}


def completed(head: dict, result: chat.ChatResult) -> dict:
    """The whole response to a request that was not streamed: a message with the answer's text (when
    it has text, or calls nothing), then one function_call item per tool call."""
    output = []
    if result.content or not result.tool_calls:
        output.append(_message(result.content, "incomplete" if result.finish_reason == "length" else "completed"))
    output += [_call(c["id"], c["function"]["name"], c["function"]["arguments"], "completed")
               for c in result.tool_calls]
    return _finished(head, result, output)


class _Events:
    """The events of one streamed response, numbered in order, and the output items they built:
    one item is open at a time (a message taking text deltas, or a function call taking argument
    deltas); the next item, or the end, closes it."""

    def __init__(self, head: dict):
        self.head, self.seq, self.output, self.open = head, 0, [], None
        # Whitespace before any text is held back: the model's newline before a tool call is not a
        # message (the whole answer, stripped, has none), and otherwise it begins the message's text.
        self.held = ""

    def event(self, kind: str, **fields) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _where(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.output)}

    def text(self, delta: str, force: bool = False) -> list[str]:
        events = []
        if self.open is None or self.open["type"] != "message":
            delta, self.held = self.held + delta, ""
            if not delta.strip() and not force:
                self.held = delta
                return events
            events += self.close()
            self.open = {**_message("", "in_progress"), "content": []}
            events.append(self.event("response.output_item.added", output_index=len(self.output), item=self.open))
            events.append(self.event("response.content_part.added", **self._where(), content_index=0, part=_part("")))
            self.open["text"] = ""
        if delta:
            self.open["text"] += delta
            events.append(self.event("response.output_text.delta", **self._where(), content_index=0, delta=delta,
                                     logprobs=[]))
        return events

    def call(self, chunk: dict) -> list[str]:
        """A chat tool-call chunk: one with an ``id`` begins a call (a whole call, or the first piece
        of one streamed as it is written), one without continues the open call's arguments."""
        fn = chunk.get("function") or {}
        events = []
        if chunk.get("id") or self.open is None or self.open["type"] != "function_call":
            events += self.close()
            self.open = _call(chunk.get("id") or _id("call"), fn.get("name") or "", "", "in_progress")
            events.append(self.event("response.output_item.added", output_index=len(self.output), item=self.open))
        delta = fn.get("arguments") or ""
        if delta:
            self.open["arguments"] += delta
            events.append(self.event("response.function_call_arguments.delta", **self._where(), delta=delta))
        return events

    def close(self, status: str = "completed") -> list[str]:
        item, events = self.open, []
        if item is None:
            return events
        if item["type"] == "message":
            text = item.pop("text")
            events.append(self.event("response.output_text.done", **self._where(), content_index=0, text=text,
                                     logprobs=[]))
            events.append(self.event("response.content_part.done", **self._where(), content_index=0, part=_part(text)))
            item = _message(text, status, item["id"])
        else:
            events.append(self.event("response.function_call_arguments.done", **self._where(), name=item["name"],
                                     arguments=item["arguments"]))
            item = {**item, "status": "completed"}
        events.append(self.event("response.output_item.done", output_index=len(self.output), item=item))
        self.output.append(item)
        self.open = None
        return events

    def end(self, result: chat.ChatResult) -> list[str]:
        """The last item closed (an answer with no text and no call is one empty message, as when it
        is not streamed), then ``response.completed`` or ``response.incomplete`` with it all."""
        cut = result.finish_reason == "length"
        events = self.text("", force=True) if self.open is None and not self.output else []
        events += self.close("incomplete" if cut else "completed")
        final = _finished(self.head, result, self.output)
        return events + [self.event(f"response.{final['status']}", response=final)]


async def response_events(llm, plan, head: dict) -> AsyncIterator[str]:
    """A streamed response: ``response.created`` and ``response.in_progress``, each output item's
    events as the chat layer's deltas come, then ``response.completed`` (or ``response.incomplete``);
    a failure after the 200 is one ``error`` event, and nothing follows it."""
    events = _Events(head)
    yield events.event("response.created", response=head)
    yield events.event("response.in_progress", response=head)
    try:
        # aclosing: an early close (client gone) reaches the engine stream and aborts its request.
        async with aclosing(chat.astream(llm, plan.request, plan)) as deltas:
            async for delta in deltas:
                if delta.result is not None:
                    out = events.end(delta.result)
                elif delta.tool_call is not None:
                    out = events.call(delta.tool_call)
                else:
                    out = events.text(delta.content) if delta.content else []
                for event in out:
                    yield event
    except Exception as exc:  # noqa: BLE001 - every failure reaches the client as an event
        yield _error(events, exc)


def _error(events: _Events, exc: Exception) -> str:
    """An ``error`` event, as OpenAI sends one mid-stream (the openai client yields it as
    ResponseErrorEvent); its ``code`` is the error's OpenAI code, else its type."""
    if not isinstance(exc, DLMError):
        log.error("stream failed: %s: %s", type(exc).__name__, exc)
        exc = EngineError(f"Internal error ({type(exc).__name__}); the server keeps running.")
    exc = in_responses_terms(exc)
    error = error_body(500 if isinstance(exc, EngineError) else 400, str(exc), exc.param)["error"]
    return events.event("error", code=error["code"] or error["type"], message=error["message"], param=error["param"])
