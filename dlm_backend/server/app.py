"""FastAPI app: /v1/models (and /v1/models/{id}), /v1/chat/completions, /v1/completions, /metrics, /health.

Routes translate OpenAI requests into the shared chat core (:mod:`dlm_backend.chat`) and results
back; they hold no engine logic. Bad input is a 4xx with a message saying what to fix, never a
traceback: 400 for invalid requests, 401 for a wrong API key, 413 for oversized bodies, 429 with
Retry-After when the engine's queue is full, 500 when one request fails inside the engine (the others
keep running). A client that disconnects frees its engine slot at the next step.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass
from typing import AsyncIterator

import anyio

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from dlm_backend import chat
from dlm_backend.adapters.common import SERVING_DEFAULTS, refuse_unsupported, sampling_params
from dlm_backend.engine.engine import check_dtype
from dlm_backend.engine.llm import LLM
from dlm_backend.engine.loader import default_model
from dlm_backend.errors import DLMError, EngineError, QueueFullError
from dlm_backend.server.metrics import CONTENT_TYPE, make_registry, metrics_text
from dlm_backend.server.protocol import ChatCompletionRequest, CompletionRequest
from dlm_backend.server.security import APIKeyMiddleware, BodyLimitMiddleware

DISCONNECT_POLL_S = 0.25


@dataclass
class ServerConfig:
    """Limits and security of one server. ``None`` limits fall back to the model's own."""

    model: str | None = None
    served_name: str | None = None
    device: str | None = None
    dtype: str = "auto"                     # auto: bf16 on GPU, fp32 on CPU
    api_key: str | None = None              # required on every route but /health when set
    max_body_bytes: int = 1 << 20           # 1 MiB: a long RAG prompt is ~100 KB
    max_tokens_limit: int = 4096            # largest max_tokens a request may ask for
    max_prompt_tokens: int | None = None    # default: the model's context minus max_tokens
    max_waiting: int = 256                  # queued requests beyond the running ones; then 429
    max_num_seqs: int = 64                  # requests denoised together in one batch


def _error(status: int, message: str, kind: str = "invalid_request_error", headers=None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind}}, headers=headers)


class _Busy(Exception):
    pass


def create_app(model: str | None = None, served_name: str | None = None, device: str | None = None,
               config: ServerConfig | None = None) -> FastAPI:
    """The app for one model; it loads on the first request (or at startup with ``app.state.llm()``)."""
    cfg = config or ServerConfig(model=model, served_name=served_name, device=device)
    check_dtype(cfg.dtype)                 # before serving, even with --lazy
    app = FastAPI(title="dlm_backend", version="0.1.0")
    name = cfg.served_name or (cfg.model or default_model()).rstrip("/").split("/")[-1]
    state: dict = {}

    def llm() -> LLM:
        if "llm" not in state:
            state["llm"] = LLM(cfg.model, device=cfg.device, dtype=cfg.dtype, max_num_seqs=cfg.max_num_seqs,
                               max_waiting=cfg.max_waiting)
        return state["llm"]

    app.state.llm = llm
    app.state.config = cfg
    registry = make_registry(lambda: state["llm"].engine if "llm" in state else None)
    app.add_middleware(BodyLimitMiddleware, max_bytes=cfg.max_body_bytes)
    if cfg.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=cfg.api_key)

    @app.exception_handler(DLMError)
    async def dlm_error(_: Request, exc: DLMError):
        return _error(400, str(exc))

    @app.exception_handler(QueueFullError)
    @app.exception_handler(_Busy)
    async def busy(_: Request, exc: Exception):
        return _error(429, str(exc) or "The server is busy; retry shortly.", "rate_limit_error",
                      headers={"Retry-After": "1"})

    @app.exception_handler(EngineError)
    async def engine_error(_: Request, exc: EngineError):
        return _error(500, f"{exc} Other requests are unaffected; retrying may succeed.", "server_error")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException):
        return _error(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"Invalid request: {where or 'body'}: {first.get('msg', 'malformed')}.")

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception):
        return _error(500, f"Internal error ({type(exc).__name__}); the server keeps running.", "server_error")

    # A request that sends no max_tokens gets the serving default, capped to this server's limit.
    serving = {**SERVING_DEFAULTS, "max_tokens": min(SERVING_DEFAULTS["max_tokens"], cfg.max_tokens_limit)}

    def admit(prompt_ids: list[int], params, template: list | None = None) -> None:
        """Server limits and the engine's own checks, before anything is queued or a 200 goes out
        (a streamed response's errors would otherwise arrive as an event after a 200)."""
        num_prompt_tokens, max_tokens = len(prompt_ids), params.max_tokens
        if max_tokens > cfg.max_tokens_limit:
            raise DLMError(f"max_tokens {max_tokens} is over this server's limit of {cfg.max_tokens_limit}; "
                           "ask for fewer tokens.")
        if cfg.max_prompt_tokens is not None and num_prompt_tokens > cfg.max_prompt_tokens:
            raise DLMError(f"The prompt has {num_prompt_tokens} tokens, over this server's limit of "
                           f"{cfg.max_prompt_tokens}; shorten it (fewer documents or turns).")
        llm().engine.check(prompt_ids, params, template)
        if llm().engine.is_full:
            raise _Busy(f"The server is at capacity ({cfg.max_waiting} requests queued); retry shortly.")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(metrics_text(registry), media_type=CONTENT_TYPE)

    card = {"id": name, "object": "model", "created": 0, "owned_by": "dlm_backend"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id:path}")      # client.models.retrieve; hub ids hold a "/"
    async def model(model_id: str):
        if model_id != name:
            return _error(404, f"Model {model_id!r} is not served here; this server serves {name!r}.",
                          "not_found_error")
        return card


    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: Request):
        refuse_unsupported(body.model_dump())
        await asyncio.to_thread(llm)       # with --lazy the first request loads the model: not on the loop
        request = chat.ChatRequest(body.messages, sampling_params(llm(), {}, body.knobs(), serving), tools=body.tools,
                                   tool_choice=body.tool_choice, response_format=body.response_format)
        prep = chat.Prepared(llm(), request)          # validates before the 200 goes out
        admit(prep.prompt_ids, prep.request.params, prep.template)
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return ClosingStreamingResponse(_chat_sse(llm(), request, prep, rid, created, name, include_usage),
                                            media_type="text/event-stream")
        result = await _unless_disconnected(http, chat.acomplete(llm(), request, prep))
        if result is None:
            return Response(status_code=499)
        message = {"role": "assistant", "content": result.content if not result.tool_calls else (result.content or None)}
        if result.tool_calls:
            message["tool_calls"] = result.tool_calls
        return {"id": rid, "object": "chat.completion", "created": created, "model": name,
                "choices": [{"index": 0, "message": message, "finish_reason": result.finish_reason}],
                "usage": result.usage, "dlm": {"num_forward_passes": result.num_forward_passes}}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        refuse_unsupported(body.model_dump())
        await asyncio.to_thread(llm)
        one = isinstance(body.prompt, str) or (body.prompt and isinstance(body.prompt[0], int))
        prompts = [body.prompt] if one else body.prompt
        if len(prompts) != 1:
            return _error(400, "Send one prompt per request (batch by sending concurrent requests).")
        params = sampling_params(llm(), {}, body.knobs(), serving)
        ids = llm().tokenizer.encode(prompts[0]) if isinstance(prompts[0], str) else prompts[0]
        admit(ids, params)
        rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return ClosingStreamingResponse(_completion_sse(llm(), ids, params, rid, created, name, include_usage),
                                            media_type="text/event-stream")
        outs = await _unless_disconnected(http, llm().agenerate(prompt_token_ids=[ids], sampling_params=params))
        if outs is None:
            return Response(status_code=499)
        out = outs[0]
        return {"id": rid, "object": "text_completion", "created": created, "model": name,
                "choices": [{"index": 0, "text": out.text, "finish_reason": out.finish_reason, "logprobs": None}],
                "usage": out.usage}

    return app


async def _unless_disconnected(http: Request, work):
    """Await ``work``; if the client goes away first, cancel it (freeing its engine slot) and return None."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await http.is_disconnected():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None


class ClosingStreamingResponse(StreamingResponse):
    """A stream that closes its body generator however it ends.

    When the client leaves, Starlette cancels the streaming task but leaves the generator suspended
    for the garbage collector to finalize, so its engine request could run on for nobody until then
    (the load test saw a dropped stream run to the end). Closing it here aborts the request at once.
    """

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):     # the task is being cancelled: still close
                await self.body_iterator.aclose()


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _chat_sse(llm, request, prep, rid, created, name, include_usage) -> AsyncIterator[str]:
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name}
    yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    try:
        # aclosing: an early close (client gone) reaches the engine stream and aborts its request.
        async with aclosing(chat.astream(llm, request, prep)) as deltas:
            async for delta in deltas:
                for event in _chat_events(base, delta, include_usage):
                    yield event
    except DLMError as exc:
        yield _sse_error(exc)
    yield "data: [DONE]\n\n"


def _chat_events(base: dict, delta, include_usage: bool) -> list[str]:
    if delta.result is not None:
        events = [_sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": delta.result.finish_reason}]})]
        return events + ([_sse({**base, "choices": [], "usage": delta.result.usage})] if include_usage else [])
    if delta.tool_call is not None:
        call = {"index": delta.index, **delta.tool_call}
        return [_sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]})]
    if delta.content:
        return [_sse({**base, "choices": [{"index": 0, "delta": {"content": delta.content}, "finish_reason": None}]})]
    return []


async def _completion_sse(llm, ids, params, rid, created, name, include_usage) -> AsyncIterator[str]:
    base = {"id": rid, "object": "text_completion", "created": created, "model": name}
    try:
        async with aclosing(llm.astream(prompt_token_ids=ids, sampling_params=params)) as chunks:
            async for chunk in chunks:
                finish = chunk.finish_reason if chunk.finished else None
                if chunk.delta_text or finish:
                    yield _sse({**base, "choices": [{"index": 0, "text": chunk.delta_text, "finish_reason": finish,
                                                     "logprobs": None}]})
                if chunk.finished and include_usage:
                    yield _sse({**base, "choices": [], "usage": chunk.output.usage})
    except DLMError as exc:
        yield _sse_error(exc)
    yield "data: [DONE]\n\n"


def _sse_error(exc: DLMError) -> str:
    """An error after the 200 went out: OpenAI clients raise on an ``error`` event."""
    kind = "server_error" if isinstance(exc, EngineError) else "invalid_request_error"
    return _sse({"error": {"message": str(exc), "type": kind}})
