"""OpenAI's Responses API (``POST /v1/responses``) on the same chat core as /v1/chat/completions.

A Responses body is translated into a chat call (:func:`to_chat`: ``instructions`` and ``input`` items
to messages, Responses function tools to chat tools, ``text.format`` to ``response_format``), planned
and run exactly as a chat completion is, and its result or deltas are written back as Responses
output (server/responses_stream.py). Nothing is stored: ``store`` is accepted and never honoured
(every response says ``"store": false``), and what needs a stored response (``previous_response_id``,
``conversation``, ``background``) is refused by name, as is every other field this server cannot serve.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from dlm_backend import chat
from dlm_backend.engine.params import KNOB_NAMES, knob_values, unknown_field
from dlm_backend.errors import DLMError
from dlm_backend.plugins import registered_knobs
from dlm_backend.server.protocol import ChatCompletionRequest
from dlm_backend.server.responses_input import input_messages
from dlm_backend.server.responses_stream import ResponsesError, completed, in_responses_terms, response_events, shell
from dlm_backend.server.stream import streamed, unless_disconnected

#: The knob names of the output budget: a Responses body names it max_output_tokens only, so that
#: two spellings of one budget never disagree.
_BUDGET_NAMES = {name for name, target in KNOB_NAMES.items() if target == "max_tokens"}

#: Chat Completions fields sent to this route by mistake -> their Responses name.
_CHAT_NAMES = {"messages": "input", "response_format": "text.format", "reasoning_effort": "reasoning.effort",
               **{name: "max_output_tokens" for name in _BUDGET_NAMES}}

_STORED = "this server stores no responses; send the whole conversation in input (earlier output items included)"

#: OpenAI Responses fields this server does not serve: field -> (values that ask for nothing, why).
REFUSED: dict[str, tuple[tuple, str]] = {
    "previous_response_id": ((None,), _STORED),
    "conversation": ((None,), _STORED),
    "background": ((None, False), "a background response is polled from storage, and nothing is stored here; "
                                  "stream the request instead"),
    "prompt": ((None,), "stored prompt templates are not served; send the text in instructions and input"),
    "max_tool_calls": ((None,), "the number of tool calls is not capped here; leave it out and check the calls"),
    "top_logprobs": ((None, 0), "token logprobs are served at /v1/chat/completions and /v1/completions, not here"),
    "truncation": ((None, "disabled"), "this server does not drop input items to fit the context (an input over "
                                       "it is a 400 naming the limit); shorten the input and send 'disabled'"),
    "context_management": ((None, []), "server-side compaction is not served; shorten the input yourself"),
    "background_options": ((None,), "background responses are not served"),
    "access_programs": ((None,), "access programs are OpenAI's own"),
    "image": ((None,), "this model reads and writes text only"),
    "moderation": ((None,), "moderation is not run here"),
    "prompt_cache_options": ((None,), "the prefix cache is the server's own (dlm serve --prefix-caching)"),
}

#: ``include`` values that ask for nothing here: there are no reasoning items to carry.
_INCLUDABLE = {"reasoning.encrypted_content"}


class ResponsesRequest(BaseModel):
    """A ``POST /v1/responses`` body. Every OpenAI field is declared (those not served are refused by
    name: :func:`check_served`, :func:`to_chat`); any other field must be a sampling knob of the knob table,
    as in a chat body, and anything else is a 400 naming the nearest valid field."""

    model_config = ConfigDict(extra="allow", strict=True)    # "8" is not an integer, nor "yes" true

    model: str | None = None
    input: str | list[dict]
    instructions: str | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    text: dict | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    stream_options: dict | None = None          # include_obfuscation: nothing is padded here
    parallel_tool_calls: bool | None = None
    metadata: dict | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None         # a routing hint; the prefix cache needs none
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    reasoning: dict | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None             # refused when asked for (REFUSED)
    previous_response_id: str | None = None
    conversation: str | dict | None = None
    background: bool | None = None
    prompt: dict | None = None
    max_tool_calls: int | None = None
    truncation: str | None = None
    context_management: list | dict | None = None
    background_options: Any = None
    access_programs: Any = None
    image: Any = None
    moderation: Any = None
    prompt_cache_options: Any = None

    def knobs(self) -> dict[str, Any]:
        """The sampling knobs: ``max_output_tokens``, ``temperature``, ``top_p`` and the extra
        diffusion fields (an unknown name is a DLMError naming the nearest valid field)."""
        extra = dict(self.model_extra or {})
        plugin = registered_knobs()
        valid = (set(type(self).model_fields) | set(KNOB_NAMES) | set(plugin)) - _BUDGET_NAMES
        for name in extra:
            if name in _CHAT_NAMES:
                raise ResponsesError(f"{name} is a Chat Completions field; the Responses API calls it "
                                     f"{_CHAT_NAMES[name]}: send that instead.", param=name)
            if name not in KNOB_NAMES and name not in plugin:
                raise unknown_field(name, sorted(valid), "body")
        own = {"max_tokens": self.max_output_tokens, "temperature": self.temperature, "top_p": self.top_p}
        return knob_values({**{k: v for k, v in own.items() if v is not None}, **extra})


def _refuse(name: str, why: str, value) -> ResponsesError:
    return ResponsesError(f"{name}={value!r:.80} is not served: {why}. Leave {name} out.", param=name)


def check_served(body: ResponsesRequest) -> None:
    """A DLMError naming the first field that asks for something this server does not do."""
    fields = body.model_dump(exclude_unset=True)
    for name, (neutral, why) in REFUSED.items():
        if name in fields and not any(fields[name] == v and isinstance(fields[name], bool) == isinstance(v, bool)
                                      for v in neutral):
            raise _refuse(name, why, fields[name])
    reasoning = body.reasoning or {}
    if reasoning.get("effort") not in (None, "none"):
        raise _refuse("reasoning.effort", "this model has no reasoning pass to spend effort on", reasoning["effort"])
    for key in ("summary", "generate_summary"):
        if reasoning.get(key) is not None:
            raise _refuse(f"reasoning.{key}", "this model writes no reasoning to summarize", reasoning[key])
    for value in body.include or []:
        if value not in _INCLUDABLE:
            raise _refuse("include", "of the extra outputs only reasoning.encrypted_content is accepted (there "
                                     "is none to include); token logprobs are served at /v1/chat/completions and /v1/completions, and "
                                     "hosted-tool results do not exist here", value)
    text = body.text or {}
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise ResponsesError(f"text.{unknown[0]} is not a field of text; it takes format and verbosity.",
                             param=f"text.{unknown[0]}")
    if text.get("verbosity") not in (None, "medium"):
        raise _refuse("text.verbosity", "the answer's length is set by max_output_tokens", text["verbosity"])


def to_chat(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat call a Responses body asks for (after :func:`check_served`)."""
    tools = [_tool(i, t) for i, t in enumerate(body.tools or [])] or None
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions is not None else [])
    messages += input_messages(body.input)
    return ChatCompletionRequest(messages=messages, tools=tools, tool_choice=_tool_choice(body.tool_choice),
                                 response_format=response_format((body.text or {}).get("format")))


def _tool(i: int, tool) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise ResponsesError(f"tools[{i}] has type {kind!r}: this server serves function tools only (your code runs "
                             "them); hosted tools (web_search, file_search, ...) are OpenAI's. Send "
                             '{"type": "function", "name": ..., "parameters": {...}}.', param=f"tools[{i}].type")
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise ResponsesError(f"tools[{i}] has no name: a function tool needs a 'name'.", param=f"tools[{i}].name")
    fn = {"name": tool["name"], "description": tool.get("description") or ""}
    if tool.get("parameters") is not None:
        fn["parameters"] = tool["parameters"]
    return {"type": "function", "function": fn}


def _tool_choice(choice):
    if choice in (None, "auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        if not isinstance(choice.get("name"), str):
            raise ResponsesError('tool_choice {"type": "function"} needs the tool\'s "name".', param="tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise ResponsesError(f"tool_choice {kind!r} is not served: send \"auto\", \"none\", \"required\" or "
                         '{"type": "function", "name": "<tool>"} (to allow only some tools, send only those).',
                         param="tool_choice")


def response_format(fmt) -> dict | None:
    """``text.format`` as the chat layer's ``response_format`` (None: free text)."""
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise ResponsesError(f"text.format type {kind!r} is not served; send 'text', 'json_object' or 'json_schema'.",
                             param="text.format.type")
    if not isinstance(fmt.get("schema"), dict):
        raise ResponsesError('text.format json_schema needs "schema", a JSON schema object (and a "name").',
                             param="text.format.schema")
    spec = {"name": fmt.get("name") or "response", "schema": fmt["schema"], "strict": fmt.get("strict")}
    return {"type": "json_schema", "json_schema": spec}


@contextlib.contextmanager
def responses_errors():
    """The chat layer's errors in Responses terms: their ``param`` and message name the Responses
    field (``input``, not ``messages``; ``max_output_tokens``, not ``max_tokens``)."""
    try:
        yield
    except DLMError as exc:
        in_responses_terms(exc)
        raise


def install_responses(app: FastAPI, served, knobs_of) -> None:
    """Serve ``POST /v1/responses`` on ``app``: ``served`` is its ServedModel, ``knobs_of`` the app's
    own model check and knob reading (create_app's), so both routes refuse and read a body alike."""
    names = served.cfg.served_names

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, http: Request):
        with responses_errors():
            knobs = await knobs_of(body)
            check_served(body)
            call = to_chat(body)
            with served.reserve() as slot:
                plan = await asyncio.to_thread(served.plan_chat, slot, call, knobs)
                head = shell(body, plan, body.model or names[0])
                if body.stream:
                    return streamed(response_events(served.llm(), plan, head), slot)
                result = await unless_disconnected(http, chat.acomplete(served.llm(), plan.request, plan))
        if result is None:
            return Response(status_code=499)
        return completed(head, result)
