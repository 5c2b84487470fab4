"""FastAPI app: /v1/models, /v1/chat/completions, /v1/completions, /health.

Routes translate OpenAI requests into the shared chat core (:mod:`dlm_backend.chat`) and results
back; they hold no engine logic. Bad input is a 400 with the DLMError's message, never a traceback.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from dlm_backend import chat
from dlm_backend.adapters.common import sampling_params
from dlm_backend.engine.llm import LLM
from dlm_backend.errors import DLMError
from dlm_backend.server.protocol import ChatCompletionRequest, CompletionRequest

DEFAULTS = {"max_tokens": 256, "block_length": 32, "kv_cache": "dual"}


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind}})


def create_app(model: str | None = None, served_name: str | None = None, device: str | None = None) -> FastAPI:
    """The app for one model; it loads on the first request (or at startup with ``warm()``)."""
    app = FastAPI(title="dlm_backend", version="0.1.0")
    name = served_name or (model or "dlm-tiny").rstrip("/").split("/")[-1]
    state: dict = {}

    def llm() -> LLM:
        if "llm" not in state:
            state["llm"] = LLM(model, device=device)
        return state["llm"]

    app.state.llm = llm

    @app.exception_handler(DLMError)
    async def dlm_error(_: Request, exc: DLMError):
        return _error(400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"Invalid request: {where or 'body'}: {first.get('msg', 'malformed')}.")

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception):
        return _error(500, f"Internal error ({type(exc).__name__}); the server keeps running.", "server_error")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "dlm_backend"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        request = chat.ChatRequest(body.messages, sampling_params(DEFAULTS, body.knobs()), tools=body.tools,
                                   tool_choice=body.tool_choice, response_format=body.response_format)
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            chat.Prepared(llm(), request)       # validate before the 200 goes out
            return StreamingResponse(_chat_sse(llm(), request, rid, created, name, include_usage),
                                     media_type="text/event-stream")
        result = await chat.acomplete(llm(), request)
        message = {"role": "assistant", "content": result.content if not result.tool_calls else (result.content or None)}
        if result.tool_calls:
            message["tool_calls"] = result.tool_calls
        return {"id": rid, "object": "chat.completion", "created": created, "model": name,
                "choices": [{"index": 0, "message": message, "finish_reason": result.finish_reason}],
                "usage": result.usage, "dlm": {"num_forward_passes": result.output.num_forward_passes}}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) != 1:
            return _error(400, "Send one prompt per request (batch by sending concurrent requests).")
        params = sampling_params(DEFAULTS, body.knobs())
        rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if body.stream:
            return StreamingResponse(_completion_sse(llm(), prompts[0], params, rid, created, name),
                                     media_type="text/event-stream")
        out = (await llm().agenerate(prompts[0], params))[0]
        return {"id": rid, "object": "text_completion", "created": created, "model": name,
                "choices": [{"index": 0, "text": out.text, "finish_reason": out.finish_reason, "logprobs": None}],
                "usage": out.usage}

    return app


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _chat_sse(llm, request, rid, created, name, include_usage) -> AsyncIterator[str]:
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name}
    yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    try:
        async for delta in chat.astream(llm, request):
            if delta.result is not None:
                yield _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": delta.result.finish_reason}]})
                if include_usage:
                    yield _sse({**base, "choices": [], "usage": delta.result.usage})
            elif delta.tool_call is not None:
                call = {"index": delta.index, **delta.tool_call}
                yield _sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]})
            elif delta.content:
                yield _sse({**base, "choices": [{"index": 0, "delta": {"content": delta.content}, "finish_reason": None}]})
    except DLMError as exc:
        yield _sse({"error": {"message": str(exc), "type": "invalid_request_error"}})
    yield "data: [DONE]\n\n"


async def _completion_sse(llm, prompt, params, rid, created, name) -> AsyncIterator[str]:
    base = {"id": rid, "object": "text_completion", "created": created, "model": name}
    async for chunk in llm.astream(prompt, params):
        finish = chunk.finish_reason if chunk.finished else None
        if chunk.delta_text or finish:
            yield _sse({**base, "choices": [{"index": 0, "text": chunk.delta_text, "finish_reason": finish,
                                             "logprobs": None}]})
    yield "data: [DONE]\n\n"
