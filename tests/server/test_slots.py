"""Every request gives its queue slot back exactly once, however it ends; the slots follow the KV pages.

A streamed request that failed before its stream began (a bad schema, a prompt over the context,
too many tokens) kept its slot: eight of them made a 4 + 4 server answer 429 to everyone forever.
A server whose KV cache held one request at a time counted ``max_num_seqs + max_waiting`` slots, so
15 requests waited under a ``max_waiting`` of 6 and none was refused.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
httpx = pytest.importorskip("httpx")

from dlm_backend.engine.engine_config import EngineLimits  # noqa: E402
from dlm_backend.server import create_app  # noqa: E402
from dlm_backend.server.settings import ServerConfig  # noqa: E402
from tests.helpers import make_block_chat_checkpoint, serve_in_thread  # noqa: E402

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


@pytest.fixture(scope="module")
def paged(tmp_path_factory):
    """sdar-tiny with a 1 MiB KV cache (85 pages): a request of 134 prompt + 600 new tokens takes 48
    of them, so one runs at a time though 16 may; 3 may wait."""
    folder = make_block_chat_checkpoint(tmp_path_factory.mktemp("paged") / "sdar", "sdar")
    cfg = ServerConfig(model=str(folder), served_name="m", kv_cache_memory=1 << 20, max_tokens_limit=1024,
                       limits=EngineLimits(max_num_seqs=16, max_waiting=3))
    app = create_app(config=cfg)
    with serve_in_thread(app) as url:
        yield url, app.state.served


def big(i: int, stream: bool) -> dict:
    prompt = [10 + i] + [5 + j % 200 for j in range(133)]          # its own first token: no page shared
    return {"model": "m", "prompt": prompt, "max_tokens": 600, "sampler": "sdar", "block_length": 64, "steps": 1,
            "ignore_eos": True, "stream": stream}


async def _send(client, i: int, stream: bool):
    """(status, text, whether a streamed reply carried an error event, Retry-After)."""
    if not stream:
        r = await client.post(COMPLETIONS, json=big(i, False))
        text = r.json()["choices"][0]["text"] if r.status_code == 200 else ""
        return r.status_code, text, False, r.headers.get("retry-after")
    text, failed = "", False
    async with client.stream("POST", COMPLETIONS, json=big(i, True)) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                failed = failed or "error" in event
                text += "".join(c["text"] for c in event.get("choices", []))
        return r.status_code, text, failed, r.headers.get("retry-after")


def test_requests_waiting_for_kv_pages_count_against_max_waiting(paged):
    """8 requests at once, half streamed: 1 runs, 3 wait, the rest are 429s before any 200; the
    queue never holds more than 3 and every answer equals its solo run."""
    url, served = paged
    engine = served.llm().engine
    solo = [httpx.post(url + COMPLETIONS, json=big(i, False), timeout=120).json()["choices"][0]["text"]
            for i in range(8)]
    original, seen, stop = engine.runner.step, [], threading.Event()
    engine.runner.step = lambda batch: (time.sleep(0.05), original(batch))[1]     # requests stay in flight

    def watch():
        while not stop.is_set():
            seen.append((engine.num_running, engine.num_queued, engine.num_running + engine.num_waiting))
            time.sleep(0.005)

    async def burst():
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            return await asyncio.gather(*(_send(client, i, i % 2 == 1) for i in range(8)))
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        replies = asyncio.run(burst())
    finally:
        stop.set()
        watcher.join()
        engine.runner.step = original
    ok = [i for i, (status, *_) in enumerate(replies) if status == 200]
    refused = [(status, retry) for status, _, _, retry in replies if status != 200]
    assert [max(column) for column in zip(*seen)] == [1, 3, 4], seen     # 1 running, 3 waiting for pages
    assert len(ok) >= 4 and len(refused) >= 3 and all(s == 429 and retry == "1" for s, retry in refused), replies
    assert all(replies[i][1] == solo[i] and not replies[i][2] for i in ok)
    assert served.held == 0 and served.planned == {} and held(url) == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_larger_than_the_kv_cache_is_a_400_naming_the_flag(paged, stream):
    """400 + 1000 tokens need 88 pages of the 85: the message named kv_cache_memory, which a server's
    operator cannot set; the flag is --kv-cache-memory."""
    url, served = paged
    r = httpx.post(url + COMPLETIONS, json={**big(0, stream), "prompt": [7] * 400, "max_tokens": 1000}, timeout=60)
    assert r.status_code == 400 and "--kv-cache-memory" in r.json()["error"]["message"], r.text
    assert "88 KV pages and the whole cache holds 85" in r.json()["error"]["message"] and served.held == 0
