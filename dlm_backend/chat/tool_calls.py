"""Tool calls in the Hermes / Qwen2.5 format: tool schemas in, ``<tool_call>`` blocks out."""

from __future__ import annotations

import json
import re

from dlm_backend.chat.schema import Budget, check_schemas
from dlm_backend.errors import DLMError

# A call ends at its closing tag, or where the next call opens (one missing its tag must not take
# the next call down with it), or at the end of the text.
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|(?=<tool_call>)|$)", re.DOTALL)
OPEN, CLOSE = "<tool_call>", "</tool_call>"
NAME_HEAD = OPEN + "\n" + '{"name": "'
NAME_SLOTS = 12                 # room for a tool name in the name pass of tool_choice "any"


_NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')
_DECODER = json.JSONDecoder()
# What parallel decoding leaves after a complete call when two passes both wrote its closing
# braces (dlm-tiny at threshold 0.95 / entropy_bounded: '{"city": "Lisbon"}}"}}').
_CLOSERS = set('"}] \n')


def _read_call(raw: str, repair: bool) -> dict:
    try:
        obj = json.loads(raw)
    except ValueError:
        if not repair:
            raise
        obj, end = _DECODER.raw_decode(raw)
        if not set(raw[end:]) <= _CLOSERS:
            raise
    if not isinstance(obj, dict):
        raise ValueError("a call is a JSON object")
    args = obj.get("arguments", {})
    if isinstance(args, str):
        args = json.loads(args)
    if not isinstance(obj.get("name"), str) or not isinstance(args, dict):
        raise ValueError("name must be a string and arguments an object")
    return {"name": obj["name"], "arguments": args}


def parse_tool_calls(text: str, repair: bool = True) -> tuple[str, list[dict], list[dict]]:
    """Split model output into (content, tool calls, malformed calls).

    A call is ``<tool_call>{"name": str, "arguments": {...}}</tool_call>`` (Hermes / Qwen2.5 format);
    ``arguments`` may also be a JSON string. With ``repair``, a complete call followed only by
    stray closing quotes and braces is read as that call (the evaluation scores without repair).

    Content is the text outside the well-formed calls: a malformed call stays in it verbatim, as
    vLLM's Hermes parser does, so a client that has no channel for invalid calls still sees what
    the model wrote. Each malformed call is also returned as ``{"name", "arguments", "error",
    "text"}`` (``name`` None when unreadable, ``arguments`` the raw JSON text, ``text`` the whole
    tagged block) for frameworks that have a channel for them (LangChain's ``invalid_tool_calls``).
    """
    calls, bad = [], []

    def take(match: re.Match) -> str:
        raw = match.group(1)
        try:
            calls.append(_read_call(raw, repair))
            return ""
        except (ValueError, AttributeError) as exc:
            name = _NAME.search(raw)
            bad.append({"name": name.group(1) if name else None, "arguments": raw,
                        "error": f"malformed tool call: {exc}", "text": match.group(0)})
            return match.group(0)

    content = _TOOL_CALL.sub(take, text).strip()
    return content, calls, bad


def normalize_tools(tools: list[dict] | None, budget: Budget | None = None) -> list[dict] | None:
    """Tools in OpenAI function format, validated so a malformed schema fails with a clear message.
    ``budget`` bounds the request's schemas together: 20 tools of 1,600 properties each were 18 s of
    schema checks before it."""
    if not tools:
        return None
    out = []
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise DLMError(f"Malformed tool {tool!r}: expected {{'type': 'function', 'function': "
                           "{'name': ..., 'description': ..., 'parameters': {JSON schema}}}.")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise DLMError(f"Tool {fn['name']!r}: 'parameters' must be a JSON schema of type object.", param="tools")
        out.append({"type": "function", "function": {"name": fn["name"], "description": fn.get("description", ""),
                                                      "parameters": params}})
    check_schemas([(t["function"]["parameters"], f"tools[{i}].function.parameters") for i, t in enumerate(out)], budget)
    return out


def tool_choice_name(tool_choice, tools: list[dict] | None) -> str | None | bool:
    """None/"auto": the model decides; "none": no tools; "any"/"required"/True: a call is forced
    (returns True); a name or {"function": {"name"}}: that tool is forced (returns the name)."""
    if tool_choice in (None, "auto", False):
        return None
    if tool_choice == "none":
        return "none"
    names = [t["function"]["name"] for t in tools or []]
    if tool_choice in ("any", "required", True):
        if not names:
            raise DLMError("tool_choice requires a tool call but no tools were given; pass tools.")
        return names[0] if len(names) == 1 else True
    name = tool_choice.get("function") if isinstance(tool_choice, dict) else tool_choice
    if isinstance(name, dict):
        name = name.get("name")
    if not isinstance(name, str):
        raise DLMError(f"tool_choice {tool_choice!r} names no tool: give \"auto\", \"none\", \"required\", a tool "
                       'name, or {"type": "function", "function": {"name": "<tool>"}}.')
    if name not in names:
        raise DLMError(f"tool_choice names {name!r}, which is not among the tools ({', '.join(names)}).")
    return name


TOOL_FALLBACK_PROMPT = (
    "You can call these tools:\n{tools}\nTo call one, reply only with\n<tool_call>\n"
    '{{"name": <tool name>, "arguments": <JSON object>}}\n</tool_call>')


def call_text(name: str, arguments: dict) -> str:
    """One call as the model writes it."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CLOSE}"


def fallback_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Messages for a chat template with no tool support (LLaDA's), with nothing of the tool turns lost.

    The tool listing joins the first system turn (or opens one); earlier assistant calls are
    written out as ``<tool_call>`` text, and tool results become user turns in Qwen's
    ``<tool_response>`` wrapper, since such templates print unknown roles verbatim or drop fields.
    """
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [call_text(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(([m["content"]] if m["content"] else []) + calls)})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools:
        listing = TOOL_FALLBACK_PROMPT.format(tools="\n".join(json.dumps(t["function"]) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{listing}"}
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out

