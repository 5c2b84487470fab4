"""ASGI middleware for the server's guards: API key on every route but ``/health`` (a metrics key
on ``/metrics`` when one is set), body size limit, Host check.

Both run before FastAPI parses anything, so a wrong key or an oversized body costs no JSON decoding
and never reaches the engine. Errors use the OpenAI error shape the routes use.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets

from starlette.exceptions import HTTPException

from dlm_backend.server.errors import error_body

OPEN_PATHS = frozenset({"/health"})
METRICS_PATH = "/metrics"
#: a browser opening this page is asked for the key (HTTP Basic, the key as the password) and sends
#: it again with every request the page makes; API clients keep sending it as a bearer token
BROWSER_PATHS = ("/playground",)


def _basic_password(auth: bytes) -> bytes:
    """The password of an ``Authorization: Basic`` header (any user name), or b"" if it is not one."""
    if auth[:6].lower() != b"basic ":
        return b""
    try:
        return base64.b64decode(auth[6:].strip(), validate=True).partition(b":")[2]
    except (binascii.Error, ValueError):
        return b""


async def _send_error(send, status: int, message: str, headers: list | None = None) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())] + (headers or [])})
    await send({"type": "http.response.body", "body": body})


class APIKeyMiddleware:
    """Require ``Authorization: Bearer <key>`` (or ``x-api-key``, or HTTP Basic with the key as the
    password: what a browser sends on the playground page): the API key on every route but
    ``/health``, and on ``/metrics`` the metrics key when one is set (the API key does not open it
    then: its prefix cache counters tell whether a prompt prefix was sent before, so they are for the
    operator's scraper, not for clients). A route whose key is None is left to the Host check."""

    def __init__(self, app, api_key: str | None, metrics_key: str | None = None):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.metrics_key = metrics_key.encode() if metrics_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        metrics = scope["path"] == METRICS_PATH and self.metrics_key is not None
        key = self.metrics_key if metrics else self.api_key
        if key is None:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        given = headers.get(b"x-api-key", b"")
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        elif not metrics:
            given = _basic_password(auth) or given
        if not secrets.compare_digest(given, key):
            which = "metrics key ($DLM_METRICS_KEY)" if metrics else "API key"
            browser = scope["path"].startswith(BROWSER_PATHS)
            challenge = b'Basic realm="dlm playground: the API key is the password"' if browser else b"Bearer"
            return await _send_error(send, 401, f"Missing or wrong {which}. Send 'Authorization: Bearer <key>' "
                                     "with the key the server was started with.",
                                     [(b"www-authenticate", challenge)])
        return await self.app(scope, receive, send)


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` mid-body; an HTTPException so FastAPI's body parsing passes it on."""

    def __init__(self, message: str):
        super().__init__(413, message)


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413, by Content-Length or while streaming in."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def _message(self) -> str:
        return (f"Request body is over this server's limit of {self.max_bytes} bytes. Send a shorter "
                "prompt, or start the server with a larger --max-body-bytes.")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _send_error(send, 413, self._message())
        seen, started = 0, False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self._message())
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _send_error(send, 413, self._message())


class HostCheckMiddleware:
    """Refuse requests whose Host header is not one of ``allowed`` (421), the port ignored.

    A server without an API key on loopback is reachable by any web page's script under that page's
    own host name once DNS rebinding points it at 127.0.0.1; checking the Host header stops that.
    ``/health`` stays open for probes.
    """

    def __init__(self, app, allowed: list[str]):
        self.app, self.allowed = app, {h.lower() for h in allowed}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
        if _host_name(host) not in self.allowed:
            return await _send_error(send, 421, f"Host {host!r} is not served here (allowed: "
                                     f"{', '.join(sorted(self.allowed))}). Use one of those, or start the server "
                                     "with an API key.")
        return await self.app(scope, receive, send)


def _host_name(host: str) -> str:
    """The name part of a Host header: '127.0.0.1:8000' -> '127.0.0.1', '[::1]:8000' -> '[::1]'."""
    if host.startswith("["):
        return host[:host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host

