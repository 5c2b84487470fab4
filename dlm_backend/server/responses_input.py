"""A Responses body's ``input`` as chat messages: message items, function calls and their outputs."""

from __future__ import annotations

import json

from dlm_backend.server.responses_stream import ResponsesError


def input_messages(items: str | list[dict]) -> list[dict]:
    """``input`` as chat messages: messages as they are, a ``function_call`` joined to the assistant
    turn before it (or opening one), a ``function_call_output`` as a tool message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not items:
        raise ResponsesError("input is empty: send the text to answer, or a list of input items.", param="input")
    messages, calls = [], {}
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ResponsesError(f"input[{i}] has role {role!r}; use user, system, developer or assistant.",
                                     param=f"input[{i}].role")
            messages.append({"role": role, "content": _content(item.get("content"), f"input[{i}].content")})
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            for key, value in (("name", name), ("call_id", call_id), ("arguments", item.get("arguments"))):
                if not isinstance(value, str):
                    raise ResponsesError(f"input[{i}] (a function_call) needs a string {key!r}.",
                                         param=f"input[{i}].{key}")
            call = {"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": _arguments(item["arguments"], f"input[{i}].arguments")}}
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": ""})
            messages[-1].setdefault("tool_calls", []).append(call)
            calls[call_id] = name
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in calls:
                raise ResponsesError(f"input[{i}] answers call_id {call_id!r}, but no function_call item with that "
                                     "call_id comes before it; send the function_call item (from the response's "
                                     "output) first.",
                                     param=f"input[{i}].call_id")
            messages.append({"role": "tool", "tool_call_id": call_id, "name": calls[call_id],
                             "content": _content(item.get("output"), f"input[{i}].output")})
        else:
            why = ("nothing is stored to refer to; send the item itself" if kind == "item_reference" else
                   "this server reads message, function_call and function_call_output items")
            raise ResponsesError(f"input[{i}] is an item of type {kind!r}: {why}.", param=f"input[{i}].type")
    return messages


def _content(content, where: str) -> str:
    """A message's content (a string or text parts) as text: parts joined by newlines, as the chat layer does."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ResponsesError(f"{where} must be a string or a list of text parts.", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = "refusal" if kind == "refusal" else "text"
        if kind not in ("input_text", "output_text", "refusal"):
            raise ResponsesError(f"{where}[{j}] is a {kind!r} part: this model reads text only; send input_text parts.",
                                 param=f"{where}[{j}].type")
        if not isinstance(part.get(key), str):
            raise ResponsesError(f"{where}[{j}] needs a string {key!r}.", param=f"{where}[{j}].{key}")
        texts.append(part[key])
    return "\n".join(texts)


def _arguments(text: str, where: str) -> dict:
    try:
        args = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        raise ResponsesError(f"{where} is not valid JSON (or is nested too deeply); send the arguments as the response "
                             "gave them.", param=where) from None
    if not isinstance(args, dict):
        raise ResponsesError(f"{where} must be a JSON object.", param=where)
    return args
