"""Messages <-> prompt helpers shared by every front door: tool-call parsing for Hermes/Qwen output."""

from __future__ import annotations

import json
import re

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[dict], list[str]]:
    """Split model output into (content, tool calls, malformed call texts).

    A call is ``<tool_call>{"name": str, "arguments": {...}}</tool_call>`` (Hermes / Qwen2.5 format);
    ``arguments`` may also be a JSON string. Content is the text outside the tags.
    """
    calls, bad = [], []
    for raw in _TOOL_CALL.findall(text):
        try:
            obj = json.loads(raw)
            args = obj.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args)
            if not isinstance(obj.get("name"), str) or not isinstance(args, dict):
                raise ValueError("name must be a string and arguments an object")
            calls.append({"name": obj["name"], "arguments": args})
        except (ValueError, AttributeError):
            bad.append(raw)
    content = _TOOL_CALL.sub("", text).strip()
    return content, calls, bad
