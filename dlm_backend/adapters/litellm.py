"""LiteLLM custom provider: ``import dlm_backend.adapters.litellm`` registers ``dlm/<model>`` strings.

Install with ``pip install "dlm_backend[litellm]"``. ``dlm/default`` (or ``dlm/dlm-tiny``) is the
embedded model; ``dlm/<folder or hub id>`` any other. Diffusion knobs (``steps``, ``block_length``,
``sampler``, ``threshold``, ``kv_cache``, ...) pass as extra keyword arguments; a misspelled one is
an error naming the nearest. The first call for a model loads it; ``provider.close()`` gives the
engines back (a later call loads again). For the LiteLLM proxy::

    litellm_settings:
      custom_provider_map:
        - {"provider": "dlm", "custom_handler": dlm_backend.adapters.litellm.provider}
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import litellm
from litellm.llms.custom_llm import CustomLLM
from litellm.types.utils import Choices, GenericStreamingChunk, Message, ModelResponse, Usage

from dlm_backend import chat
from dlm_backend.adapters.common import Handles
from dlm_backend.engine.loader import EMBEDDED_MODEL, context_length, default_model
from dlm_backend.engine.params import FRAMEWORK_TAKEN

PROVIDER = "dlm"
#: ``dlm/default`` is ``$DLM_MODEL`` (else dlm-tiny); ``dlm/dlm-tiny`` is always the embedded model.
ALIASES = {"default": None, "dlm-tiny": str(EMBEDDED_MODEL)}


def _model_path(model: str) -> str | None:
    name = model.split("/", 1)[1] if model.startswith(PROVIDER + "/") else model
    return ALIASES.get(name, name)


#: What LiteLLM puts in ``optional_params`` besides knobs: the OpenAI chat fields it maps through.
CALL_ARGS = ("tools", "tool_choice", "response_format", "stream", "stream_options", "user", "parallel_tool_calls",
             "max_retries", "metadata")


def _request(handles: Handles, model: str, messages: list, optional_params: dict) -> tuple:
    params = dict(optional_params)
    params.update(params.pop("extra_body", None) or {})
    chat.refuse_unsupported(params)
    call = {k: params.pop(k) for k in (*CALL_ARGS, *chat.UNSUPPORTED) if k in params}
    llm = handles.get(_model_path(model))
    sampling = chat.request_params(llm, params, taken=FRAMEWORK_TAKEN, where="litellm.completion")
    request = chat.ChatRequest(messages, sampling, tools=call.get("tools"), tool_choice=call.get("tool_choice"),
                               response_format=call.get("response_format"))
    return llm, request


def _fill(model_response: ModelResponse, result: chat.ChatResult, model: str) -> ModelResponse:
    message = Message(content=result.content or None if result.tool_calls else result.content,
                      tool_calls=result.tool_calls or None, role="assistant")
    model_response.choices = [Choices(message=message, finish_reason=result.finish_reason, index=0)]
    model_response.model = model
    model_response.created = int(time.time())
    u = result.usage
    model_response.usage = Usage(prompt_tokens=u["prompt_tokens"], completion_tokens=u["completion_tokens"],
                                 total_tokens=u["total_tokens"])
    return model_response


def _chunk(delta: chat.ChatDelta) -> GenericStreamingChunk:
    chunk: GenericStreamingChunk = {"text": delta.content, "is_finished": False, "finish_reason": "",
                                    "usage": None, "index": 0, "tool_use": None}
    if delta.tool_call is not None:
        chunk["tool_use"] = {"id": delta.tool_call["id"], "type": "function", "index": delta.index,
                             "function": dict(delta.tool_call["function"])}
    if delta.result is not None:
        u = delta.result.usage
        chunk.update(is_finished=True, finish_reason=delta.result.finish_reason,
                     usage={"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
                            "total_tokens": u["total_tokens"]})
    return chunk


class DLMProvider(CustomLLM):
    """The handler LiteLLM calls for ``dlm/...`` model strings; it holds a handle on each model's
    engine from its first call until :meth:`close`."""

    def __init__(self) -> None:
        super().__init__()
        self._handles = Handles()

    def close(self) -> None:
        """Give every engine handle back (the last handle on an engine frees its weights); the next
        call for a model loads it again."""
        self._handles.close()

    def completion(self, model: str, messages: list, api_base: str | None = None, custom_prompt_dict=None,
                   model_response: ModelResponse | None = None, print_verbose=None, encoding=None,
                   api_key=None, logging_obj=None, optional_params: dict | None = None, **kwargs: Any) -> ModelResponse:
        llm, request = _request(self._handles, model, messages, optional_params or {})
        return _fill(model_response or ModelResponse(), chat.complete(llm, request), model)

    async def acompletion(self, model: str, messages: list, api_base: str | None = None, custom_prompt_dict=None,
                          model_response: ModelResponse | None = None, print_verbose=None, encoding=None,
                          api_key=None, logging_obj=None, optional_params: dict | None = None,
                          **kwargs: Any) -> ModelResponse:
        # Off the event loop: the first request for a model loads its weights.
        llm, request = await asyncio.to_thread(_request, self._handles, model, messages, optional_params or {})
        return _fill(model_response or ModelResponse(), await chat.acomplete(llm, request), model)

    def streaming(self, model: str, messages: list, api_base: str | None = None, custom_prompt_dict=None,
                  model_response: ModelResponse | None = None, print_verbose=None, encoding=None, api_key=None,
                  logging_obj=None, optional_params: dict | None = None, **kwargs: Any) -> Iterator[GenericStreamingChunk]:
        llm, request = _request(self._handles, model, messages, optional_params or {})
        for delta in chat.stream(llm, request):
            yield _chunk(delta)

    async def astreaming(self, model: str, messages: list, api_base: str | None = None, custom_prompt_dict=None,
                         model_response: ModelResponse | None = None, print_verbose=None, encoding=None,
                         api_key=None, logging_obj=None, optional_params: dict | None = None,
                         **kwargs: Any) -> AsyncIterator[GenericStreamingChunk]:
        llm, request = await asyncio.to_thread(_request, self._handles, model, messages, optional_params or {})
        async for delta in chat.astream(llm, request):
            yield _chunk(delta)


provider = DLMProvider()


def register() -> None:
    """Route ``dlm/...`` to this provider and declare the embedded model's capabilities (idempotent)."""
    entries = litellm.custom_provider_map or []
    if not any(e.get("provider") == PROVIDER for e in entries):
        litellm.custom_provider_map = [*entries, {"provider": PROVIDER, "custom_handler": provider}]
    capabilities = {"litellm_provider": PROVIDER, "mode": "chat", "supports_function_calling": True,
                    "supports_tool_choice": True, "supports_response_schema": True,
                    "input_cost_per_token": 0.0, "output_cost_per_token": 0.0}
    models = {}
    for alias, path in ALIASES.items():
        folder = Path(path or default_model())
        # the window from config.json (dlm-tiny: 2048); a hub id's is unknown until it is fetched
        n = context_length(str(folder)) if folder.is_dir() else None
        window = {"max_input_tokens": n, "max_output_tokens": n} if n else {}
        models[f"{PROVIDER}/{alias}"] = {**capabilities, **window}
    litellm.register_model(models)


register()
__all__ = ["DLMProvider", "provider", "register", "EMBEDDED_MODEL"]
