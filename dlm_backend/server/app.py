"""FastAPI app: /v1/models (and /v1/models/{id}), /v1/chat/completions, /v1/completions, /v1/responses,
/playground, /metrics, /health.

Routes translate OpenAI requests into the shared chat core (:mod:`dlm_backend.chat`) and results
back; they hold no engine logic. Bad input is an OpenAI-shaped 4xx saying what to fix, never a
traceback (server/errors.py): 400 for invalid requests, 401 for a wrong API key, 404 for a model or a
route not served here, 413 for oversized bodies, 429 with Retry-After when the engine's queue is full, 500
when one request fails inside the engine (the others keep running). A client that disconnects frees
its engine slot at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from dlm_backend import chat
from dlm_backend.engine.engine_config import check_dtype
from dlm_backend.errors import DLMError
from dlm_backend.server.errors import error_response, install_handlers
from dlm_backend.server.metrics import CONTENT_TYPE, make_registry, metrics_text
from dlm_backend.server.model import ServedModel
from dlm_backend.server.protocol import ChatCompletionRequest, CompletionRequest
from dlm_backend.server.playground import install_playground
from dlm_backend.server.responses import install_responses
from dlm_backend.server.security import APIKeyMiddleware, BodyLimitMiddleware, HostCheckMiddleware
from dlm_backend.server.settings import ServerConfig
from dlm_backend.server.stream import chat_events, completion_events, streamed, unless_disconnected

def create_app(model: str | None = None, served_name: str | None = None, device: str | None = None,
               config: ServerConfig | None = None) -> FastAPI:
    """The app for one model; it loads on the first request (or at startup with ``app.state.llm()``)."""
    cfg = config or ServerConfig(model=model, served_name=served_name, device=device)
    check_dtype(cfg.dtype)                 # before serving, even with --lazy
    served = ServedModel(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        served.close()                   # the server's handle on the shared engine goes back

    app = FastAPI(title="dlm_backend", version="0.1.0", lifespan=lifespan)
    names = cfg.served_names
    app.state.llm = served.llm
    app.state.served = served
    app.state.config = cfg
    registry = make_registry(lambda: served.loaded.engine if served.loaded else None, slots=lambda: served.held)
    app.add_middleware(BodyLimitMiddleware, max_bytes=cfg.max_body_bytes)
    if cfg.api_key or cfg.metrics_key:
        app.add_middleware(APIKeyMiddleware, api_key=cfg.api_key, metrics_key=cfg.metrics_key)
    if not cfg.api_key and cfg.allowed_hosts:
        app.add_middleware(HostCheckMiddleware, allowed=cfg.allowed_hosts)
    install_handlers(app)

    async def knobs_of(body) -> dict:
        """The body's sampling knobs, after the model check, with the model loaded (off the loop)."""
        if body.model is not None and body.model not in names:
            raise _NotServed(body.model)
        chat.refuse_unsupported(body.model_dump(exclude_unset=True))
        knobs = body.knobs()
        await served.load()
        return knobs

    @app.exception_handler(_NotServed)
    async def not_served(_: Request, exc: _NotServed):
        return error_response(404, f"The model {exc.args[0]!r} is not served here; this server serves "
                                   f"{', '.join(map(repr, names))}.", param="model", code="model_not_found")

    @app.get("/health")
    async def health():
        # A load balancer (LiteLLM's router, Kubernetes) takes a replica whose engine failed out of rotation.
        llm = served.loaded
        failure = llm.engine.failure if llm is not None and not llm.closed else None
        if failure is not None:
            return JSONResponse(status_code=503, content={"status": "unhealthy", "detail": str(failure)})
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(metrics_text(registry), media_type=CONTENT_TYPE)

    def card(name: str) -> dict:
        # OpenAI's model object, plus the engine's facts under "dlm" (as responses carry theirs):
        # clients read the fields they know and ignore the rest. Built per request, since the memory
        # figures appear once the model has loaded.
        return {"id": name, "object": "model", "created": 0, "owned_by": "dlm_backend", "dlm": served.engine_facts()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card(n) for n in names]}

    @app.get("/v1/models/{model_id:path}")      # client.models.retrieve; hub ids hold a "/"
    async def model(model_id: str):
        if model_id not in names:
            raise _NotServed(model_id)
        return card(model_id)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: Request):
        knobs = await knobs_of(body)
        # The slot is taken before anything is queued or a 200 goes out, and given back on leaving
        # this block unless a stream took it over (it gives it back when it closes).
        with served.reserve() as slot:
            plan = await asyncio.to_thread(served.plan_chat, slot, body, knobs)
            base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                    "model": body.model or names[0]}
            if body.stream:
                options = body.stream_options or {}
                events = chat_events(served.llm(), plan, base, bool(options.get("include_usage")),
                                     bool(options.get("include_canvas")))
                return streamed(events, slot)
            result = await unless_disconnected(http, chat.acomplete(served.llm(), plan.request, plan))
        if result is None:
            return Response(status_code=499)
        message = {"role": "assistant", "content": result.content if not result.tool_calls else (result.content or None)}
        if result.tool_calls:
            message["tool_calls"] = result.tool_calls
        return {**base, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": result.finish_reason,
                             "logprobs": None if result.logprobs is None else {"content": result.logprobs}}],
                "usage": result.usage, "dlm": {"num_forward_passes": result.num_forward_passes}}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        knobs = await knobs_of(body)
        one = isinstance(body.prompt, str) or (body.prompt and isinstance(body.prompt[0], int))
        prompts = [body.prompt] if one else body.prompt
        if len(prompts) != 1:
            raise DLMError("Send one prompt per request (batch by sending concurrent requests).", param="prompt")
        with served.reserve() as slot:
            ids, params = await asyncio.to_thread(served.prompt_ids, slot, prompts[0], knobs)
            base = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                    "model": body.model or names[0]}
            if body.stream:
                usage = bool((body.stream_options or {}).get("include_usage"))
                return streamed(completion_events(served.llm(), ids, params, base, usage), slot)
            outs = await unless_disconnected(http, served.llm().agenerate(prompt_token_ids=[ids],
                                                                           sampling_params=params))
        if outs is None:
            return Response(status_code=499)
        out = outs[0]
        tokenizer = served.llm().engine.tokenizer           # None for a checkpoint without one: ids stand in
        logprobs = None if out.logprobs is None else chat.completion_logprobs(tokenizer, out.logprobs)
        return {**base, "object": "text_completion", "usage": out.usage,
                "choices": [{"index": 0, "text": out.text, "finish_reason": out.finish_reason, "logprobs": logprobs}]}

    install_responses(app, served, knobs_of)      # POST /v1/responses on the same chat core
    install_playground(app)                       # GET /playground: chat and watch each block denoise
    return app


class _NotServed(Exception):
    """A request for a model this server does not serve (404, OpenAI's model_not_found)."""
