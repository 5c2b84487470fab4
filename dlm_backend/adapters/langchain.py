"""LangChain chat model: ``from dlm_backend.adapters.langchain import ChatDLM``.

Install with ``pip install "dlm_backend[langchain]"``. Construction never loads weights but checks
every argument against the knob table; the engine loads on the first call, is shared by every front
door naming the same model, and ``close()`` gives this model's handle on it back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, convert_to_openai_messages
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, model_validator

from dlm_backend import chat
from dlm_backend.adapters.common import (KNOB_FIELDS, LOGPROBS_DOC, QUANTIZATION_DOC, Handles, check_knob_values,
                                         constructor_args, display_name, knob_fields, logprobs_layer, model_tokenizer,
                                         off_loop, refuse_unserved)
from dlm_backend.adapters.langchain_structured import structured_output
from dlm_backend.engine.checkpoint.folder import context_length, default_model
from dlm_backend.engine.params import DEFAULTS, FRAMEWORK_TAKEN
from dlm_backend.engine.quant.methods import check_quantization
from dlm_backend.errors import DLMError

#: Keyword arguments a LangChain call carries besides knobs (bind_tools, with_structured_output).
CALL_ARGS = ("tools", "tool_choice", "response_format", "parallel_tool_calls", "ls_structured_output_format")


class ChatDLM(create_model("_ChatDLMKnobs", __base__=BaseChatModel, **knob_fields(Field))):
    """A diffusion language model (LLaDA, Dream, dlm-tiny, ...) as a LangChain chat model.

    Supports invoke/stream/batch and their async forms, ``bind_tools`` with ``tool_choice``,
    ``with_structured_output`` (json_schema, function_calling, json_mode) and every diffusion knob
    of the knob table (``steps``, ``block_length``, ``sampler``, ``threshold``, ``kv_cache``, ...)
    as a field or per call. Knobs left ``None`` take the checkpoint's defaults (its
    ``generation_config.json``), else the table's. ``cache`` is LangChain's response cache; the
    diffusion KV cache mode is ``kv_cache``. A misspelled or out-of-range argument is a DLMError
    at construction; ``close()`` gives the engine handle back (the next call takes a new one).
    ``quantization`` quantizes a full-precision checkpoint's weights as they load; models asking
    for different methods hold different engines.
    ``timeout`` (seconds, also per call) aborts a request that runs past it and raises a
    ``TimeoutError`` (RequestTimeoutError); token counts use the model's tokenizer and chat template.
    """

    model_config = ConfigDict(populate_by_name=True, protected_namespaces=())

    model: str | None = Field(default=None, alias="model_name")
    """Checkpoint folder or hub id; default ``$DLM_MODEL`` or the embedded dlm-tiny."""
    device: str | None = None
    quantization: str | None = Field(default=None, description=QUANTIZATION_DOC)
    """How to quantize a full-precision checkpoint's weights as they load (``"int4"``, ...; the field's
    description lists the methods); None keeps the checkpoint's own precision. Models asking for
    different methods hold different engines."""
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    streaming: bool = False
    timeout: float | None = None
    """Seconds a call may take, a first call's weight load included; past it the call raises."""
    max_retries: int = 0
    api_key: str | None = None
    """Accepted for interface compatibility; a local engine needs no key."""
    logprobs: bool | None = Field(default=None, description=LOGPROBS_DOC)
    """As ChatOpenAI's: True returns each token's log-probability (with ``top_logprobs`` alternatives)
    in ``response_metadata["logprobs"]["content"]``, per streamed chunk too."""
    _handles: Handles = PrivateAttr(default_factory=Handles)

    @model_validator(mode="before")
    @classmethod
    def _known_arguments(cls, data: Any) -> Any:
        return constructor_args(cls, data, "ChatDLM")

    @model_validator(mode="after")
    def _knobs_in_range(self) -> "ChatDLM":
        check_knob_values({**self._knobs, "stop": self.stop}, "ChatDLM")
        logprobs_layer({"logprobs": self.logprobs, "top_logprobs": self.top_logprobs}, {})   # OpenAI's pairing
        check_quantization(self.quantization)           # at construction, like a knob, not at the first call
        return self

    def close(self) -> None:
        """Give this model's engine handles back; the last handle on an engine frees its weights."""
        self._handles.close()

    @property
    def _llm_type(self) -> str:
        return "dlm"

    @property
    def model_name(self) -> str:
        """The model as it was named (a folder or hub id), "dlm-tiny" for the embedded one (not its path)."""
        return display_name(self.model)

    @property
    def _knobs(self) -> dict[str, Any]:
        """The knob fields as set on this model (front-door names; None = unset)."""
        return {name: getattr(self, name) for name in KNOB_FIELDS if name != "stop"}

    @property
    def _identifying_params(self) -> dict[str, Any]:
        # LangChain's response cache keys on these (its own "stop" key is the per-call one).
        # Quantized weights answer differently, so a cached full-precision answer is not theirs.
        return {"model": self.model or default_model(), "quantization": self.quantization, **self._knobs,
                "stop_sequences": self.stop}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_model_name"] = display_name(kwargs.get("model") or self.model)
        params["ls_max_tokens"] = kwargs.get("max_tokens", self.max_tokens or DEFAULTS.max_tokens)
        params["ls_temperature"] = kwargs.get("temperature", self.temperature or DEFAULTS.temperature)
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    def _resolve_model_profile(self):
        profile = {"tool_calling": True, "tool_choice": True, "tool_call_streaming": True,
                   "structured_output": True, "text_inputs": True, "text_outputs": True}
        path = self.model or default_model()
        if Path(path).is_dir():                  # a hub id's window is known once it is fetched, not here
            try:
                # prompt and canvas share the window: either may take nearly all of it
                profile["max_input_tokens"] = profile["max_output_tokens"] = context_length(path)
            except (DLMError, KeyError, ValueError):
                pass                          # a broken config.json is reported when the model loads
        return profile

    def get_token_ids(self, text: str) -> list[int]:
        """``text`` in the model's own tokens (its tokenizer alone is read: no weights load)."""
        return model_tokenizer(self.model, self._handles, self.device, self.quantization).encode(text)

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools=None) -> int:
        """The tokens these messages (and tools) take as a prompt, chat template included: what the
        reply's ``usage_metadata["input_tokens"]`` reports for them (trim_messages counts with it)."""
        tokenizer = model_tokenizer(self.model, self._handles, self.device, self.quantization)
        return chat.count_prompt_tokens(tokenizer, convert_to_openai_messages(messages),
                                        [convert_to_openai_tool(t) for t in tools or []] or None)

    # -- request building ---------------------------------------------------------------------

    def _request(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict):
        # The first call loads the weights (seconds for an 8B checkpoint), and planning tokenizes:
        # async callers run this in a worker thread so the event loop keeps serving.
        model = kwargs.pop("model", None) or self.model
        call = {k: kwargs.pop(k) for k in CALL_ARGS if k in kwargs}
        logprobs = logprobs_layer({"logprobs": self.logprobs, "top_logprobs": self.top_logprobs}, kwargs)
        refuse_unserved(kwargs)
        if stop is not None:
            kwargs["stop"] = stop
        llm = self._handles.get(model, self.device, self.quantization)
        params = chat.request_params(llm, {**self._knobs, "stop": self.stop}, kwargs, logprobs, taken=FRAMEWORK_TAKEN,
                                     where="ChatDLM call")
        request = chat.ChatRequest.from_call(convert_to_openai_messages(messages), params, call)
        return llm, chat.Plan(llm, request), display_name(model)

    def _result(self, result: chat.ChatResult, model: str) -> ChatResult:
        # llm_output as ChatOpenAI fills it: callbacks reading LLMResult.llm_output find usage there.
        return ChatResult(generations=[ChatGeneration(message=ai_message(result, model))],
                          llm_output={"token_usage": dict(result.usage), "model_name": model, "model_provider": "dlm"})

    def _combine_llm_outputs(self, llm_outputs: list[dict | None]) -> dict:
        outputs = [o for o in llm_outputs if o]       # a batch's usage is summed, as ChatOpenAI does
        keys = outputs[0]["token_usage"] if outputs else {}
        usage = {k: sum(o["token_usage"].get(k, 0) for o in outputs) for k in keys}
        return {"token_usage": usage, "model_name": self.model_name, "model_provider": "dlm"}

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        deadline = chat.Deadline(kwargs.pop("timeout", self.timeout))
        llm, plan, model = self._request(messages, stop, kwargs)
        return self._result(chat.complete(llm, plan.request, plan, timeout=deadline), model)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        deadline = chat.Deadline(kwargs.pop("timeout", self.timeout))
        llm, plan, model = await off_loop(deadline, self._request, messages, stop, kwargs)
        return self._result(await chat.acomplete(llm, plan.request, plan, timeout=deadline), model)

    def _chunk(self, delta: chat.ChatDelta, model: str) -> ChatGenerationChunk:
        if delta.result is not None:
            msg = AIMessageChunk(content="", usage_metadata=_usage(delta.result), additional_kwargs=_parsed(delta.result),
                                 response_metadata=_metadata(delta.result, model, streamed=True), chunk_position="last")
        elif delta.tool_call is not None:
            fn = delta.tool_call["function"]          # a continuation chunk has argument text only
            msg = AIMessageChunk(content="", tool_call_chunks=[{"name": fn.get("name"), "args": fn["arguments"],
                                                                 "id": delta.tool_call.get("id"), "index": delta.index,
                                                                 "type": "tool_call_chunk"}])
        else:
            # stream_canvas frames ride on a chunk's metadata (LangChain concatenates them over a stream)
            metadata = {"dlm_canvas": delta.canvas} if delta.canvas else {}
            if delta.logprobs is not None:
                metadata["logprobs"] = {"content": delta.logprobs}
            msg = AIMessageChunk(content=delta.content, response_metadata=metadata)
        return ChatGenerationChunk(message=msg)

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        deadline = chat.Deadline(kwargs.pop("timeout", self.timeout))
        llm, plan, model = self._request(messages, stop, kwargs)
        for delta in chat.stream(llm, plan.request, plan, timeout=deadline):
            chunk = self._chunk(delta, model)
            if run_manager and delta.content:
                run_manager.on_llm_new_token(delta.content, chunk=chunk)
            yield chunk

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        deadline = chat.Deadline(kwargs.pop("timeout", self.timeout))
        llm, plan, model = await off_loop(deadline, self._request, messages, stop, kwargs)
        async for delta in chat.astream(llm, plan.request, plan, timeout=deadline):
            chunk = self._chunk(delta, model)
            if run_manager and delta.content:
                await run_manager.on_llm_new_token(delta.content, chunk=chunk)
            yield chunk

    # -- tools and structured output ---------------------------------------------------------

    def bind_tools(self, tools: list[dict | type | Any | BaseTool], *,
                   tool_choice: dict | str | bool | None = None, strict: bool | None = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer ``tools``; ``tool_choice`` is "auto", "any"/"required", "none", a tool name or a dict.

        ``strict`` is taken as ChatOpenAI takes it (each tool's ``function.strict``). Here a forced
        call (``tool_choice`` naming a tool, or "any"/"required") is constrained to its tool's schema
        whatever ``strict`` says: its arguments are written key by key where the schema allows, and
        checked against it (a miss is sampled again, never returned as the call). A call the model
        makes by itself under "auto" is read from its text, not constrained: one that does not parse
        comes back in ``invalid_tool_calls``.
        """
        formatted = [convert_to_openai_tool(t, strict=strict) for t in tools]
        return self.bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    def with_structured_output(self, schema: dict | type | None = None, *,
                               method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
                               include_raw: bool = False, strict: bool | None = None,
                               **kwargs: Any) -> Runnable[LanguageModelInput, dict | BaseModel]:
        """Answers parsed into ``schema``; ``json_schema`` writes the JSON skeleton into the canvas.
        An answer that misses the schema (or a pydantic class's own validators) raises
        ``OutputParserException``; with ``include_raw=True`` it is ``parsing_error``, as ChatOpenAI
        reports it."""
        return structured_output(self, schema, method, include_raw, kwargs)


def ai_message(result: chat.ChatResult, model: str) -> AIMessage:
    """A whole answer as LangChain's AIMessage: tool calls parsed, malformed ones as invalid calls,
    usage and metadata where ChatOpenAI puts them."""
    return AIMessage(
        content=result.content,
        tool_calls=[{"name": c["function"]["name"], "args": _args(c), "id": c["id"], "type": "tool_call"}
                    for c in result.tool_calls],
        # Streamed, a malformed call arrives as content only: as a tool_call_chunk LangChain would
        # re-read its raw text with a partial-JSON parser and might turn it into a valid call.
        invalid_tool_calls=[{"name": b["name"], "args": b["arguments"], "id": None, "error": b["error"],
                             "type": "invalid_tool_call"} for b in result.invalid_tool_calls],
        usage_metadata=_usage(result),
        response_metadata=_metadata(result, model),
        additional_kwargs=_parsed(result))


def _parsed(result: chat.ChatResult) -> dict:
    """A response_format reply's JSON as the engine checked it, where ChatOpenAI puts it."""
    return {} if result.parsed is None else {"parsed": result.parsed}


def _args(call: dict) -> dict:
    return json.loads(call["function"]["arguments"])


def _usage(result: chat.ChatResult) -> UsageMetadata:
    u = result.usage
    return {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
            "total_tokens": u["total_tokens"]}


def _metadata(result: chat.ChatResult, model: str, streamed: bool = False) -> dict:
    """``response_metadata`` as ChatOpenAI fills it (logprobs too, unless they went out with the chunks)."""
    logprobs = {} if result.logprobs is None or streamed else {"logprobs": {"content": result.logprobs}}
    return {"model_name": model, "model_provider": "dlm", "finish_reason": result.finish_reason,
            "num_forward_passes": result.num_forward_passes, **logprobs}
