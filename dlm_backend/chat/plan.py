"""A chat request in the engine's terms: prompt ids, the answer's shape, and the generations it takes.

The answer has one :class:`Shape` at a time:

* :class:`Free`: the model writes what it wants (tool calls are parsed out of it);
* :class:`Json`: the schema's JSON written key by key, each value by the model (chat/json_writer.py),
  or, when the schema cannot be written that way, a ``{"`` prefix and validation afterwards;
* :class:`Call`: a forced call to one tool, its arguments written the same way when they can be;
* :class:`PickTool`: ``tool_choice`` "required" over several tools: a short name generation (the
  name pass) picks the tool, then the answer is that tool's :class:`Call`;
* :class:`ToolsOrJson`: tools and a schema together (OpenAI's rule): a free generation may call a tool;
  a reply without a call is answered again as :class:`Json`.

:class:`Generations` (chat/generations.py) is one run of the plan: it hands out each
:class:`Generation` the answer needs from the engine, receives its output, and ends with the
:class:`ChatResult`. A run narrows the shape for itself (the tool its name pass picked, JSON after a
reply that called no tool); the plan stays as planned, so it can be run again. chat/run.py runs the
generations for sync and async callers alike.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass

from dlm_backend.chat.messages import ChatRequest, ChatResult
from dlm_backend.chat.prompt import encode_around, prompt_ids, prompt_limit
from dlm_backend.chat.schema import Budget
from dlm_backend.chat.structured import JsonPlan, check_fits, plan_json, templatable
from dlm_backend.chat.tool_calls import CLOSE, NAME_HEAD, OPEN, normalize_tools, parse_tool_calls, tool_choice_name
from dlm_backend.engine.outputs import GenerationOutput
from dlm_backend.engine.params import SamplingParams

@dataclass(frozen=True)
class Free:
    template: None = None


@dataclass(frozen=True)
class Json:
    plan: JsonPlan

    @property
    def template(self):
        return None if self.plan.templated else self.plan.prefix


@dataclass(frozen=True)
class Call:
    name: str
    parameters: dict
    head: str                       # the call up to its arguments
    tail: str
    template: list                  # the head's tokens: a call whose arguments are generated, then validated
    written: bool                   # the arguments are written key by key


@dataclass(frozen=True)
class PickTool:
    template: list                  # the call's head up to the tool name


@dataclass(frozen=True)
class ToolsOrJson:
    plan: JsonPlan
    template: None = None


Shape = Free | Json | Call | PickTool | ToolsOrJson


@dataclass(frozen=True)
class Generation:
    """One generation the answer needs from the engine (one engine request, however many forward
    passes it takes): its parameters, response template, and whether its text is the streamed answer
    (the last generation of a stream). ``settled`` is the answer's text decided before this generation
    when the answer is written a value at a time (streamed as it grows)."""

    params: SamplingParams
    template: list | None
    streamed: bool = False
    settled: str | None = None


class Plan:
    """How one ChatRequest is answered (DLMError at construction for anything that cannot be).
    ``max_prompt_tokens`` is a server's own prompt limit; a prompt over it, or over the context
    less ``max_tokens``, is refused by its length before it is tokenized (chat/prompt.py)."""

    def __init__(self, llm, request: ChatRequest, max_prompt_tokens: int | None = None):
        if request.params is None:
            request = dataclasses.replace(request, params=llm.sampling_params())
        self.llm, self.request, self.tokenizer = llm, request, llm.tokenizer
        budget = Budget()                # the request's schemas together: its tools and response_format
        self.tools = normalize_tools(request.tools, budget)
        forced = tool_choice_name(request.tool_choice, self.tools)
        if forced == "none":
            self.tools, forced = None, None
        limit = prompt_limit(llm, self.params.max_tokens, max_prompt_tokens)
        self.prompt_ids = prompt_ids(self.tokenizer, request.messages, self.tools, limit)   # what counters count
        #: the answer's shape as planned (a run narrows its own copy: :attr:`Generations.shape`)
        self.shape: Shape = self._shape(forced, request, budget)

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def template(self) -> list | None:
        """The response template of the first generation (what a server checks before its 200)."""
        return self.shape.template

    def _shape(self, forced, request: ChatRequest, budget: Budget) -> Shape:
        if forced is True:
            for tool in self.tools:    # whichever the name pass picks must fit: fail now, not after a 200
                self.forced_call(tool["function"]["name"])
            return PickTool(self.tokenizer.encode(NAME_HEAD))
        if forced:
            return self.forced_call(forced)
        fmt = request.response_format
        if fmt and fmt.get("type", "text") != "text":
            plan = plan_json(self.tokenizer, fmt, self.params.max_tokens, budget)
            return ToolsOrJson(plan) if self.tools else Json(plan)
        return Free()

    def forced_call(self, name: str) -> Call:
        """The forced call to tool ``name``: its arguments written key by key when they can be."""
        head = OPEN + "\n" + '{"name": ' + json.dumps(name) + ', "arguments": '
        params = next(t["function"]["parameters"] for t in self.tools if t["function"]["name"] == name)
        tail = "}\n" + CLOSE
        written = not params.get("properties") or templatable(params)
        if written and params.get("properties"):
            check_fits(self.tokenizer, params, self.params.max_tokens, "The forced tool call", head, tail)
        # The tool's name is the client's: a control token's text in it stays text in the answer's head.
        head_ids = encode_around(self.tokenizer, [(OPEN + "\n" + '{"name": ', False), (json.dumps(name), True),
                                                  (', "arguments":', False)])
        return Call(name, params, head, tail, head_ids, written)

    def finish(self, output: GenerationOutput, shape: Shape, spent: list[GenerationOutput]) -> ChatResult:
        """Read one generation's output as the answer in ``shape``."""
        text = output.text or ""
        if isinstance(shape, Json):
            parsed, content = shape.plan.parse(text)
            return ChatResult(content, [], output.finish_reason, output, parsed, earlier=list(spent))
        # A well-formed call to a tool that was not offered stays a call, as vLLM's parsers
        # return it: agents answer it ("not a valid tool, try one of ...") and the model retries.
        content, calls, bad = parse_tool_calls(text) if self.tools else (text, [], [])
        tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                       "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
                      for c in calls]
        reason = "tool_calls" if tool_calls else output.finish_reason
        return ChatResult(content, tool_calls, reason, output, invalid_tool_calls=bad, earlier=list(spent))
