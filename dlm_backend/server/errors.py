"""Errors in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``) and the handlers
that map every failure to one: the openai client raises its own typed exceptions on them."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from dlm_backend.errors import ContextLengthError, DLMError, EngineError, ParallelWorkerError, QueueFullError
from dlm_backend.server.model import Busy, Unavailable

log = logging.getLogger("dlm_backend.server")

#: HTTP status -> OpenAI error type.
TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
         413: "invalid_request_error", 421: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
         503: "server_error"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(status, message, param, code), headers=headers)


def install_handlers(app: FastAPI) -> None:
    """Every failure a route can raise, as an OpenAI error; never a traceback."""

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
    async def http_error(_: Request, exc: HTTPException):
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

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
