"""One run of a :class:`Plan`: the generations its answer takes, within the request's one max_tokens.

:class:`Generations` hands out each :class:`Generation` in turn and reads the answer out of their
outputs. Every generation of a run spends the same budget, as one OpenAI completion would: the name
pass of ``tool_choice`` "required" (the tokens it wrote past the call's head), a free reply of
tools-or-JSON that called no tool, and each answer (a written answer is billed its whole text, keys
and punctuation included, as a constrained decoder's output is). An answer that misses its schema
is sampled again only while what is left holds an answer as long as the one that missed, so
``completion_tokens`` never passes max_tokens and "length" means the budget ran out. The prompt is
billed once: every generation reads the same one.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Generator

from dlm_backend.chat.json_writer import JsonWriter, Written
from dlm_backend.chat.messages import ChatResult
from dlm_backend.chat.plan import Call, Free, Generation, Json, PickTool, Plan, Shape, ToolsOrJson
from dlm_backend.chat.schema import validates
from dlm_backend.chat.structured import nearest
from dlm_backend.chat.tool_calls import NAME_HEAD, NAME_SLOTS
from dlm_backend.engine.outputs import GenerationOutput
from dlm_backend.engine.params import SamplingParams

#: Generate-and-validate for JSON that cannot be templated: this many extra samples, at this
#: temperature unless the request set one, before the answer is returned with ``parsed=None``.
JSON_RESAMPLES = 2
RESAMPLE_TEMPERATURE = 0.7


class Generations:
    """One run of a plan: ``next(output)`` hands over the previous generation's output and returns the
    next :class:`Generation` to run, or None once ``result`` holds the answer. ``shape`` is the
    answer's shape as this run has narrowed it; ``call_id`` the id of its forced call (its streamed
    argument chunks and the final call share it)."""

    def __init__(self, plan: Plan, stream: bool):
        self.plan, self.shape, self.result = plan, plan.shape, None
        self.used = 0                   # completion tokens spent so far, against the one max_tokens
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
            self.used += max(len(out.token_ids) - len(self.shape.template), 0)   # the head is the call's own
            written = out.text[len(NAME_HEAD):].split('"')[0] if out.text.startswith(NAME_HEAD) else out.text
            self.shape = plan.forced_call(nearest([t["function"]["name"] for t in plan.tools], written.strip()))
        elif isinstance(self.shape, ToolsOrJson):
            out = yield Generation(plan.params, None)
            result = plan.finish(out, Free(), spent)
            self.used += len(out.token_ids)
            if result.tool_calls:
                return self._billed(result)
            if not self._fits(Json(self.shape.plan), self.left):
                # No call, and no room left for the JSON answer (at most its two-token head): the
                # budget ran out, and the reply is the answer as it cut it.
                self.used = plan.params.max_tokens
                return self._billed(dataclasses.replace(result, finish_reason="length"))
            spent.append(out)
            self.shape = Json(self.shape.plan)
        result, cost = None, 0
        for params in self._attempts(stream):
            left = self.left
            # Sampled again only with room for an answer as long as the one that missed.
            if result is not None and (left < cost or not self._fits(self.shape, left)):
                break
            if result is not None and out is not None:   # an answer written without a generation spent none
                spent.append(out)
            params = params.replace(max_tokens=left, steps=min(params.steps, left) if params.steps else None)
            writer = self._writer(left)
            if writer is not None:
                out = yield from self._write(writer, params, spent)
                result = self._written(writer, out, spent)
                # A cut answer ran out of the budget (the writer keeps the rest for closing it), as
                # a generation that fills its canvas does; a whole one is billed its text.
                cost = left if writer.cut else min(len(plan.tokenizer.encode(writer.settled)), left)
            else:
                out = yield Generation(params, self.shape.template, streamed=stream)
                result = plan.finish(out, self.shape, spent)
                cost = len(out.token_ids)
            self.used += cost
            if not self._missed(result):
                break
        return self._billed(result)

    @property
    def left(self) -> int:
        """Completion tokens the request's max_tokens still allows this run."""
        return self.plan.params.max_tokens - self.used

    @staticmethod
    def _fits(shape: Shape, left: int) -> bool:
        """Whether an answer in ``shape`` can be started within ``left`` tokens (a written one is cut
        to fit; a generated one needs room past its fixed head)."""
        written = (isinstance(shape, Json) and shape.plan.templated) or (isinstance(shape, Call) and shape.written)
        return left > (0 if written else len(shape.template or []))

    def _billed(self, result: ChatResult) -> ChatResult:
        """``result`` with OpenAI's usage: the prompt as sent (once, however many generations read it)
        and every token this run's generations wrote, within max_tokens."""
        return dataclasses.replace(result, prompt_tokens=len(self.plan.prompt_ids), completion_tokens=self.used)

    def _writer(self, n: int) -> JsonWriter | None:
        """The writer of an answer written key by key within ``n`` tokens, None for one that is generated."""
        shape, tokenizer = self.shape, self.plan.tokenizer
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
