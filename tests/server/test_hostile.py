"""Hostile requests against a real ``dlm serve`` process, ``/health`` watched the whole time.

Each known attack gets its own test (SSRF and file reads through ``$ref``, ReDoS, unbounded ``steps``,
a 30,000-property schema, an unresolvable ``$ref``, references that resolve only from the root or
cycle in place, a backtracking value pinned by ``enum``, 900 KB prompts, 20 tools of 1,600
properties, a streaming burst past the queue, huge ``cfg_scale``, infinite floats, reading another
client's cached prefixes off ``/metrics``, a burst larger than the KV cache, tool-call arguments
nested 5,000 deep, a stop string of U+FFFD, a request larger than the KV cache), then a battery
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
from loadgen import chat_once, free_port, launch  # noqa: E402  (benchmarks/loadgen.py)
from tests.helpers import make_block_chat_checkpoint  # noqa: E402

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
SCRAPER = {"Authorization": "Bearer sk-scraper"}          # the served process's metrics key


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
    folder = tmp_path_factory.mktemp("hostile")
    log, key = folder / "serve.log", folder / "metrics-key"
    key.write_text("sk-scraper\n")
    with launch(str(dream_chat), "--max-num-seqs", "4", "--max-waiting", "4", "--metrics-key-file", str(key),
                log=str(log)) as url:
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


def test_metrics_are_the_scrapers_alone(server):
    """/metrics was open to every client of a server without an API key, and its prefix cache counters
    told whether another client's prompt prefix was cached (+46 hits for a known system prompt, +0 for
    an unseen one); with a metrics key, only the scraper reads them."""
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": ""}):
        assert_openai_error(httpx.get(server + "/metrics", headers=headers), 401)
    assert "dlm_prefix_cache_hits_total" in httpx.get(server + "/metrics", headers=SCRAPER).text
    assert chat(server).status_code == 200                          # the API itself stays open on loopback


DEEP_ARGUMENTS = ["[" * 5000 + "]" * 5000, '{"a": ' * 3000 + "1" + "}" * 3000]


@pytest.mark.parametrize("stream", [False, True])
def test_deeply_nested_tool_call_arguments_are_400s(served, stream):
    """10 KB of '[' * 5000 was a 500 (RecursionError) and a traceback in the server's log."""
    server, log = served
    for deep in DEEP_ARGUMENTS:
        turns = [*HI, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
        assert_openai_error(chat(server, messages=turns, stream=stream),
                            param="messages[1].tool_calls[0].function.arguments")
    assert b"RecursionError" not in log.read_bytes()


@pytest.mark.parametrize("stream", [False, True])
def test_a_replacement_character_stop_is_matched_on_whole_characters(server, stream):
    """A stop of "\ufffd" matched a character cut between two passes, which decodes to U+FFFD until its
    last byte arrives ("café naïve 東京 😀 done" stopped at "café naïve "). The tiny model writes stray
    bytes: each reply with the stop is the reply without it, up to its first real U+FFFD."""
    async def replies():
        async with httpx.AsyncClient(base_url=server, timeout=60) as client:
            knobs = {"max_tokens": 32, "sampler": "llada", "block_length": 8, "ignore_eos": True, "temperature": 0}
            return [(await chat_once(client, f"question {i}", False, **knobs),
                     await chat_once(client, f"question {i}", stream, stop=["\ufffd"], **knobs)) for i in range(8)]
    for full, cut in asyncio.run(replies()):
        text = full.text[:full.text.find("\ufffd")] if "\ufffd" in full.text else full.text
        assert (cut.status, cut.text, cut.finish_reason) == (200, text, "stop" if "\ufffd" in full.text
                                                             else full.finish_reason)


# -- a KV cache that holds one request at a time --------------------------------------------------


@pytest.fixture(scope="module")
def paged(tmp_path_factory):
    """The issue's setup at a small scale: sdar-tiny with 1 MiB of KV pages (85); a request of 134
    prompt + 600 new tokens takes 48 of them, so one runs though 16 may; 2 may wait."""
    folder = make_block_chat_checkpoint(tmp_path_factory.mktemp("paged") / "sdar", "sdar")
    with launch(str(folder), "--kv-cache-memory", "1048576", "--max-num-seqs", "16", "--max-waiting", "2",
                "--max-tokens-limit", "1024", log=str(folder.parent / "serve.log")) as url:
        yield url, folder.parent / "serve.log"


def big(i: int, **extra) -> dict:
    prompt = [10 + i] + [5 + j % 200 for j in range(133)]          # its own first page: nothing shared
    return {"model": "m", "prompt": prompt, "max_tokens": 600, "sampler": "sdar", "block_length": 64, "steps": 32,
            "ignore_eos": True, **extra}


def gauge(metrics: str, name: str) -> float:
    return float(next(line for line in metrics.splitlines() if line.startswith(name + " ")).split()[1])


def test_back_pressure_follows_the_kv_pages(paged):
    """8 requests at once (half streamed) and 2 clients hanging up after their first event: none was
    refused and 15 waited under --max-waiting 6 at full scale. Now at most 2 wait for pages, the
    rest are 429s before any 200, no stream fails, and every answer equals its solo run."""
    url, log = paged
    seen, stop = [], threading.Event()

    def watch():                       # (running, waiting): 1 fits the pages, 2 may wait
        with httpx.Client(base_url=url, timeout=5) as client:
            while not stop.is_set():
                metrics = client.get("/metrics").text
                seen.append((gauge(metrics, "dlm_running_requests"), gauge(metrics, "dlm_queue_depth")))
                stop.wait(0.02)

    async def one(client, i):
        stream = i % 2 == 1 or i >= 8
        async with client.stream("POST", "/v1/completions", json=big(i, stream=stream)) as r:
            body = ""
            async for line in r.aiter_lines():
                body += line + "\n"
                if i >= 8 and line.startswith("data:"):
                    break                                            # hangs up after its first event
        if not stream and r.status_code == 200:
            return r.status_code, json.loads(body)["choices"][0]["text"], r.headers.get("retry-after")
        events = [json.loads(x[6:]) for x in body.splitlines() if x.startswith("data: {")]
        assert not any("error" in e for e in events), body
        return r.status_code, "".join(c["text"] for e in events for c in e["choices"]), r.headers.get("retry-after")

    async def burst():
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(10)))
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        replies = asyncio.run(burst())
    finally:
        stop.set()
        watcher.join()
    assert max(r for r, _ in seen) <= 1 and max(r + w for r, w in seen) <= 3, seen
    refused = [(status, retry) for status, _, retry in replies if status != 200]
    assert len(refused) >= 3 and all(s == 429 and retry == "1" for s, retry in refused), replies
    for i, (status, text, _) in enumerate(replies[:8]):
        if status == 200:
            assert text == httpx.post(url + "/v1/completions", json=big(i), timeout=120).json()["choices"][0]["text"]
    assert gauge(httpx.get(url + "/metrics").text, "dlm_server_slots_held") == 0
    assert b"Traceback" not in log.read_bytes()


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_larger_than_the_kv_cache_names_the_flag(paged, stream):
    r = httpx.post(paged[0] + "/v1/completions", json=big(0, prompt=[7] * 400, max_tokens=1000, stream=stream),
                   timeout=60)
    assert_openai_error(r)
    assert "the whole cache holds 85" in r.text and "--kv-cache-memory" in r.json()["error"]["message"]


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
        metrics = client.get("/metrics", headers=SCRAPER).text
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
                    *([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
                                                                                         "arguments": deep}}]}]
                      for deep in DEEP_ARGUMENTS),
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


def test_a_cache_salt_keeps_one_tenants_prompt_pages_from_anothers(paged):
    """A prompt's pages are shared only under the same cache_salt: a second tenant sending the same
    prompt neither reuses nor learns of the first's (its hit counter stays put)."""
    url, _ = paged
    prompt = [7] * 134                                              # 8 full pages of 16 (blocks of 4)
    hits = []
    for salt in ("tenant-a", "tenant-a", "tenant-b", None):
        before = gauge(httpx.get(url + "/metrics").text, "dlm_prefix_cache_hits_total")
        body = {"model": "m", "prompt": prompt, "max_tokens": 8, "sampler": "sdar", "ignore_eos": True,
                **({"cache_salt": salt} if salt else {})}
        assert httpx.post(url + "/v1/completions", json=body, timeout=120).status_code == 200
        hits.append(gauge(httpx.get(url + "/metrics").text, "dlm_prefix_cache_hits_total") - before)
    assert hits == [0, 8, 0, 0]
    assert_openai_error(httpx.post(url + "/v1/completions", json={**body, "cache_salt": "x" * 257}), 400, "cache_salt")
