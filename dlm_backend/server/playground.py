"""The playground page: ``GET /playground`` (and its two files), a chat that shows each block denoise.

Static files shipped in the package (server/playground/: HTML, JS, CSS; no build step, no CDN, nothing
fetched from elsewhere). The page speaks the server's own OpenAI API, streaming with
``stream_options.include_canvas``, so it can do nothing a client cannot. The API key guards it as it
guards every route: a browser asked for it (HTTP Basic, the key as the password; security.py) sends
it again with every request the page makes.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

from dlm_backend.server.errors import error_response

#: what the page is made of: name -> media type (nothing else under /playground is served)
FILES = {"index.html": "text/html; charset=utf-8", "playground.js": "text/javascript; charset=utf-8",
         "playground.css": "text/css; charset=utf-8"}
#: the page may load only its own files and talk only to this server
POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"


def _file(name: str) -> Response:
    body = resources.files("dlm_backend.server").joinpath("playground", name).read_bytes()
    return Response(body, media_type=FILES[name], headers={"content-security-policy": POLICY,
                                                           "cache-control": "no-cache"})


def install_playground(app: FastAPI) -> None:
    """Serve the playground page at ``/playground``."""

    @app.get("/playground", include_in_schema=False)
    async def playground():
        return _file("index.html")

    @app.get("/playground/{name}", include_in_schema=False)
    async def playground_file(name: str):
        if name not in FILES:
            return error_response(404, f"The playground has no file {name!r}; it is made of "
                                       f"{', '.join(sorted(FILES))}.", code="not_found")
        return _file(name)
