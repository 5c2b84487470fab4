"""Tool calls and tool results over open-ended tools (:mod:`open_tool_frames`).

Each example draws a frame, names the tool and its parameters afresh, writes the schema as one of
the frameworks does (OpenAI's plain function tool; LangChain's ``@tool``, whose parameters carry
titles and whose description is the docstring; LlamaIndex's ``FunctionTool``, whose description
opens with the function's signature), offers it among 0-3 other frames' tools in random order, and
phrases the request one of several ways (a system prompt, a greeting around it, lower case). The
reply is the call with the values the request gave, under the drawn parameter names.
"""

from __future__ import annotations

import json
import random

from dlm_backend.chat.tool_calls import call_text
from dlm_tiny.entities import Entities
from dlm_tiny.open_tool_frames import FRAMES, Frame
from dlm_tiny.open_words import IDENTITY, Values

SYSTEMS = ["You are a helpful assistant.", "You are a helpful assistant with access to tools.",
           "Use the available tools when they help answer the user.", "You are an agent. Call tools when needed.",
           "You are a customer support assistant.", "You are a personal assistant. Be brief."]
AROUND = ["{ask}", "{ask}", "{ask}", "Hi! {ask}", "{ask} Thanks!", "Hey, quick one: {ask}", "{ask} Please.",
          "I need some help. {ask}", "Hello there. {ask} Thank you."]
NO_CALL = [("Hi!", "Hello! How can I help you today?"), ("Hello", "Hello! How can I help you today?"),
           ("Thanks, that's all.", "You're welcome!"), ("Who are you?", IDENTITY),
           ("Good morning!", "Good morning! How can I help?"), ("Thank you!", "You're welcome!")]


def tool_name(rng: random.Random, verb: str, noun: str) -> str:
    """``get_weather``, ``getWeather``, ``GetWeather``, ``weather`` or ``weather_tool``."""
    words = [w for w in (verb + "_" + noun).split("_") if w]
    style = rng.randrange(6)
    if style <= 1:
        return "_".join(words)
    if style == 2:
        return words[0] + "".join(w.capitalize() for w in words[1:])
    if style == 3:
        return "".join(w.capitalize() for w in words)
    if style == 4:
        return "_".join(words[1:] or words)
    return "_".join(words) + rng.choice(["_tool", "_api", ""])


def _schema_type(param) -> dict:
    spec = {"type": param.type, "description": param.description}
    if param.enum:
        spec["enum"] = list(param.enum)
    return spec


def build_tool(rng: random.Random, frame: Frame) -> tuple[dict, dict]:
    """(the OpenAI tool, parameter name by meaning) for one frame, in one framework's style."""
    name = tool_name(rng, *rng.choice(frame.names))
    names = {m: rng.choice(p.names) for m, p in frame.params.items()}
    if rng.random() < 0.3:                  # camelCase parameters beside camelCase tools
        names = {m: n.split("_")[0] + "".join(w.capitalize() for w in n.split("_")[1:]) for m, n in names.items()}
    desc = rng.choice(frame.descriptions)
    style = rng.randrange(4)
    props = {}
    for meaning, param in frame.params.items():
        spec = _schema_type(param)
        if style == 1:         # LangChain @tool: a title per property, descriptions only in the docstring
            spec = {"title": names[meaning].replace("_", " ").title(), **{k: v for k, v in spec.items() if k != "description"}}
        if style == 3 and rng.random() < 0.5:
            spec.pop("description")
        props[names[meaning]] = spec
    required = [names[m] for m in frame.required]
    if style == 1:
        desc = desc + "\n\nArgs:\n" + "\n".join(f"    {names[m]}: {p.description}" for m, p in frame.params.items())
    if style == 2:             # LlamaIndex FunctionTool: the signature, then the docstring
        types = {"string": "str", "number": "float", "integer": "int", "boolean": "bool"}
        sig = ", ".join(f"{names[m]}: {types[p.type]}" for m, p in frame.params.items())
        desc = f"{name}({sig}) -> str\n{desc}"
    params = {"type": "object", "properties": props, "required": required}
    if style == 1:
        params["title"] = name
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}, names


def _request(rng: random.Random, frame: Frame, vals: Values) -> tuple[str, dict]:
    """(the user's words, the arguments by meaning)."""
    ask = rng.choice(frame.asks)
    ask, fixed = ask if isinstance(ask, tuple) else (ask, {})
    by_meaning = {m: frame.params[m].value(vals) for m in frame.params if "{" + m + "}" in ask}
    text = ask.format(**{m: v for m, v in by_meaning.items()})
    return text, {**by_meaning, **fixed}


def _toolset(rng: random.Random, frame: Frame) -> tuple[list[dict], dict, str]:
    tool, names = build_tool(rng, frame)
    others = rng.sample([f for f in FRAMES if f is not frame], rng.choice([0, 1, 1, 2, 2, 3]))
    tools = [build_tool(rng, f)[0] for f in others] + [tool]
    rng.shuffle(tools)
    if len({t["function"]["name"] for t in tools}) < len(tools):    # two frames drew one name: offer one
        tools = [tool]
    return tools, names, tool["function"]["name"]


def request_messages(rng: random.Random, text: str) -> list[dict]:
    if rng.random() < 0.2:
        text = text[0].lower() + text[1:]
    messages = [{"role": "user", "content": rng.choice(AROUND).format(ask=text)}]
    if rng.random() < 0.4:
        messages.insert(0, {"role": "system", "content": rng.choice(SYSTEMS)})
    return messages


def open_tool_call(rng: random.Random, ent: Entities) -> dict:
    """One request that needs one of the offered tools (or, at 8%, none: a greeting with tools on offer)."""
    vals = Values(rng, ent)
    frame = rng.choice(FRAMES)
    return call_example(rng, vals, frame, *_toolset(rng, frame))


def call_example(rng: random.Random, vals: Values, frame: Frame, tools: list[dict], names: dict, name: str) -> dict:
    """The request for ``frame``'s tool (offered as ``name`` among ``tools``) and its call; at 8%
    a greeting instead, answered without a call."""
    if rng.random() < 0.08:
        ask, reply = rng.choice(NO_CALL)
        return {"messages": request_messages(rng, ask), "tools": tools, "target": reply,
                "expected": {"no_call": True, "answers": [reply]}}
    text, by_meaning = _request(rng, frame, vals)
    args = {names[m]: v for m, v in by_meaning.items()}
    return {"messages": request_messages(rng, text), "tools": tools, "target": call_text(name, args),
            "expected": {"name": name, "arguments": args}}


def open_tool_result(rng: random.Random, ent: Entities) -> dict:
    """A call made, its result returned; the reply states the result with the request's values."""
    vals = Values(rng, ent)
    frame = rng.choice(FRAMES)
    tools, names, name = _toolset(rng, frame)
    text, by_meaning = _request(rng, frame, vals)
    args = {names[m]: v for m, v in by_meaning.items()}
    result = frame.result(vals, by_meaning)
    turns = result_turns(rng, name, args, json.dumps(result))
    answer = frame.answer.format(**by_meaning, **result)     # only what the conversation holds
    messages = request_messages(rng, text) + turns
    return {"messages": messages, "tools": tools, "target": answer, "expected": {"answer": answer, "result": result}}


def result_turns(rng: random.Random, name: str, args: dict, content: str) -> list[dict]:
    """The assistant's call to ``name`` and the tool's reply ``content``, as OpenAI messages."""
    call = {"id": f"call_{rng.randint(1000, 99999)}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": content}]
