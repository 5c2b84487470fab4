"""Hostile requests against a real ``dlm serve`` process, ``/health`` watched the whole time.

Each known attack gets its own test (SSRF and file reads through ``$ref``, ReDoS, unbounded ``steps``,
a 30,000-property schema, an unresolvable ``$ref``, references that resolve only from the root or
cycle in place, a backtracking value pinned by ``enum``, 900 KB prompts, 20 tools of 1,600
properties, a streaming burst past the queue, huge ``cfg_scale``, infinite floats), then a battery
of generated requests, sent while bodies that never arrive hold connections open: every answer is
a 2xx or an OpenAI-shaped 4xx, none carries a traceback (nor does the server's log), streamed
requests refused before their stream leave no slot held, and ``/health`` answers within a second
throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
httpx = pytest.importorskip("httpx")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from loadgen import free_port, launch  # noqa: E402  (benchmarks/loadgen.py)

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


class Watch:
    """Polls /health every 50 ms in a thread; ``worst`` is the slowest answer seen (s)."""

    def __init__(self, url: str):
        self.url, self.worst, self.failures, self._stop = url, 0.0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                t = time.perf_counter()
                try:
                    ok = client.get(self.url + "/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.worst = max(self.worst, time.perf_counter() - t)
                self.failures += not ok
                self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


@pytest.fixture(scope="module")
def served(dream_chat, tmp_path_factory):
    log = tmp_path_factory.mktemp("hostile") / "serve.log"
    with launch(str(dream_chat), "--max-num-seqs", "4", "--max-waiting", "4", log=str(log)) as url:
        yield url, log


@pytest.fixture(scope="module")
def server(served):
    return served[0]


def chat(url, timeout=60, **body):
    return httpx.post(url + CHAT, json={"model": "m", "messages": HI, "max_tokens": 8, **body}, timeout=timeout)


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def assert_openai_error(r, status=400, param=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"} and "Traceback" not in r.text
    if param is not None:
        assert body["error"]["param"] == param, body


@contextlib.contextmanager
def counting_http_server():
    """A loopback HTTP server that counts the requests it gets (an SSRF target)."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"type": "string"}')

        def log_message(self, *args):
            pass

    port = free_port()
    srv = http.server.HTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}", hits
    finally:
        srv.shutdown()


def test_refs_are_never_fetched_nor_opened(server, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)                         # opening it would block forever
    with counting_http_server() as (target, hits), Watch(server) as watch:
        for ref in (f"{target}/x.json", f"file://{fifo}", "file:///etc/passwd", "#/nope"):
            schema = {"type": "object", "properties": {"a": {"$ref": ref}}}
            assert_openai_error(chat(server, response_format=schema_format(schema)), param="response_format")
            tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
            assert_openai_error(chat(server, tools=[tool]), param="tools[0].function.parameters")
            assert_openai_error(chat(server, stream=True, response_format=schema_format(schema)))
    assert hits == [] and watch.worst < 1.0


def test_a_redos_pattern_does_not_freeze_the_server(server):
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a|aa)+$"}}}
    with Watch(server) as watch:
        r = chat(server, max_tokens=32, response_format=schema_format(schema))
    assert r.status_code == 200 and watch.worst < 1.0 and watch.failures == 0


ID_SCOPED = {"allOf": [{"$id": "http://x/sub.json", "$ref": "#/$defs/z"}], "$defs": {"z": {"type": "string"}}}
IN_PLACE_CYCLES = [{"allOf": [{"$ref": "#"}]}, {"$schema": "https://json-schema.org/draft/2019-09/schema",
                                                 "$recursiveRef": "#"},
                   {"$dynamicAnchor": "n", "anyOf": [{"$dynamicRef": "#n"}]}]


@pytest.mark.parametrize("schema", [ID_SCOPED, *IN_PLACE_CYCLES])
@pytest.mark.parametrize("stream", [False, True])
def test_references_the_validator_cannot_follow_are_400s_before_generation(server, schema, stream):
    """Resolving from the root but not from their $id, or cycling in place, these were admitted and
    failed after generation: 500 (_WrappedReferencingError, RecursionError), or an error event."""
    assert_openai_error(chat(server, stream=stream, response_format=schema_format(schema)), param="response_format")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", **schema}}}
    assert_openai_error(chat(server, stream=stream, tools=[tool]), param="tools[0].function.parameters")


def test_a_backtracking_value_pinned_by_enum_is_bounded(server):
    """enum pins the value the model writes, so each of 200 patterns backtracks on it: 41.9 s for one
    request, and six at once made a normal chat wait 14.2 s."""
    value = "a" * 30 + "!"
    schema = {"type": "object", "properties": {"a": {"type": "string", "enum": [value],
                                                     "anyOf": [{"pattern": "^(a|aa)+$"}] * 200}}}

    async def six_then_one():
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            body = {"model": "m", "messages": HI, "max_tokens": 32, "response_format": schema_format(schema)}
            pinned = [asyncio.create_task(client.post(CHAT, json=body)) for _ in range(6)]
            await asyncio.sleep(0.3)
            t = time.perf_counter()
            normal = await client.post(CHAT, json={"model": "m", "messages": HI, "max_tokens": 8})
            return await asyncio.gather(*pinned), normal, time.perf_counter() - t
    with Watch(server) as watch:
        t = time.perf_counter()
        pinned, normal, normal_took = asyncio.run(six_then_one())
        took = time.perf_counter() - t
    for r in pinned:
        assert_openai_error(r)
        assert "simplify the schema" in r.json()["error"]["message"]
    assert normal.status_code == 200 and normal_took < 3 and took < 10 and watch.worst < 1.0


def test_prompts_that_cannot_fit_are_refused_before_tokenizing(server):
    """Four 900 KB messages at once were tokenized whole first: /health took 2.6 s to answer."""
    async def four(path, body):
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            return await asyncio.gather(*(client.post(path, json=body) for _ in range(4)))
    big = "x " * 450_000
    with Watch(server) as watch:
        t = time.perf_counter()
        replies = asyncio.run(four(CHAT, {"model": "m", "messages": [{"role": "user", "content": big}],
                                         "max_tokens": 8}))
        replies += asyncio.run(four("/v1/completions", {"model": "m", "prompt": big, "max_tokens": 8}))
        took = time.perf_counter() - t
    for r in replies:
        assert_openai_error(r)
        assert r.json()["error"]["code"] == "context_length_exceeded"
    assert took < 5 and watch.worst < 1.0


def test_many_large_tools_are_refused_before_their_schemas_are_checked(server):
    """20 tools of 1,600 properties: 18 s of schema checks for each such request."""
    props = {f"p{i}": {"type": "string"} for i in range(1600)}
    tools = [{"type": "function", "function": {"name": f"t{j}", "parameters": {"type": "object", "properties": props}}}
             for j in range(20)]
    with Watch(server) as watch:
        t = time.perf_counter()
        r = chat(server, tools=tools)
        took = time.perf_counter() - t
    assert_openai_error(r, param="tools[1].function.parameters")
    assert "too large" in r.json()["error"]["message"] and took < 5 and watch.worst < 1.0


def test_a_huge_schema_is_refused_before_work(server):
    props = {f"p{i}": {"type": "string"} for i in range(30_000)}           # ~0.8 MB, under the body limit
    with Watch(server) as watch:
        t = time.perf_counter()
        r = chat(server, response_format=schema_format({"type": "object", "properties": props}))
        took = time.perf_counter() - t
    assert_openai_error(r, param="response_format")
    assert "too large" in r.json()["error"]["message"] and took < 5 and watch.worst < 1.0


def test_steps_and_guidance_are_bounded(server):
    assert_openai_error(chat(server, sampler="llada", steps=10**8), param="steps")
    assert_openai_error(chat(server, sampler="dream", steps=600), param="steps")
    assert_openai_error(chat(server, sampler="llada", cfg_scale=1e38, kv_cache="none"), param="cfg_scale")


@pytest.mark.parametrize("raw", [b'"temperature": Infinity', b'"threshold": NaN', b'"alg_temp": -Infinity',
                                 b'"temperature": 1e400'])
def test_non_finite_numbers_are_400s(server, raw):
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, ' + raw + b"}"
    r = httpx.post(server + CHAT, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert_openai_error(r)


def test_tiny_temperatures_are_greedy_not_a_500(server):
    greedy = chat(server, sampler="dream", temperature=0)
    for tiny in (5e-324, 1e-300):
        r = chat(server, sampler="dream", temperature=tiny, alg_temp=1e-308)
        assert r.status_code == 200 and r.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]


def test_a_streaming_burst_past_the_queue_gets_429s_not_200s(server):
    """4 running + 4 queued: of 40 concurrent streams, those past 8 are 429 with Retry-After."""
    async def burst():
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            async def one():
                body = {"model": "m", "messages": HI, "max_tokens": 64, "sampler": "llada", "block_length": 8,
                        "stream": True}
                async with client.stream("POST", CHAT, json=body) as r:
                    text = (await r.aread()).decode()
                    return r.status_code, r.headers.get("retry-after"), text
            return await asyncio.gather(*(one() for _ in range(40)))
    results = asyncio.run(burst())
    ok = [text for status, _, text in results if status == 200]
    refused = [(s, ra) for s, ra, _ in results if s != 200]
    assert 1 <= len(ok) <= 8 and all(s == 429 and ra for s, ra in refused)
    assert all('"error"' not in text and text.rstrip().endswith("data: [DONE]") for text in ok)


def test_a_battery_of_hostile_requests(served):
    """190 generated requests: each a 2xx or an OpenAI-shaped 4xx, never a traceback; /health < 1 s;
    no slot left held; meanwhile 40 connections whose bodies never arrive stay open."""
    server, log = served
    bodies = _battery()
    assert len(bodies) >= 150
    port = int(server.rsplit(":", 1)[1])
    stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    for sock in stalled:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{")
    with Watch(server) as watch, httpx.Client(base_url=server, timeout=120) as client:
        statuses = []
        for body in bodies:
            path, body = body if isinstance(body, tuple) else (CHAT, body)
            r = client.post(path, content=body if isinstance(body, bytes) else json.dumps(body).encode(),
                            headers={"content-type": "application/json"})
            assert "Traceback" not in r.text and r.status_code < 500, (body, r.status_code, r.text[:300])
            if r.status_code >= 400:
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
            statuses.append(r.status_code)
        after = client.post(CHAT, json={"model": "m", "messages": HI, "max_tokens": 8})
        metrics = client.get("/metrics").text
    for sock in stalled:
        sock.close()
    refused = sum(s >= 400 for s in statuses)
    print(f"hostile battery: {len(bodies)} tried, {refused} refused, {len(bodies) - refused} accepted, "
          f"worst /health {watch.worst * 1000:.0f} ms")
    assert refused >= 120 and watch.worst < 1.0 and watch.failures == 0
    assert after.status_code == 200 and "dlm_server_slots_held 0.0" in metrics          # nothing leaked
    assert b"Traceback" not in log.read_bytes()


def _battery() -> list:
    base = {"model": "m", "messages": HI, "max_tokens": 8}
    bodies: list = []
    knob_values = {
        "max_tokens": [0, -1, 10**9, "8", 1.5, None, True], "temperature": [-1, 2.5, "0.5", [], {}],
        "top_p": [0, 1.5, -0.1, "x"], "top_k": [0, -5, 2**40, 1.5], "seed": [2**70, -2**70, "1", 1.5],
        "steps": [0, 10**6, -3, "4"], "block_length": [0, -8, 10**9, "8"], "threshold": [0, 1.5, -1, "0.9"],
        "factor": [0, -1, 1e9], "gamma": [-1, 1e9], "cfg_scale": [-1, 1e9], "eps": [0, 1, 5],
        "alg_temp": [-1, 1e9], "kv_cache": ["paged", 3, None], "sampler": ["nope", 3, ""], "alg": ["x", 1],
        "remasking": ["x"], "stop": ["", [""] * 3, ["x" * 300], ["a"] * 40, 5, [1, 2]], "ignore_eos": ["false", 1],
        "logits_eos_inf": ["yes"], "n": [2, 0], "logprobs": [True, 5], "presence_penalty": [0.5, -2],
        "frequency_penalty": [1], "logit_bias": [{"1": 5}], "best_of": [3], "thresold": [0.5], "kvcache": ["dual"],
        "max_token": [8], "temprature": [0.5], "functions": [[{"name": "f"}]], "function_call": ["auto"],
    }
    for name, values in knob_values.items():
        bodies += [{**base, name: v} for v in values]
    bad_messages = [[], [{"role": "wizard", "content": "hi"}], [{"content": "hi"}], ["hi"], [{"role": "user"}],
                    [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
                    [{"role": "user", "content": [{"type": "text", "text": 5}]}], [{"role": "user", "content": 5}],
                    [{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}],
                    [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
                                                                                       "arguments": "{oops"}}]}],
                    "hi", None, [{"role": "user", "content": "x " * 5000}]]
    bodies += [{**base, "messages": m} for m in bad_messages]
    schemas = [{"$ref": "http://169.254.169.254/latest"}, {"$ref": "file:///etc/shadow"}, {"$ref": "#/nope"},
               {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}}}, {"type": "string", "pattern": "("},
               {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}},
               {"type": "object", "minProperties": "two"}, {"type": 5}, [], "string", None,
               {"type": "object", "properties": {"a": {"$dynamicRef": "http://x/y"}}},
               _deep(50), {"properties": {f"p{i}": {} for i in range(6000)}},
               {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(200)}},
               ID_SCOPED, *IN_PLACE_CYCLES, {"type": "string", "pattern": "a{4294967294}"},
               {"type": "string", "pattern": "(x{65535}){65535}"}, {"enum": [{"type": "string"}], "$ref": "#/enum/0"},
               {"$defs": {**{f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(30)},
                          "d30": {}}, "$ref": "#/$defs/d0"},
               {"type": "object", "properties": {"a": {"type": "string", "enum": ["a" * 30 + "!"],
                                                       "anyOf": [{"pattern": "^(a|aa)+$"}] * 200}}}]
    bodies += [{**base, "response_format": schema_format(s)} for s in schemas]
    # Streamed and refused before the stream: more of them than the server's 8 slots.
    bodies += [{**base, "stream": True, "response_format": schema_format(s)}
               for s in [{"$ref": "#/nope"}, ID_SCOPED, *IN_PLACE_CYCLES] * 3]
    bodies += [{**base, "stream": True, "max_tokens": 10**6}, {**base, "stream": True, "messages": [
        {"role": "user", "content": "x " * 450_000}]}]
    props = {f"p{i}": {"type": "string"} for i in range(1600)}
    bodies.append({**base, "tools": [{"type": "function", "function": {
        "name": f"t{j}", "parameters": {"type": "object", "properties": props}}} for j in range(20)]})
    bodies += [{**base, "response_format": f} for f in ({"type": "xml"}, {"type": "json_schema"}, "json", 5,
                                                        {"type": "json_schema", "json_schema": {"schema": 5}})]
    tools = [[{"type": "function"}], [{"type": "function", "function": {"name": ""}}], "tool", [5],
             [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
             [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "https://evil/x"}}}],
             [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                               "properties": {"a": {"$ref": "#/x"}}}}}]]
    bodies += [{**base, "tools": t} for t in tools]
    weather = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                                                                                       "properties": {}}}}]
    bodies += [{**base, "tools": weather, "tool_choice": c} for c in ("nope", {"function": {"name": "x"}}, 5,
                                                                      {"type": "function"}, ["auto"])]
    bodies += [b"", b"{", b"[]", b"null", b'{"messages": "hi"}', b"\xff\xfe", b'{"model": "m", "messages": 5}',
               b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}', b'{"a": ' * 2000,
               json.dumps({**base, "stream": "yes"}).encode(), json.dumps({**base, "stream_options": 5}).encode()]
    bodies += [{**base, "max_tokens": 8, "temperature": 0.5, "seed": s} for s in range(4)]        # benign ones
    bodies += [{**base, "messages": [{"role": "user", "content": c}]} for c in ("\ud800 lone", "\u0000", "x" * 9000)]
    completion = {"model": "m", "max_tokens": 8}
    bodies += [("/v1/completions", {**completion, "prompt": p}) for p in (
        "", [], [[]], [1, 2, -3], [10**9], ["a", "b"], [[1], [2]], 5, None, {"a": 1}, [1.5], "x" * 9000, ["hi"] * 2,
        "x " * 450_000)]
    bodies += [("/v1/completions", {**completion, "stream": True, "prompt": p}) for p in ("x " * 450_000, [10**9])]
    bodies += [("/v1/completions", {**completion, "prompt": "hi", **extra}) for extra in (
        {"echo": True}, {"best_of": 2}, {"suffix": "end"}, {"logprobs": 0}, {"n": 3}, {"max_tokens": 0})]
    return bodies


def _deep(n: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema
