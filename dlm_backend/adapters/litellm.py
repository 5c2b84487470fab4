"""LiteLLM custom provider: ``import dlm_backend.adapters.litellm`` registers ``dlm/<model>`` strings.

Install with ``pip install "dlm_backend[litellm]"``. ``dlm/default`` (or ``dlm/dlm-tiny``) is the
embedded model; ``dlm/<folder or hub id>`` any other. Diffusion knobs (``steps``, ``block_length``,
``sampler``, ``threshold``, ``kv_cache``, ...) pass as extra keyword arguments; a misspelled one is
an error naming the nearest. ``quantization`` (``"int8"``, ``"int4"``, ``"fp8"``) is a model option,
not a knob: given to ``completion`` or in a Router's or the proxy's ``litellm_params`` (LiteLLM hands
both over as ``optional_params``), it picks an engine whose weights were quantized as they loaded,
one per model and method. The first call for a model loads it; ``provider.close()`` gives the
engines back (a later call loads again).

Errors are LiteLLM's own exceptions, as its built-in providers raise them: a refused request is a
``litellm.BadRequestError`` whose ``param`` names the field (an OpenAI field not served here, such
as ``n=2`` or ``logprobs``, its ``UnsupportedParamsError``), so a Router does not retry it (nor fall
back, with ``fallback_on_unsupported_params=False``) and the proxy answers 400, unless LiteLLM was
told to drop them (``litellm.drop_params = True`` or ``drop_params=True`` on the call), which drops
them as for a built-in provider; an unknown model
path is ``litellm.NotFoundError``, a prompt over the window ``litellm.ContextWindowExceededError``,
and a request past its ``timeout`` is aborted and raises ``litellm.Timeout``. ``litellm.token_counter``
counts with the model's tokenizer given ``custom_tokenizer=tokenizer("dlm/...")`` (LiteLLM adds
OpenAI's per-message framing); :func:`token_counter` counts the prompt exactly as the engine sends
it, chat template included. For the LiteLLM proxy::

    litellm_settings:
      custom_provider_map:
        - {"provider": "dlm", "custom_handler": dlm_backend.adapters.litellm.provider}
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import litellm
from litellm.llms.custom_llm import CustomLLM
from litellm.types.utils import Choices, GenericStreamingChunk, Message, ModelResponse, Usage

from dlm_backend import chat
from dlm_backend.adapters.common import Handles, model_tokenizer, off_loop
from dlm_backend.engine.checkpoint.files import MAX_TOKENIZER_BYTES, read_checkpoint_file
from dlm_backend.engine.checkpoint.folder import (EMBEDDED_MODEL, context_length, default_model, is_gguf,
                                                  resolve_checkpoint)
from dlm_backend.engine.checkpoint.load import checkpoint_tokenizer
from dlm_backend.engine.params import FRAMEWORK_TAKEN
from dlm_backend.engine.quant.methods import check_quantization
from dlm_backend.errors import (CheckpointError, ContextLengthError, DLMError, EngineError, ModelNotFoundError,
                                PluginError, QueueFullError, RequestTimeoutError, UnknownArchitectureError)

PROVIDER = "dlm"
#: ``dlm/default`` is ``$DLM_MODEL`` (else dlm-tiny); ``dlm/dlm-tiny`` is always the embedded model.
ALIASES = {"default": None, "dlm-tiny": str(EMBEDDED_MODEL)}


def model_path(model: str) -> str | None:
    """The checkpoint a ``dlm/...`` model string names (None: ``$DLM_MODEL``, else dlm-tiny)."""
    name = model.split("/", 1)[1] if model.startswith(PROVIDER + "/") else model
    return ALIASES.get(name, name)


#: What LiteLLM puts in ``optional_params`` besides knobs: the OpenAI chat fields it maps through.
CALL_ARGS = ("tools", "tool_choice", "response_format", "stream", "stream_options", "user", "parallel_tool_calls",
             "max_retries", "metadata")


def _request(handles: Handles, model: str, messages: list, optional_params: dict, drop: bool = False) -> chat.Plan:
    """The call planned (async callers run this off the loop: a first call loads the weights).
    ``drop`` (LiteLLM's ``drop_params``) drops the OpenAI fields this provider does not serve, as
    LiteLLM drops them for its built-in providers; without it they are refused by name."""
    params = dict(optional_params)
    params.update(params.pop("extra_body", None) or {})
    if drop:
        params = {k: v for k, v in params.items() if k not in chat.UNSUPPORTED}
    chat.refuse_unsupported(params)
    logprobs = chat.logprobs_knob(params.pop("logprobs", None), params.pop("top_logprobs", None))
    if logprobs is not None:
        params["top_logprobs"] = logprobs         # the knob's name here (LiteLLM owns "logprobs")
    call = {k: params.pop(k) for k in (*CALL_ARGS, *chat.UNSUPPORTED) if k in params}
    quantization = params.pop("quantization", None)       # the engine's, not the request's: never a knob
    try:
        check_quantization(quantization)
    except DLMError as exc:                                # a 400 naming the field, before anything loads
        raise DLMError(str(exc), param="quantization") from None
    llm = handles.get(model_path(model), quantization=quantization)
    sampling = chat.request_params(llm, params, taken=FRAMEWORK_TAKEN, where="litellm.completion")
    return chat.Plan(llm, chat.ChatRequest.from_call(messages, sampling, call))


def _drop_params(kwargs: dict) -> bool:
    """Whether LiteLLM was asked to drop unsupported parameters: ``litellm.drop_params``, or
    ``drop_params=True`` on the call (LiteLLM hands it over in ``litellm_params``)."""
    return bool(litellm.drop_params or (kwargs.get("litellm_params") or {}).get("drop_params"))


def _deadline(timeout) -> chat.Deadline:
    """LiteLLM's ``timeout``: seconds, or an ``httpx.Timeout`` whose read timeout bounds the answer."""
    seconds = getattr(timeout, "read", timeout)
    return chat.Deadline(None if seconds is None else float(seconds))


def _litellm_error(exc: DLMError, model: str) -> Exception:
    """``exc`` as the LiteLLM exception its built-in providers raise for OpenAI's answer to the same
    request, ``param`` included: LiteLLM passes its own types through, where any other exception
    became an APIConnectionError (a 500 the Router retried and fell back on)."""
    message = str(exc)
    body = {"message": message, "type": "invalid_request_error", "param": exc.param, "code": None}
    if type(exc) is DLMError and exc.param in chat.UNSUPPORTED:     # n=2, logprobs, ...: as for any provider
        error = litellm.UnsupportedParamsError(message, llm_provider=PROVIDER, model=model)
        error.param, error.type, error.code, error.body = exc.param, body["type"], None, body
        return error
    if isinstance(exc, RequestTimeoutError):
        return litellm.Timeout(message, model=model, llm_provider=PROVIDER)
    if isinstance(exc, ModelNotFoundError):
        return litellm.NotFoundError(message, model, PROVIDER, body={**body, "code": "model_not_found"})
    if isinstance(exc, ContextLengthError):
        return litellm.ContextWindowExceededError(message, model, PROVIDER,
                                                  body={**body, "code": "context_length_exceeded"})
    if isinstance(exc, QueueFullError):
        return litellm.RateLimitError(message, PROVIDER, model)
    if isinstance(exc, EngineError):
        return litellm.InternalServerError(message, PROVIDER, model)
    if isinstance(exc, (CheckpointError, UnknownArchitectureError, PluginError)):   # the deployment, not the request
        return litellm.ServiceUnavailableError(message, PROVIDER, model)
    return litellm.BadRequestError(message, model, PROVIDER, body=body)


@contextlib.contextmanager
def _errors(model: str):
    try:
        yield
    except DLMError as exc:
        raise _litellm_error(exc, model) from exc


def _fill(model_response: ModelResponse, result: chat.ChatResult, model: str) -> ModelResponse:
    message = Message(content=result.content or None if result.tool_calls else result.content,
                      tool_calls=result.tool_calls or None, role="assistant")
    logprobs = None if result.logprobs is None else {"content": result.logprobs}     # as OpenAI's choices carry them
    model_response.choices = [Choices(message=message, finish_reason=result.finish_reason, index=0, logprobs=logprobs)]
    model_response.model = model
    model_response.created = int(time.time())
    model_response.usage = Usage(**result.usage)
    return model_response


def _chunk(delta: chat.ChatDelta) -> GenericStreamingChunk:
    chunk: GenericStreamingChunk = {"text": delta.content, "is_finished": False, "finish_reason": "",
                                    "usage": None, "index": 0, "tool_use": None}
    if delta.tool_call is not None:
        chunk["tool_use"] = {"id": delta.tool_call.get("id"), "type": "function", "index": delta.index,
                             "function": {"name": None, **delta.tool_call["function"]}}
    if delta.result is not None:
        chunk.update(is_finished=True, finish_reason=delta.result.finish_reason, usage=delta.result.usage)
    return chunk


class DLMProvider(CustomLLM):
    """The handler LiteLLM calls for ``dlm/...`` model strings; it holds a handle on each model's
    engine from its first call until :meth:`close`."""

    def __init__(self) -> None:
        super().__init__()
        #: the engine handles this provider holds, one per model it has served
        self.handles = Handles()

    def close(self) -> None:
        """Give every engine handle back (the last handle on an engine frees its weights); the next
        call for a model loads it again."""
        self.handles.close()

    def completion(self, model: str, messages: list, api_base: str | None = None, custom_prompt_dict=None,
                   model_response: ModelResponse | None = None, print_verbose=None, encoding=None,
                   api_key=None, logging_obj=None, optional_params: dict | None = None, **kwargs: Any) -> ModelResponse:
        deadline = _deadline(kwargs.get("timeout"))
        with _errors(model):
            plan = _request(self.handles, model, messages, optional_params or {}, _drop_params(kwargs))
            result = chat.complete(plan.llm, plan.request, plan, timeout=deadline)
        return _fill(model_response or ModelResponse(), result, model)

    async def acompletion(self, model: str, messages: list, api_base: str | None = None, custom_prompt_dict=None,
                          model_response: ModelResponse | None = None, print_verbose=None, encoding=None,
                          api_key=None, logging_obj=None, optional_params: dict | None = None,
                          **kwargs: Any) -> ModelResponse:
        deadline = _deadline(kwargs.get("timeout"))
        with _errors(model):
            plan = await off_loop(deadline, _request, self.handles, model, messages,
                                    optional_params or {}, _drop_params(kwargs))
            result = await chat.acomplete(plan.llm, plan.request, plan, timeout=deadline)
        return _fill(model_response or ModelResponse(), result, model)

    def streaming(self, model: str, messages: list, api_base: str | None = None, custom_prompt_dict=None,
                  model_response: ModelResponse | None = None, print_verbose=None, encoding=None, api_key=None,
                  logging_obj=None, optional_params: dict | None = None, **kwargs: Any) -> Iterator[GenericStreamingChunk]:
        deadline = _deadline(kwargs.get("timeout"))
        with _errors(model):
            plan = _request(self.handles, model, messages, optional_params or {}, _drop_params(kwargs))
            for delta in chat.stream(plan.llm, plan.request, plan, timeout=deadline):
                yield _chunk(delta)

    async def astreaming(self, model: str, messages: list, api_base: str | None = None, custom_prompt_dict=None,
                         model_response: ModelResponse | None = None, print_verbose=None, encoding=None,
                         api_key=None, logging_obj=None, optional_params: dict | None = None,
                         **kwargs: Any) -> AsyncIterator[GenericStreamingChunk]:
        deadline = _deadline(kwargs.get("timeout"))
        with _errors(model):
            plan = await off_loop(deadline, _request, self.handles, model, messages,
                                    optional_params or {}, _drop_params(kwargs))
            async for delta in chat.astream(plan.llm, plan.request, plan, timeout=deadline):
                yield _chunk(delta)


provider = DLMProvider()


def register() -> None:
    """Route ``dlm/...`` to this provider and declare the embedded model's capabilities (idempotent)."""
    entries = litellm.custom_provider_map or []
    if not any(e.get("provider") == PROVIDER for e in entries):
        litellm.custom_provider_map = [*entries, {"provider": PROVIDER, "custom_handler": provider}]
    # Every cost is stated (a local model costs nothing): a custom price without the cache prices
    # made LiteLLM warn about each entry on import.
    capabilities = {"litellm_provider": PROVIDER, "mode": "chat", "supports_function_calling": True,
                    "supports_tool_choice": True, "supports_response_schema": True,
                    "input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
                    "cache_creation_input_token_cost": 0.0, "cache_read_input_token_cost": 0.0}
    models = {}
    for alias, path in ALIASES.items():
        folder = Path(path or default_model())
        # the window from config.json (dlm-tiny: 2048); a hub id's is unknown until it is fetched
        n = context_length(str(folder)) if folder.is_dir() else None
        window = {"max_input_tokens": n, "max_output_tokens": n} if n else {}
        models[f"{PROVIDER}/{alias}"] = {**capabilities, **window}
    litellm.register_model(models)
    # LiteLLM loads its tiktoken encoding on a custom provider's first call (an argument it hands
    # every handler), holding the GIL for 50-70 ms: an event-loop stall on the first acompletion.
    # Loaded here, at import, that first call stalls the loop for under 10 ms.
    litellm.encoding  # noqa: B018


def tokenizer(model: str = "dlm/default") -> dict:
    """The model's tokenizer for ``litellm.token_counter(model=..., custom_tokenizer=tokenizer(model),
    messages=...)``, LiteLLM's hook for a model's own tokenizer (without it LiteLLM counts with
    tiktoken). LiteLLM adds OpenAI's per-message framing; :func:`token_counter` is exact."""
    path = resolve_checkpoint(model_path(model) or default_model(), patterns=["tokenizer*"])
    if is_gguf(path):                   # the vocabulary lives in the file's metadata
        tok = checkpoint_tokenizer(path)
        data = None if tok is None else tok.to_json().encode()
    else:
        data = read_checkpoint_file(path, "tokenizer.json", MAX_TOKENIZER_BYTES)   # bounded, inside the folder
    if data is None:
        raise DLMError(f"{model} has no tokenizer, so its tokens cannot be counted.", param="model")
    return litellm.create_tokenizer(data.decode("utf-8"))


def token_counter(model: str = "dlm/default", messages: list | None = None, tools: list | None = None,
                  tool_choice=None) -> int:
    """The prompt tokens ``messages`` (and ``tools``) take for ``model``, chat template included:
    the ``usage.prompt_tokens`` a completion of them reports (only the tokenizer is read)."""
    return chat.count_prompt_tokens(model_tokenizer(model_path(model), provider.handles), messages or [], tools,
                                    tool_choice)


register()
__all__ = ["DLMProvider", "provider", "register", "token_counter", "tokenizer", "EMBEDDED_MODEL"]
