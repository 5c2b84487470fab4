"""A chat call as every front door describes it (OpenAI conventions), and what comes back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from dlm_backend.engine.outputs import GenerationOutput
from dlm_backend.engine.params import SamplingParams
from dlm_backend.errors import DLMError


def _text(content) -> str:
    """Message content as text: strings pass, OpenAI content-part lists are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", None) and "text" in part:
                if not isinstance(part["text"], str):
                    raise DLMError(f"A text content part's 'text' must be a string, not "
                                   f"{type(part['text']).__name__}: send {{'type': 'text', 'text': '...'}}.")
                parts.append(part["text"])
            else:
                raise DLMError(f"Unsupported message content part {part.get('type') if isinstance(part, dict) else part!r}: "
                               "this model reads text only. Send text content.")
        return "\n".join(parts)
    raise DLMError(f"Message content must be a string or a list of text parts, not {type(content).__name__}.")


def normalize_messages(messages: list[dict]) -> list[dict]:
    """OpenAI-style messages the chat templates can render: text content, tool calls with dict
    arguments, tool results as ``role="tool"``. Roles are kept in the order the caller sent them."""
    if not messages:
        raise DLMError("messages is empty: send at least one message.")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DLMError(f"Each message must be an object with a role and content, got {type(m).__name__}.")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool", "function"):
            raise DLMError(f"Unknown message role {role!r}; use system, user, assistant or tool.")
        msg = {"role": "tool" if role == "function" else role, "content": _text(m.get("content"))}
        if m.get("tool_calls"):
            calls = []
            for j, call in enumerate(m["tool_calls"] if isinstance(m["tool_calls"], list) else [None]):
                fn = call.get("function", call) if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                    raise DLMError("Each of an assistant message's tool_calls needs "
                                   "{'function': {'name': ..., 'arguments': ...}}; got " f"{call!r:.200}.")
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    args = _arguments(args, fn["name"], f"messages[{i}].tool_calls[{j}].function.arguments")
                calls.append({"id": call.get("id"), "type": "function",
                              "function": {"name": fn["name"], "arguments": args}})
            msg["tool_calls"] = calls
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        if m.get("name"):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def _arguments(text: str, name: str, param: str):
    """A tool call's JSON arguments text, parsed; a DLMError naming ``param`` if it is not JSON or is
    nested past what the parser follows (json's recursion limit, about 1000 levels: '[' * 5000 was a
    RecursionError, a 500)."""
    try:
        return json.loads(text) if text.strip() else {}
    except RecursionError:
        raise DLMError(f"Tool call arguments for {name!r} are nested too deeply to parse (the JSON parser stops "
                       "near 1000 levels); send arguments nested less deeply.", param=param) from None
    except ValueError as exc:
        raise DLMError(f"Tool call arguments for {name!r} are not valid JSON: {exc}.", param=param) from exc


#: The fields of a chat call the chat layer reads besides its messages and knobs (OpenAI's names).
CALL_FIELDS = ("tools", "tool_choice", "response_format")


@dataclass
class ChatRequest:
    """A chat call as every front door describes it (OpenAI conventions)."""

    messages: list[dict]
    params: SamplingParams | None = None        # None: the checkpoint's defaults (llm.sampling_params())
    tools: list[dict] | None = None
    tool_choice: object = None
    response_format: dict | None = None

    @classmethod
    def from_call(cls, messages: list[dict], params: SamplingParams | None, call) -> "ChatRequest":
        """The request of one front-door call: its OpenAI-shaped ``messages``, its SamplingParams, and
        ``call``, a mapping holding the call's other fields by OpenAI's names (:data:`CALL_FIELDS`
        are read, the rest is not). Every front door builds its request here."""
        return cls(messages, params, **{name: call.get(name) for name in CALL_FIELDS})


@dataclass
class ChatResult:
    content: str
    tool_calls: list[dict]                  # OpenAI format: {id, type, function: {name, arguments: str}}
    finish_reason: str                      # stop | length | tool_calls | abort
    output: GenerationOutput
    parsed: object = None                   # response_format: the JSON, None when it missed the schema
    # Calls the model wrote but that do not parse: {name (or None), arguments (raw text), error, text}.
    # Their text is also left in ``content`` (see tool_calls.parse_tool_calls).
    invalid_tool_calls: list[dict] = field(default_factory=list)
    # Generations spent before ``output``: a tool_choice "any" name pass, JSON attempts that missed.
    earlier: list[GenerationOutput] = field(default_factory=list)
    # OpenAI's usage, as the run that made the answer counts it (chat/generations.py): the prompt as sent,
    # once however many generations read it, and every token the generations wrote, within the
    # request's max_tokens. Unset, they are ``output``'s own counts.
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: with ``logprobs``: OpenAI ``logprobs.content`` entries of the answer's generation (chat/observed.py)
    logprobs: list[dict] | None = None

    def __post_init__(self):
        if self.prompt_tokens is None:
            self.prompt_tokens = self.output.num_prompt_tokens
        if self.completion_tokens is None:
            self.completion_tokens = self.output.num_generated_tokens

    @property
    def usage(self) -> dict:
        """OpenAI's ``usage`` of the answer: ``prompt_tokens``, ``completion_tokens`` and their total."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    @property
    def num_forward_passes(self) -> int:
        return sum(o.num_forward_passes for o in [*self.earlier, self.output])


@dataclass
class ChatDelta:
    """A streamed event: new content text, or a tool-call chunk in OpenAI's streaming form: a whole
    call, or, for a call streamed as it is written, its first chunk (id, type, name and the first
    argument text) then chunks of argument text only (``{"function": {"arguments": ...}}``), all with
    the call's ``index``. The last event has ``result``."""

    content: str = ""
    tool_call: dict | None = None
    index: int = 0
    result: ChatResult | None = None
    #: with ``stream_canvas``: the canvas frames (chat/observed.py ``canvas_frame``) since the last event
    canvas: list[dict] = field(default_factory=list)
    #: with ``logprobs``: OpenAI ``logprobs.content`` entries of the tokens written since the last event
    logprobs: list[dict] | None = None
