"""A chat request in the engine's terms: prompt ids, a response template, and how to read the answer."""

from __future__ import annotations

import dataclasses
import json
import uuid

from dlm_backend.chat.messages import ChatRequest, ChatResult, normalize_messages
from dlm_backend.engine.outputs import GenerationOutput
from dlm_backend.engine.params import SamplingParams
from dlm_backend.structured import JsonPlan, nearest, plan_json, plan_tool_call, validates
from dlm_backend.tool_calls import (CLOSE, NAME_HEAD, NAME_SLOTS, OPEN, fallback_messages, normalize_tools,
                                    parse_tool_calls, tool_choice_name)

#: Generate-and-validate for JSON that cannot be templated: this many extra samples, at this
#: temperature unless the request set one, before the answer is returned with ``parsed=None``.
JSON_RESAMPLES = 2
RESAMPLE_TEMPERATURE = 0.7


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
        self.template, self.forced, self.deferred_json = None, None, None
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
            plan = plan_json(llm.tokenizer, request.response_format, request.params.max_tokens)
            if tools:     # OpenAI's rule: call a tool or answer in the schema; a free pass decides (free_pass)
                self.deferred_json = plan
            else:
                self.json_plan, self.template = plan, plan.template

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
    def prepass_params(self) -> SamplingParams | None:
        """The pass the answer waits for, if any. A name pass (``choosing``) is a short canvas: the
        call head and room for a tool name, one token a step. A free pass (tools and a schema) is the
        request's own."""
        if self.choosing:
            n = len(self.template) + NAME_SLOTS
            return self.request.params.replace(max_tokens=n, block_length=n, steps=None)
        return self.request.params if self.deferred_json is not None else None

    def free_pass(self, output: GenerationOutput) -> ChatResult | None:
        """Tools and a schema: the free pass's result when it called a tool; else None, and the
        answer comes from the schema's skeleton (a tool-less reply was never constrained)."""
        result = self.finish(output)
        if result.tool_calls:
            return result
        self.spent.append(output)
        self.json_plan, self.template, self.deferred_json = self.deferred_json, self.deferred_json.template, None
        return None

    def pick_tool(self, text: str) -> None:
        """Force the tool whose name is nearest to what the name pass wrote."""
        written = text[len(NAME_HEAD):].split('"')[0] if text.startswith(NAME_HEAD) else text
        self.force(nearest([t["function"]["name"] for t in self.tools], written.strip()))

    @property
    def free_call(self) -> bool:
        """A forced call whose parameters have no skeleton (arrays, nested objects): only its head is fixed."""
        return self.forced is not None and self.call_plan is None

    @property
    def attempts(self) -> list[SamplingParams]:
        """The request's own params, then (generate-and-validate) fresh seeded samples for JSON or a
        forced call that missed its schema: greedy decoding would only repeat the miss."""
        params = self.request.params
        if self.json_plan is None and not self.free_call:
            return [params]
        seed = params.seed or 0
        return [params] + [params.replace(temperature=params.temperature or RESAMPLE_TEMPERATURE, seed=seed + i)
                           for i in range(1, JSON_RESAMPLES + 1)]

    def retry(self, result: ChatResult) -> bool:
        """Whether the answer missed its JSON schema (or did not parse), or a forced call without a
        skeleton is missing or breaks its tool's parameters, and another sample may help."""
        if self.free_call:
            params = next(t["function"]["parameters"] for t in self.tools if t["function"]["name"] == self.forced)
            calls = result.tool_calls
            return not (calls and calls[0]["function"]["name"] == self.forced
                        and validates(params, json.loads(calls[0]["function"]["arguments"])))
        return self.json_plan is not None and result.parsed is None

    def finish(self, output: GenerationOutput) -> ChatResult:
        text = output.text or ""
        if self.json_plan is not None:
            parsed, content = self.json_plan.parse(self.llm.tokenizer, output.token_ids, text)
            return ChatResult(content, [], output.finish_reason, output, parsed, earlier=list(self.spent))
        if self.call_plan is not None:       # the skeleton holds the call; read the argument slots
            args = self.call_plan.slot_values(self.llm.tokenizer, output.token_ids) if self.call_plan.slots else {}
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
