"""Messages <-> prompt, tool calls and structured output: the one implementation behind every
front door (LangChain, LlamaIndex, LiteLLM, the OpenAI-compatible server).

Front doors translate their framework's call into a :class:`ChatRequest` (OpenAI-style messages,
tools, tool_choice, response_format, sampling parameters) and get back a :class:`ChatResult`, or
:class:`ChatDelta` events while streaming.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator

from dlm_backend.engine.outputs import GenerationOutput
from dlm_backend.engine.params import SamplingParams
from dlm_backend.errors import DLMError
from dlm_backend.structured import JsonPlan, nearest, plan_json, plan_tool_call
from dlm_backend.tool_calls import (CLOSE, NAME_HEAD, NAME_SLOTS, OPEN, fallback_messages, normalize_tools,
                                    parse_tool_calls, tool_choice_name)


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
    for m in messages:
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
            for call in m["tool_calls"] if isinstance(m["tool_calls"], list) else [None]:
                fn = call.get("function", call) if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                    raise DLMError("Each of an assistant message's tool_calls needs "
                                   "{'function': {'name': ..., 'arguments': ...}}; got " f"{call!r:.200}.")
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError as exc:
                        raise DLMError(f"Tool call arguments for {fn.get('name')!r} are not valid JSON: {exc}.") from exc
                calls.append({"id": call.get("id"), "type": "function",
                              "function": {"name": fn["name"], "arguments": args}})
            msg["tool_calls"] = calls
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        if m.get("name"):
            msg["name"] = m["name"]
        out.append(msg)
    return out


#: Generate-and-validate for JSON that cannot be templated: this many extra samples, at this
#: temperature unless the request set one, before the answer is returned with ``parsed=None``.
JSON_RESAMPLES = 2
RESAMPLE_TEMPERATURE = 0.7


@dataclass
class ChatRequest:
    """A chat call as every front door describes it (OpenAI conventions)."""

    messages: list[dict]
    params: SamplingParams | None = None        # None: the checkpoint's defaults (llm.sampling_params())
    tools: list[dict] | None = None
    tool_choice: object = None
    response_format: dict | None = None


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

    @property
    def usage(self) -> dict:
        """Tokens of every generation the answer took (as billed: each attempt reads the prompt)."""
        outs = [*self.earlier, self.output]
        prompt, completion = sum(o.num_prompt_tokens for o in outs), sum(o.num_generated_tokens for o in outs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    @property
    def num_forward_passes(self) -> int:
        return sum(o.num_forward_passes for o in [*self.earlier, self.output])


@dataclass
class ChatDelta:
    """A streamed event: new content text, or one complete tool call; the last has ``result``."""

    content: str = ""
    tool_call: dict | None = None
    index: int = 0
    result: ChatResult | None = None


class Prepared:
    """The engine-level form of a ChatRequest: prompt ids, a response template, how to finish."""

    def __init__(self, llm, request: ChatRequest):
        if request.params is None:
            request = dataclasses.replace(request, params=llm.sampling_params())
        self.llm, self.request = llm, request
        self.spent: list[GenerationOutput] = []      # generations before the answer
        tools = normalize_tools(request.tools)
        forced = tool_choice_name(request.tool_choice, tools)
        if forced == "none":
            tools, forced = None, None
        messages = normalize_messages(request.messages)
        has_tool_turns = any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
        if (tools or has_tool_turns) and not llm.tokenizer.renders_tools:    # e.g. LLaDA: tools and calls as text
            self.prompt_ids = llm.encode_chat(fallback_messages(messages, tools))
        else:
            self.prompt_ids = llm.encode_chat(messages, tools=tools)
        self.tools, self.json_plan, self.call_plan = tools, None, None
        self.template, self.forced = None, None
        # "any" of several tools: a short pass writes the name first (pick_tool), then the call is
        # the chosen tool's skeleton like a named choice.
        self.choosing = forced is True
        if self.choosing:
            self.template = llm.tokenizer.encode(NAME_HEAD)
            for tool in tools:    # whichever the name pass picks must fit: fail now, not after a 200
                self._plan(tool["function"]["name"])
        elif forced:
            self.force(forced)
        elif request.response_format and request.response_format.get("type", "text") != "text":
            self.json_plan: JsonPlan | None = plan_json(llm.tokenizer, request.response_format,
                                                        request.params.max_tokens)
            self.template = self.json_plan.template

    def force(self, name: str) -> None:
        """Make the response a call to tool ``name``: a skeleton when its parameters can be templated."""
        self.forced, self.choosing = name, False
        self.call_plan, self.template = self._plan(name)

    def _plan(self, name: str) -> tuple[JsonPlan | None, list]:
        """The call skeleton for tool ``name`` and its template (DLMError when it does not fit)."""
        head = OPEN + "\n" + '{"name": ' + json.dumps(name) + ', "arguments": '
        params = next(t["function"]["parameters"] for t in self.tools if t["function"]["name"] == name)
        plan = plan_tool_call(self.llm.tokenizer, head, params, "}\n" + CLOSE, self.request.params.max_tokens)
        return plan, plan.template if plan else self.llm.tokenizer.encode(head.rstrip())

    @property
    def name_pass(self) -> SamplingParams:
        """The short canvas of the name pass: the call head and room for a tool name, one token a step."""
        n = len(self.template) + NAME_SLOTS
        return self.request.params.replace(max_tokens=n, block_length=n, steps=None)

    def pick_tool(self, text: str) -> None:
        """Force the tool whose name is nearest to what the name pass wrote."""
        written = text[len(NAME_HEAD):].split('"')[0] if text.startswith(NAME_HEAD) else text
        self.force(nearest([t["function"]["name"] for t in self.tools], written.strip()))

    @property
    def attempts(self) -> list[SamplingParams]:
        """The request's own params, then (generate-and-validate) fresh seeded samples for JSON that
        has no skeleton: greedy decoding would only repeat an answer that failed the schema."""
        params = self.request.params
        if self.json_plan is None or self.json_plan.slots:
            return [params]
        seed = params.seed or 0
        return [params] + [params.replace(temperature=params.temperature or RESAMPLE_TEMPERATURE, seed=seed + i)
                           for i in range(1, JSON_RESAMPLES + 1)]

    def retry(self, result: ChatResult) -> bool:
        """Whether the answer missed its JSON schema (or did not parse) and another sample may help."""
        return self.json_plan is not None and result.parsed is None

    def finish(self, output: GenerationOutput) -> ChatResult:
        text = output.text or ""
        if self.json_plan is not None:
            parsed, content = self.json_plan.parse(self.llm.tokenizer, output.token_ids, text)
            return ChatResult(content, [], output.finish_reason, output, parsed, earlier=list(self.spent))
        if self.call_plan is not None:       # the skeleton holds the call; read the argument slots
            args = self.call_plan.parse(self.llm.tokenizer, output.token_ids, text)[0] if self.call_plan.slots else {}
            content, calls, bad = "", [{"name": self.forced, "arguments": args}], []
        else:
            # A well-formed call to a tool that was not offered stays a call, as vLLM's parsers
            # return it: agents answer it ("not a valid tool, try one of ...") and the model retries.
            content, calls, bad = parse_tool_calls(text) if self.tools else (text, [], [])
        tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                       "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
                      for c in calls]
        reason = "tool_calls" if tool_calls else output.finish_reason
        return ChatResult(content, tool_calls, reason, output, invalid_tool_calls=bad, earlier=list(self.spent))


def complete(llm, request: ChatRequest) -> ChatResult:
    """Run one chat request to the end."""
    prep = Prepared(llm, request)
    _pick(llm, prep)
    for params in prep.attempts:
        out = llm.generate(prompt_token_ids=[prep.prompt_ids], sampling_params=params,
                           response_template=prep.template)[0]
        result = prep.finish(out)
        if not prep.retry(result):
            break
        prep.spent.append(out)
    return result


async def acomplete(llm, request: ChatRequest, prep: Prepared | None = None) -> ChatResult:
    """``complete`` without blocking the event loop (``prep``: the request already prepared)."""
    prep = prep or Prepared(llm, request)
    await _apick(llm, prep)
    for params in prep.attempts:
        out = (await llm.agenerate(prompt_token_ids=[prep.prompt_ids], sampling_params=params,
                                   response_template=prep.template))[0]
        result = prep.finish(out)
        if not prep.retry(result):
            break
        prep.spent.append(out)
    return result


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


def stream(llm, request: ChatRequest) -> Iterator[ChatDelta]:
    """Content as it is committed, tool calls once complete, then the final result.

    JSON without a skeleton is validated but not sampled again here: one stream, one answer."""
    prep = Prepared(llm, request)
    _pick(llm, prep)
    splitter = _Splitter(prep)
    for chunk in llm.stream(prompt_token_ids=prep.prompt_ids, sampling_params=prep.request.params,
                            response_template=prep.template):
        yield from splitter.feed(chunk.delta_text)
        if chunk.finished:
            yield from splitter.close(prep.finish(chunk.output))


async def astream(llm, request: ChatRequest, prep: Prepared | None = None) -> AsyncIterator[ChatDelta]:
    """``stream`` without blocking the event loop (``prep``: the request already prepared)."""
    prep = prep or Prepared(llm, request)
    await _apick(llm, prep)
    splitter = _Splitter(prep)
    async for chunk in llm.astream(prompt_token_ids=prep.prompt_ids, sampling_params=prep.request.params,
                                   response_template=prep.template):
        for event in splitter.feed(chunk.delta_text):
            yield event
        if chunk.finished:
            for event in splitter.close(prep.finish(chunk.output)):
                yield event


def _pick(llm, prep: Prepared) -> None:
    """tool_choice "any" over several tools: the name pass, then the chosen tool's skeleton."""
    if prep.choosing:
        out = llm.generate(prompt_token_ids=[prep.prompt_ids], sampling_params=prep.name_pass,
                           response_template=prep.template)[0]
        prep.spent.append(out)
        prep.pick_tool(out.text)


async def _apick(llm, prep: Prepared) -> None:
    if prep.choosing:
        out = (await llm.agenerate(prompt_token_ids=[prep.prompt_ids], sampling_params=prep.name_pass,
                                   response_template=prep.template))[0]
        prep.spent.append(out)
        prep.pick_tool(out.text)
