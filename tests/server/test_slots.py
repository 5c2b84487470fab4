"""Every request gives its queue slot back exactly once, however it ends.

A streamed request that failed before its stream began (a bad schema, a prompt over the context,
too many tokens) kept its slot: eight of them made a 4 + 4 server answer 429 to everyone forever.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
httpx = pytest.importorskip("httpx")

from dlm_backend.engine.engine_config import EngineLimits  # noqa: E402
from dlm_backend.server import create_app  # noqa: E402
from dlm_backend.server.settings import ServerConfig  # noqa: E402
from tests.helpers import serve_in_thread  # noqa: E402

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HI = [{"role": "user", "content": "hi"}]
BAD_REF = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
    "a": {"$ref": "#/nope"}}}}}


@pytest.fixture(scope="module")
def small(dream_chat):
    """A server with 1 running + 1 queued slot, so a leak shows after two bad requests."""
    cfg = ServerConfig(model=str(dream_chat), served_name="m", max_tokens_limit=64,
                       limits=EngineLimits(max_num_seqs=1, max_waiting=1))
    app = create_app(config=cfg)
    with serve_in_thread(app) as url:
        yield url, app.state.served


def held(url: str) -> float:
    line = next(x for x in httpx.get(url + "/metrics").text.splitlines() if x.startswith("dlm_server_slots_held "))
    return float(line.split()[1])


@pytest.mark.parametrize("stream", [True, False])
def test_requests_refused_before_their_stream_starts_give_their_slot_back(small, stream):
    url, served = small
    bad = [  # each fails after its slot is taken: planning, admission, the prompt, the token limit
        (CHAT, {"messages": HI, "response_format": BAD_REF}),
        (CHAT, {"messages": [{"role": "user", "content": "word " * 3000}]}),
        (CHAT, {"messages": HI, "max_tokens": 10_000}),
        (COMPLETIONS, {"prompt": "word " * 3000}),
        (COMPLETIONS, {"prompt": [10**9]}),
    ]
    for _ in range(3):                          # 15 refusals, past the 2 slots many times over
        for path, body in bad:
            r = httpx.post(url + path, json={"model": "m", "max_tokens": 8, "stream": stream, **body}, timeout=60)
            assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
    assert served.held == 0 and held(url) == 0
    for path, body in ((CHAT, {"messages": HI}), (COMPLETIONS, {"prompt": "hi"})):
        r = httpx.post(url + path, json={"model": "m", "max_tokens": 8, "stream": stream, **body}, timeout=60)
        assert r.status_code == 200, r.text
    assert served.held == 0 and held(url) == 0
