"""FastAPI app: /v1/models (and /v1/models/{id}), /v1/chat/completions, /v1/completions, /metrics, /health.

Routes translate OpenAI requests into the shared chat core (:mod:`dlm_backend.chat`) and results
back; they hold no engine logic. Bad input is an OpenAI-shaped 4xx saying what to fix, never a
traceback (server/errors.py): 400 for invalid requests, 401 for a wrong API key, 404 for a model not
served here, 413 for oversized bodies, 429 with Retry-After when the engine's queue is full, 500
when one request fails inside the engine (the others keep running). A client that disconnects frees
its engine slot at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import Response

from dlm_backend import chat
from dlm_backend.engine.config import check_dtype
from dlm_backend.errors import DLMError
from dlm_backend.llm import LLM
from dlm_backend.server.config import ServerConfig
from dlm_backend.server.errors import Busy, error_response, install_handlers
from dlm_backend.server.metrics import CONTENT_TYPE, make_registry, metrics_text
from dlm_backend.server.protocol import ChatCompletionRequest, CompletionRequest
from dlm_backend.server.security import APIKeyMiddleware, BodyLimitMiddleware
from dlm_backend.server.stream import ClosingStreamingResponse, chat_events, completion_events

DISCONNECT_POLL_S = 0.25


def create_app(model: str | None = None, served_name: str | None = None, device: str | None = None,
               config: ServerConfig | None = None) -> FastAPI:
    """The app for one model; it loads on the first request (or at startup with ``app.state.llm()``)."""
    cfg = config or ServerConfig(model=model, served_name=served_name, device=device)
    check_dtype(cfg.dtype)                 # before serving, even with --lazy
    state: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        if "llm" in state:                 # the server's handle on the shared engine goes back
            state.pop("llm").close()

    app = FastAPI(title="dlm_backend", version="0.1.0", lifespan=lifespan)
    names = cfg.served_names

    def llm() -> LLM:
        if "llm" not in state:
            state["llm"] = LLM(cfg.model, device=cfg.device, dtype=cfg.dtype, **vars(cfg.limits))
        return state["llm"]

    app.state.llm = llm
    app.state.config = cfg
    registry = make_registry(lambda: state["llm"].engine if "llm" in state else None)
    app.add_middleware(BodyLimitMiddleware, max_bytes=cfg.max_body_bytes)
    if cfg.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=cfg.api_key)
    install_handlers(app)

    def admit(prompt_ids: list[int], params, template: list | None = None) -> None:
        """Server limits and the engine's own checks, before anything is queued or a 200 goes out
        (a streamed response's errors would otherwise arrive as an event after a 200)."""
        if params.max_tokens > cfg.max_tokens_limit:
            raise DLMError(f"max_tokens {params.max_tokens} is over this server's limit of {cfg.max_tokens_limit}; "
                           "ask for fewer tokens.", param="max_tokens")
        if cfg.max_prompt_tokens is not None and len(prompt_ids) > cfg.max_prompt_tokens:
            raise DLMError(f"The prompt has {len(prompt_ids)} tokens, over this server's limit of "
                           f"{cfg.max_prompt_tokens}; shorten it (fewer documents or turns).")
        llm().engine.check(prompt_ids, params, template)
        if llm().engine.is_full:
            raise Busy(f"The server is at capacity ({cfg.limits.max_waiting} requests queued); retry shortly.")

    async def prepare(body):
        """The body's knobs as SamplingParams, after the model check; loads a --lazy model off the loop."""
        if body.model is not None and body.model not in names:
            raise _NotServed(body.model)
        chat.refuse_unsupported(body.model_dump(exclude_unset=True))
        knobs = body.knobs()
        await asyncio.to_thread(llm)
        if "max_tokens" not in knobs:    # the default canvas, within this server's limit
            knobs["max_tokens"] = min(llm().sampling_params().max_tokens, cfg.max_tokens_limit)
        return chat.request_params(llm(), knobs, where="body")

    @app.exception_handler(_NotServed)
    async def not_served(_: Request, exc: _NotServed):
        return error_response(404, f"The model {exc.args[0]!r} is not served here; this server serves "
                                   f"{', '.join(map(repr, names))}.", param="model", code="model_not_found")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(metrics_text(registry), media_type=CONTENT_TYPE)

    cards = [{"id": n, "object": "model", "created": 0, "owned_by": "dlm_backend"} for n in names]

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": cards}

    @app.get("/v1/models/{model_id:path}")      # client.models.retrieve; hub ids hold a "/"
    async def model(model_id: str):
        if model_id not in names:
            raise _NotServed(model_id)
        return cards[names.index(model_id)]

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: Request):
        params = await prepare(body)
        request = chat.ChatRequest(body.messages, params, tools=body.tools, tool_choice=body.tool_choice,
                                   response_format=body.response_format)
        plan = chat.Plan(llm(), request)          # validates before the 200 goes out
        admit(plan.prompt_ids, params, plan.template)
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": body.model or names[0]}
        if body.stream:
            usage = bool((body.stream_options or {}).get("include_usage"))
            return ClosingStreamingResponse(chat_events(llm(), request, plan, base, usage),
                                            media_type="text/event-stream")
        result = await _unless_disconnected(http, chat.acomplete(llm(), request, plan))
        if result is None:
            return Response(status_code=499)
        message = {"role": "assistant", "content": result.content if not result.tool_calls else (result.content or None)}
        if result.tool_calls:
            message["tool_calls"] = result.tool_calls
        return {**base, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": result.finish_reason}],
                "usage": result.usage, "dlm": {"num_forward_passes": result.num_forward_passes}}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        params = await prepare(body)
        one = isinstance(body.prompt, str) or (body.prompt and isinstance(body.prompt[0], int))
        prompts = [body.prompt] if one else body.prompt
        if len(prompts) != 1:
            raise DLMError("Send one prompt per request (batch by sending concurrent requests).", param="prompt")
        ids = llm().tokenizer.encode(prompts[0]) if isinstance(prompts[0], str) else prompts[0]
        admit(ids, params)
        base = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": body.model or names[0]}
        if body.stream:
            usage = bool((body.stream_options or {}).get("include_usage"))
            return ClosingStreamingResponse(completion_events(llm(), ids, params, base, usage),
                                            media_type="text/event-stream")
        outs = await _unless_disconnected(http, llm().agenerate(prompt_token_ids=[ids], sampling_params=params))
        if outs is None:
            return Response(status_code=499)
        out = outs[0]
        return {**base, "object": "text_completion", "usage": out.usage,
                "choices": [{"index": 0, "text": out.text, "finish_reason": out.finish_reason, "logprobs": None}]}

    return app


class _NotServed(Exception):
    """A request for a model this server does not serve (404, OpenAI's model_not_found)."""


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
