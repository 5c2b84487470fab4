"""Server hardening: API key, body limits, validation, back-pressure, disconnects, failures, metrics.

Everything runs over real HTTP on loopback against uvicorn in a thread, so the ASGI middleware, the
exception handlers and the disconnect detection are the production ones.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
httpx = pytest.importorskip("httpx")

from dlm_backend.server import create_app  # noqa: E402
from dlm_backend.engine.engine_config import EngineLimits  # noqa: E402
from dlm_backend.server.settings import ServerConfig  # noqa: E402
from tests.helpers import serve_in_thread  # noqa: E402

KEY = "sk-test-key"
CHAT = "/v1/chat/completions"


def body(content: str = "hi", max_tokens: int = 16, **extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "block_length": 8, **extra}


def auth(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def guarded(dream_chat):
    cfg = ServerConfig(model=str(dream_chat), served_name="tiny", api_key=KEY, max_body_bytes=4096,
                       max_tokens_limit=64, max_prompt_tokens=200)
    with serve_in_thread(create_app(config=cfg)) as url:
        yield url


def test_api_key_on_every_route_but_health(guarded):
    assert httpx.get(guarded + "/health").status_code == 200
    for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", CHAT), ("POST", "/v1/completions")]:
        r = httpx.request(method, guarded + path, json=body())
        assert r.status_code == 401, path
        assert r.json()["error"]["type"] == "authentication_error"
        assert httpx.request(method, guarded + path, json=body(), headers=auth("sk-wrong")).status_code == 401
    r = httpx.post(guarded + CHAT, json=body(), headers=auth(), timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    # An unknown route is no way around the key: without it, a 401 that names no route
    for path in ("/v1/embeddings", "/v1/nope", "/docs"):
        r = httpx.post(guarded + path, json=body())
        assert r.status_code == 401 and "/v1/" not in r.json()["error"]["message"], path
    r = httpx.post(guarded + "/v1/embeddings", json=body(), headers=auth())
    assert r.status_code == 404 and "embeddings is not served" in r.json()["error"]["message"]
    assert httpx.get(guarded + "/v1/models", headers={"x-api-key": KEY}).status_code == 200


def test_oversized_bodies_are_413_by_length_and_by_stream(guarded):
    big = json.dumps(body("word " * 2000)).encode()
    r = httpx.post(guarded + CHAT, content=big, headers={**auth(), "content-type": "application/json"})
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"]["message"]

    def chunked():                # no Content-Length: the limit applies while the body streams in
        yield big[:3000]
        yield big[3000:]

    r = httpx.post(guarded + CHAT, content=chunked(), headers={**auth(), "content-type": "application/json"})
    assert r.status_code == 413


def test_malformed_and_out_of_limit_requests_are_400_without_traces(guarded):
    cases = [
        (b'{"messages": [', "Invalid request"),
        (json.dumps(body(max_tokens=65)).encode(), "over this server's limit of 64"),
        (json.dumps(body("alpha beta gamma " * 60)).encode(), "shorten it"),
        (json.dumps(body(temperature=-1)).encode(), "temperature"),
        (json.dumps(body(sampler="nope")).encode(), "Unknown sampler"),
    ]
    for raw, expected in cases:
        r = httpx.post(guarded + CHAT, content=raw, headers={**auth(), "content-type": "application/json"})
        assert r.status_code == 400, (raw[:40], r.text)
        assert expected in r.json()["error"]["message"]
        assert "Traceback" not in r.text and 'File "' not in r.text


def test_a_request_without_max_tokens_gets_the_default_capped_to_the_limit(guarded):
    """The serving default (256 tokens) is the server's own: under --max-tokens-limit 64 it was a 400
    saying "max_tokens 256" to every client that sent none."""
    chat = body()
    del chat["max_tokens"]
    r = httpx.post(guarded + CHAT, json=chat, headers=auth(), timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 64
    r = httpx.post(guarded + "/v1/completions", json={"model": "tiny", "prompt": "hi", "block_length": 8},
                   headers=auth(), timeout=60)
    assert r.status_code == 200, r.text


def test_metrics_in_prometheus_format(guarded):
    for content in ("hi", "hello there"):
        assert httpx.post(guarded + CHAT, json=body(content), headers=auth(), timeout=60).status_code == 200
    r = httpx.get(guarded + "/metrics", headers=auth())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    values = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    assert values["dlm_queue_depth"] == 0 and values["dlm_running_requests"] == 0
    assert values["dlm_generated_tokens_total"] >= 2
    assert values["dlm_forward_passes_total"] >= values["dlm_engine_steps_total"] >= 1
    assert values["dlm_forward_passes_per_second"] > 0 and values["dlm_tokens_per_second"] > 0
    per_token = values["dlm_forward_passes_total"] / values["dlm_generated_tokens_total"]
    assert values["dlm_forward_passes_per_token"] == pytest.approx(per_token)
    assert sum(v for k, v in values.items() if k.startswith("dlm_requests_finished_total")) >= 2


def test_a_metrics_key_keeps_the_prefix_cache_counters_from_clients(dream_chat):
    """/metrics tells whether a prompt prefix is cached (a known system prompt: +46 hits, an unseen one
    +0); with a metrics key only the scraper reads it, with or without an API key for the clients."""
    from fastapi.testclient import TestClient

    for api_key in (None, KEY):
        cfg = ServerConfig(model=str(dream_chat), served_name="tiny", api_key=api_key, metrics_key="sk-scraper")
        with TestClient(create_app(config=cfg), base_url="http://localhost") as client:
            assert client.get("/metrics").status_code == 401
            r = client.get("/metrics", headers=auth())                        # the clients' key does not open it
            assert r.status_code == 401 and "metrics key" in r.json()["error"]["message"]
            assert client.get("/metrics", headers=auth("sk-scraper")).status_code == 200
            assert client.get("/v1/models", headers=auth("sk-scraper")).status_code == (401 if api_key else 200)
            assert client.get("/v1/models", headers=auth() if api_key else {}).status_code == 200
            assert client.get("/health").status_code == 200


@pytest.mark.parametrize("arguments", ["[" * 5000 + "]" * 5000, '{"a": ' * 3000 + "1" + "}" * 3000])
def test_deeply_nested_tool_call_arguments_are_a_400_naming_the_field(dream_chat, arguments):
    """A 10 KB '[' * 5000 was a 500 (RecursionError) with a traceback in the log."""
    from fastapi.testclient import TestClient

    turns = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                                 "function": {"name": "f", "arguments": arguments}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    app = create_app(config=ServerConfig(model=str(dream_chat), served_name="tiny"))
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as client:
        for stream in (False, True):
            r = client.post(CHAT, json={**body(), "messages": turns, "stream": stream})
            assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"], r.text
            assert r.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"


# -- a deliberately slow engine: requests stay in flight long enough to queue, cancel and fail ---


@pytest.fixture
def slow(dream_chat):
    """A server whose engine sleeps 50 ms per pass, with 2 slots and a queue of 1."""
    limits = EngineLimits(max_num_seqs=2, max_waiting=1)
    app = create_app(config=ServerConfig(model=str(dream_chat), served_name="tiny", limits=limits))
    engine = app.state.llm().engine
    original = engine.runner.step

    def slow_step(seqs):
        time.sleep(0.05)
        return original(seqs)

    engine.runner.step = slow_step
    with serve_in_thread(app) as url:
        yield url, engine
    engine.runner.step = original
    engine.set_limits(**vars(EngineLimits()))        # the engine is shared with the other tests


def finished_since(engine, before: dict) -> dict:
    """Requests finished since ``before`` (a copy of ``engine.stats.finished``), by reason."""
    return {k: v - before.get(k, 0) for k, v in engine.stats.finished.items() if v != before.get(k, 0)}


def wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


LONG = dict(max_tokens=64, sampler="llada", steps=64)     # 64 passes x 50 ms: over 3 s in flight


def test_full_queue_answers_429_with_retry_after(slow):
    url, engine = slow
    results = []

    def post(i):
        results.append(httpx.post(url + CHAT, json=body(f"request {i}", **LONG), timeout=60).status_code)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    assert wait_for(lambda: engine.num_running == 2 and engine.num_waiting == 1), \
        f"{engine.num_running} running, {engine.num_waiting} waiting, answered {results}"
    r = httpx.post(url + CHAT, json=body("one too many"), timeout=60)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert "retry" in r.json()["error"]["message"]
    for t in threads:
        t.join()
    assert results == [200, 200, 200]          # the queued ones were not lost


def test_disconnect_mid_stream_frees_the_slot(slow):
    url, engine = slow
    aborted = engine.stats.finished["abort"]
    with httpx.stream("POST", url + CHAT, json=body("stream me", stream=True, **LONG), timeout=60) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        assert wait_for(lambda: engine.num_running == 1, timeout=2.0)
    # The client is gone: the slot must be freed long before the 64 passes would have finished.
    assert wait_for(lambda: engine.stats.finished["abort"] == aborted + 1, timeout=2.5)
    assert wait_for(lambda: engine.num_running == 0, timeout=1.0)


@pytest.mark.parametrize("path", [CHAT, "/v1/completions"])
def test_stream_dropped_at_its_first_event_never_runs_on(slow, path):
    """The first event can go out before the engine has the request (the chat role chunk does):
    a client leaving right then must not leave a request computing for nobody."""
    url, engine = slow
    finished = dict(engine.stats.finished)
    payload = body("drop me", stream=True, **LONG) if path == CHAT else \
        {"model": "tiny", "prompt": "drop me", "stream": True, "block_length": 8, **LONG}
    with httpx.stream("POST", url + path, json=payload, timeout=60) as r:
        assert next(line for line in r.iter_lines() if line.startswith("data:"))
    # 64 passes x 50 ms is over 3 s: a request left running would still be in flight here.
    assert wait_for(lambda: engine.num_running == 0 and engine.num_waiting == 0, timeout=1.5)
    time.sleep(0.3)                            # a late submission would show up by now
    assert engine.num_running == 0 and engine.num_waiting == 0
    assert finished_since(engine, finished) in ({}, {"abort": 1})   # never submitted, or aborted: never run on


def test_client_leaving_while_an_event_is_being_sent_aborts_at_once(dream_chat):
    """Drive the ASGI app directly so the disconnect lands while a chunk is being written: Starlette
    then cancels the send, not the generator, and the request must still be aborted right away."""
    app = create_app(config=ServerConfig(model=str(dream_chat), served_name="tiny"))
    engine = app.state.llm().engine
    original = engine.runner.step
    engine.runner.step = lambda seqs: (time.sleep(0.05), original(seqs))[1]
    finished = dict(engine.stats.finished)
    payload = json.dumps(body("leave mid-write", stream=True, **LONG)).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "path": CHAT, "raw_path": CHAT.encode(), "query_string": b"", "root_path": "",
             "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(payload)).encode())]}

    async def scenario():
        stuck, sent = asyncio.Event(), []
        inbox = [{"type": "http.request", "body": payload, "more_body": False}]

        async def receive():
            if inbox:
                return inbox.pop()
            await stuck.wait()                    # the client leaves once a write is stuck
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and len(sent) == 3:   # start, role, first delta
                stuck.set()
                await asyncio.Event().wait()      # the socket is gone: this write never completes

        await asyncio.wait_for(app(scope, receive, send), timeout=30)
        return engine.num_running + engine.num_waiting

    try:
        left = asyncio.run(scenario())
        assert left == 0, "the request ran on after its client left"
        assert finished_since(engine, finished) == {"abort": 1}
    finally:
        engine.runner.step = original


def test_client_timeout_on_a_non_streaming_request_frees_the_slot(slow):
    url, engine = slow
    aborted = engine.stats.finished["abort"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + CHAT, json=body("too slow", **LONG), timeout=0.3)
    assert wait_for(lambda: engine.stats.finished["abort"] == aborted + 1, timeout=2.5), \
        f"finished {dict(engine.stats.finished)}, {engine.num_running} running"
    assert engine.num_running == 0


def test_the_openai_clients_timeout_frees_the_slot(slow):
    """The openai client's own timeout (as ChatOpenAI(timeout=...) sets it) raises its
    APITimeoutError, and the server aborts the request it left behind."""
    openai = pytest.importorskip("openai")
    url, engine = slow
    aborted = engine.stats.finished["abort"]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=0.3, max_retries=0)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "too slow"}],
                                       extra_body={"block_length": 8, **LONG})
    assert wait_for(lambda: engine.stats.finished["abort"] == aborted + 1, timeout=2.5)
    assert engine.num_running == 0


def test_a_request_failing_inside_the_engine_fails_alone(dream_chat):
    app = create_app(config=ServerConfig(model=str(dream_chat), served_name="tiny", limits=EngineLimits(max_num_seqs=8)))
    llm = app.state.llm()
    engine = llm.engine
    prompts = ["first question", "second one", "FAIL here", "third request"]
    with serve_in_thread(app) as url:
        solo = {p: httpx.post(url + CHAT, json=body(p), timeout=60).json()["choices"][0]["message"]["content"]
                for p in prompts if p != "FAIL here"}
        original = engine.runner.step

        def failing_step(batch):
            if any("FAIL" in llm.tokenizer.decode(s.prompt_token_ids) for s in batch.seqs):
                raise RuntimeError("injected failure")
            return original(batch)

        engine.runner.step = failing_step
        try:
            replies = {}

            def post(p):
                replies[p] = httpx.post(url + CHAT, json=body(p), timeout=60)

            threads = [threading.Thread(target=post, args=(p,)) for p in prompts]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            engine.runner.step = original
    bad = replies.pop("FAIL here")
    assert bad.status_code == 500 and "injected failure" in bad.json()["error"]["message"]
    assert "Traceback" not in bad.text
    assert {p: r.json()["choices"][0]["message"]["content"] for p, r in replies.items()} == solo


def test_serve_loads_in_the_dtype_asked_and_refuses_an_unknown_one(dream_chat, capsys):
    """`dlm serve --dtype` was accepted and ignored: an 8B model loaded in fp32, twice the memory."""
    import torch

    from dlm_backend.cli import main

    app = create_app(config=ServerConfig(model=str(dream_chat), dtype="bfloat16"))
    assert app.state.llm().engine.dtype == torch.bfloat16
    assert main(["serve", str(dream_chat), "--lazy", "--dtype", "bogus"]) == 2      # before uvicorn starts
    assert "dtype 'bogus' is not supported" in capsys.readouterr().err


def test_the_served_name_follows_dlm_model(dream_chat, monkeypatch):
    """`DLM_MODEL=... dlm serve` loads that model; /v1/models said dlm-tiny all the same."""
    from fastapi.testclient import TestClient

    monkeypatch.setenv("DLM_MODEL", str(dream_chat))
    with TestClient(create_app(), base_url="http://localhost") as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [dream_chat.name]
    monkeypatch.delenv("DLM_MODEL")
    with TestClient(create_app(), base_url="http://localhost") as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["dlm-tiny"]
