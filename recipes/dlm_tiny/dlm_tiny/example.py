"""One corpus example: a conversation, the reply to learn, and what the evaluation checks."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Example:
    family: str
    messages: list[dict]
    target: str                       # the assistant reply (tool calls rendered as <tool_call> blocks)
    tools: list[dict] | None = None
    expected: dict = field(default_factory=dict)   # what the evaluation compares against

    def to_json(self) -> dict:
        return {"family": self.family, "messages": self.messages, "tools": self.tools, "target": self.target,
                "expected": self.expected}
