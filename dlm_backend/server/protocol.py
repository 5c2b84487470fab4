"""Request bodies of the OpenAI API we serve. Every OpenAI field is declared (those we cannot serve
are refused by name, see chat.options.UNSUPPORTED); any other field must be a knob of the knob table,
and anything else is a 400 naming the nearest valid field."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from dlm_backend.chat.options import logprobs_knob
from dlm_backend.engine.params import KNOB_NAMES, knob_values, unknown_field
from dlm_backend.plugins import registered_knobs


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)    # "8" is not an integer, nor "yes" true

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: dict | None = None
    user: str | None = None
    metadata: dict | None = None
    store: bool | None = None
    service_tier: str | None = None
    # Read into the logprobs knob (chat.options.logprobs_knob): a bool with top_logprobs for chat,
    # an integer for the legacy completions API.
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    # Declared so that asking for them is refused by name (chat.options.UNSUPPORTED), not misread.
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None

    #: OpenAI fields that are not sampling knobs (kept out of :meth:`knobs`).
    PLAIN: ClassVar[tuple] = ("model", "stream", "stream_options", "user", "metadata", "store", "service_tier", "n", "logprobs",
              "top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias")

    def knobs(self) -> dict[str, Any]:
        """The sampling knobs of the body: OpenAI's own (max_tokens, temperature, ...) and the extra
        diffusion fields, checked against the knob table (an unknown name is a DLMError)."""
        declared = set(type(self).model_fields)
        extra = dict(self.model_extra or {})
        plugin = registered_knobs()             # a registered sampler's own knobs join the body's fields
        for name in extra:
            if name not in KNOB_NAMES and name not in plugin:
                raise unknown_field(name, sorted(declared | set(KNOB_NAMES) | set(plugin)), "body")
        own = {k: v for k, v in self.model_dump(exclude_none=True, exclude=set(extra)).items()
               if k not in self.PLAIN and k not in self.CALL_FIELDS}
        knobs = knob_values({**own, **extra})
        top = logprobs_knob(self.logprobs, self.top_logprobs, legacy=isinstance(self, CompletionRequest))
        if top is not None:
            knobs["logprobs"] = top
        if self.stream and (self.stream_options or {}).get("include_canvas"):
            knobs["stream_canvas"] = True           # each pass's canvas frame, streamed (server/stream.py)
        return knobs


class ChatCompletionRequest(_Body):
    messages: list[dict] = Field(min_length=1)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: dict | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    functions: list | None = None
    function_call: str | dict | None = None
    modalities: list | None = None
    audio: dict | None = None
    prediction: dict | None = None

    CALL_FIELDS: ClassVar[tuple] = ("messages", "tools", "tool_choice", "response_format", "parallel_tool_calls", "reasoning_effort",
                                    "functions", "function_call", "modalities", "audio", "prediction")


class CompletionRequest(_Body):
    # A string, one token-id list, or a batch of either (the server takes one prompt a request).
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None

    CALL_FIELDS: ClassVar[tuple] = ("prompt", "echo", "best_of", "suffix")
