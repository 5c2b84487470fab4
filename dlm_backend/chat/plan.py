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

:meth:`Plan.generations` starts one run of the plan (:class:`Generations`): it hands out each
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
from typing import Generator

from dlm_backend.chat.json_writer import JsonWriter, Written
from dlm_backend.chat.messages import ChatRequest, ChatResult
from dlm_backend.chat.prompt import encode_around, prompt_ids, prompt_limit
from dlm_backend.chat.schema import Budget, validates
from dlm_backend.chat.structured import JsonPlan, check_fits, nearest, plan_json, templatable
from dlm_backend.chat.tool_calls import (CLOSE, NAME_HEAD, NAME_SLOTS, OPEN, normalize_tools, parse_tool_calls,
                                         tool_choice_name)
from dlm_backend.engine.outputs import GenerationOutput
from dlm_backend.engine.params import SamplingParams

#: Generate-and-validate for JSON that cannot be templated: this many extra samples, at this
#: temperature unless the request set one, before the answer is returned with ``parsed=None``.
JSON_RESAMPLES = 2
RESAMPLE_TEMPERATURE = 0.7


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

    def generations(self, stream: bool = False) -> "Generations":
        """A new run of this plan. With ``stream`` the answer's generation is marked ``streamed`` and
        runs once (one stream, one answer)."""
        return Generations(self, stream)

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


class Generations:
    """One run of a plan: ``next(output)`` hands over the previous generation's output and returns the
    next :class:`Generation` to run, or None once ``result`` holds the answer. ``shape`` is the
    answer's shape as this run has narrowed it; ``call_id`` the id of its forced call (its streamed
    argument chunks and the final call share it)."""

    def __init__(self, plan: Plan, stream: bool):
        self.plan, self.shape, self.result = plan, plan.shape, None
        self.call_id = f"call_{uuid.uuid4().hex[:24]}"
        self._steps = self._run(stream)

    def next(self, output: GenerationOutput | None) -> Generation | None:
        """The generation to run after the one that gave ``output`` (None at the start), or None
        once the answer is in ``result``."""
        try:
            return self._steps.send(output)
        except StopIteration as stop:
            self.result = stop.value
            return None

    def _run(self, stream: bool) -> Generator[Generation, GenerationOutput, ChatResult]:
        plan, spent = self.plan, []
        if isinstance(self.shape, PickTool):
            n = len(self.shape.template) + NAME_SLOTS      # the call head and room for a name, a token a step
            out = yield Generation(plan.params.replace(max_tokens=n, block_length=n, steps=None), self.shape.template)
            spent.append(out)
            written = out.text[len(NAME_HEAD):].split('"')[0] if out.text.startswith(NAME_HEAD) else out.text
            self.shape = plan.forced_call(nearest([t["function"]["name"] for t in plan.tools], written.strip()))
        elif isinstance(self.shape, ToolsOrJson):
            out = yield Generation(plan.params, None)
            result = plan.finish(out, Free(), spent)
            if result.tool_calls:
                return result
            spent.append(out)
            self.shape = Json(self.shape.plan)
        for params in self._attempts(stream):
            writer = self._writer()
            if writer is not None:
                out = yield from self._write(writer, params, spent)
                result = self._written(writer, out, spent)
            else:
                out = yield Generation(params, self.shape.template, streamed=stream)
                result = plan.finish(out, self.shape, spent)
            if not self._missed(result):
                break
            if out is not None:                         # an answer written without a generation spent none
                spent.append(out)
        return result

    def _writer(self) -> JsonWriter | None:
        """The writer of an answer written key by key, None for one that is generated."""
        shape, tokenizer, n = self.shape, self.plan.tokenizer, self.plan.params.max_tokens
        if isinstance(shape, Json) and shape.plan.templated:
            return JsonWriter(tokenizer, shape.plan.schema, n)
        if isinstance(shape, Call) and shape.written:
            schema = shape.parameters if shape.parameters.get("properties") else {"properties": {}}
            return JsonWriter(tokenizer, schema, n, shape.head, shape.tail)
        return None

    def _write(self, writer: JsonWriter, params: SamplingParams, spent: list):
        """Run a writer's generations: each value's ends at the value's closing delimiter (a stop
        string past the answer so far); returns the last one's output (None if it needed none)."""
        steps, got, out = writer.steps(), None, None
        while True:
            try:
                step = steps.send(got)
            except StopIteration:
                return out
            if out is not None:
                spent.append(out)
            n = len(step.template) + step.room
            value_params = params.replace(max_tokens=n, stop=step.stop, stop_token_ids=[], ignore_eos=False,
                                          steps=min(params.steps, n) if params.steps else None)
            out = yield Generation(value_params, step.template, settled=writer.settled)
            fixed = len(self.plan.tokenizer.decode(step.template))
            got = Written((out.text or "")[fixed:], out.stop_reason if isinstance(out.stop_reason, str) else None,
                          out.finish_reason == "length")
            # Billed as what it is: the answer so far was read (prompt), the value written (completion).
            out = dataclasses.replace(out, prompt_token_ids=out.prompt_token_ids + out.token_ids[:len(step.template)],
                                      token_ids=out.token_ids[len(step.template):])

    def _attempts(self, stream: bool) -> list[SamplingParams]:
        """The request's own params, then (generate-and-validate) fresh seeded samples for JSON that
        misses its schema or a forced call whose arguments miss its parameters: greedy decoding would
        only repeat a miss. A streamed answer is not sampled again (its text went out)."""
        params = self.plan.params
        if stream:
            return [params]
        seed = params.seed or 0
        return [params] + [params.replace(temperature=params.temperature or RESAMPLE_TEMPERATURE, seed=seed + i)
                           for i in range(1, JSON_RESAMPLES + 1)]

    def _missed(self, result: ChatResult) -> bool:
        """Whether the answer missed its schema (JSON that does not parse or validate, a forced call
        that is missing or breaks its tool's parameters)."""
        shape = self.shape
        if isinstance(shape, Call):
            calls = result.tool_calls
            return not (calls and calls[0]["function"]["name"] == shape.name
                        and validates(shape.parameters, json.loads(calls[0]["function"]["arguments"])))
        return isinstance(shape, Json) and result.parsed is None

    def _written(self, writer: JsonWriter, output: GenerationOutput | None, spent: list) -> ChatResult:
        """The answer a writer wrote: the JSON object, or the forced call with those arguments."""
        # The answer's text is what the writer settled (the generations' outputs hold its pieces).
        output = dataclasses.replace(output or _no_generation(self.plan.prompt_ids), text=writer.settled)
        if isinstance(self.shape, Call):
            call = {"id": self.call_id, "type": "function",
                    "function": {"name": self.shape.name, "arguments": writer.text}}
            # A call cut by the budget is still sent (its JSON is closed), flagged as OpenAI does.
            return ChatResult("", [call], "length" if writer.cut else "tool_calls", output,
                              earlier=list(spent))
        parsed = writer.value if self.shape.plan.matches(writer.value) else None
        return ChatResult(writer.text, [], "length" if writer.cut else "stop", output, parsed, earlier=list(spent))


def _no_generation(prompt_ids: list[int]) -> GenerationOutput:
    """The output of an answer written without a generation (a call with no arguments, constants only)."""
    return GenerationOutput("written", list(prompt_ids), [], "", "stop", 0)
