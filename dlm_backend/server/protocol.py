"""Request bodies of the OpenAI API subset we serve; unknown fields (diffusion knobs) are kept."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: dict | None = None
    n: int | None = Field(default=1, ge=1, le=1)
    user: str | None = None
    # Not served (adapters.common.refuse_unsupported says why): asking is a 400, not a silent null.
    logprobs: bool | int | None = None
    top_logprobs: int | None = None

    def knobs(self) -> dict[str, Any]:
        """Sampling fields plus any extra body fields (steps, block_length, sampler, ...)."""
        values = self.model_dump(exclude_none=True)
        if "max_completion_tokens" in values:
            values.setdefault("max_tokens", values.pop("max_completion_tokens"))
        return values


class ChatCompletionRequest(_Body):
    messages: list[dict] = Field(min_length=1)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: dict | None = None


class CompletionRequest(_Body):
    # A string, one token-id list, or a batch of either (the server takes one prompt a request).
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = None
