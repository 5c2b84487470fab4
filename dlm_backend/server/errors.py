"""Errors in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``) and the handlers
that map every failure to one: the openai client raises its own typed exceptions on them."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from dlm_backend.errors import ContextLengthError, DLMError, EngineError, ParallelWorkerError, QueueFullError
from dlm_backend.server.model import Busy, Unavailable

log = logging.getLogger("dlm_backend.server")

#: HTTP status -> OpenAI error type.
TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
         405: "invalid_request_error", 413: "invalid_request_error", 421: "invalid_request_error",
         429: "rate_limit_error", 500: "server_error", 503: "server_error"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(status, message, param, code), headers=headers)


#: OpenAI API routes this server does not serve, by path prefix -> what they are (an unknown route
#: under one of them says so, rather than a bare "Not Found").
OPENAI_ROUTES = {"/v1/embeddings": "embeddings", "/v1/images": "image generation",
                 "/v1/audio": "audio (speech, transcription, translation)",
                 "/v1/assistants": "the Assistants API", "/v1/threads": "the Assistants API's threads",
                 "/v1/files": "file uploads", "/v1/uploads": "file uploads", "/v1/batches": "the Batch API",
                 "/v1/fine_tuning": "fine-tuning", "/v1/moderations": "moderations",
                 "/v1/vector_stores": "vector stores", "/v1/realtime": "the Realtime API",
                 "/v1/chat/completions/": "stored chat completions",
                 "/v1/responses/": "stored responses (nothing is stored here; POST /v1/responses is served)"}


def served_routes(app: FastAPI) -> str:
    """The routes ``app`` serves, as "POST /v1/chat/completions, GET /v1/models, ..." (FastAPI's own
    /docs and /openapi.json left out: they are not part of the API)."""
    return ", ".join(f"{method} {route.path}" for route in app.routes if isinstance(route, APIRoute)
                     for method in sorted(route.methods))


def unknown_route(app: FastAPI):
    """The router's answer for a path no route matches: OpenAI's 404 ("Invalid URL"), naming what the
    path is when it is an OpenAI route not served here, and the routes that are. The API key guard
    answers before the router does, so a caller without the key learns nothing of the routes."""
    async def answer(scope, receive, send) -> None:
        path = scope.get("path", "")
        what = next((name for prefix, name in OPENAI_ROUTES.items() if path.startswith(prefix)), None)
        message = f"Invalid URL ({scope.get('method', 'GET')} {path})"
        message += f": {what} is not served by this server" if what else ": no such route"
        response = error_response(404, f"{message}. It serves {served_routes(app)}.")
        await response(scope, receive, send)
    return answer


def install_handlers(app: FastAPI) -> None:
    """Every failure a route can raise, as an OpenAI error; never a traceback. A path no route
    matches is answered by :func:`unknown_route`."""
    app.router.default = unknown_route(app)

    @app.exception_handler(DLMError)
    async def dlm_error(_: Request, exc: DLMError):
        code = "context_length_exceeded" if isinstance(exc, ContextLengthError) else None
        return error_response(400, str(exc), getattr(exc, "param", None), code)

    @app.exception_handler(QueueFullError)
    @app.exception_handler(Busy)
    async def busy(_: Request, exc: Exception):
        return error_response(429, str(exc) or "The server is busy; retry shortly.", code="rate_limit_exceeded",
                              headers={"Retry-After": "1"})

    @app.exception_handler(Unavailable)
    async def unavailable(_: Request, exc: Unavailable):
        return error_response(503, str(exc), headers={"Retry-After": "5"})

    @app.exception_handler(ParallelWorkerError)
    async def engine_failed(_: Request, exc: ParallelWorkerError):
        return error_response(503, str(exc))            # this replica is down: a router retries another

    @app.exception_handler(EngineError)
    async def engine_error(_: Request, exc: EngineError):
        return error_response(500, f"{exc} Other requests are unaffected; retrying may succeed.")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        headers = getattr(exc, "headers", None)
        message = str(exc.detail)
        if exc.status_code == 405 and headers and headers.get("Allow"):      # a route asked with another method
            message = f"{request.method} {request.url.path} is not served; this route takes {headers['Allow']}."
        return error_response(exc.status_code, message, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error_response(400, f"Invalid request: {where or 'body'}: {first.get('msg', 'malformed')}.",
                              param=where or None)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception):
        log.error("internal error: %s: %s", type(exc).__name__, exc)
        return error_response(500, f"Internal error ({type(exc).__name__}); the server keeps running.")
