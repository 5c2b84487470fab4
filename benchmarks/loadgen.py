"""A small OpenAI-API load generator, shared by the serving benchmark and the server's load and
hostile-request tests (they put ``benchmarks/`` on ``sys.path``; it is not part of the package).

``launch`` starts ``dlm serve`` as a separate process on a free loopback port (the server's event
loop and the clients must not share a GIL when measuring); ``chat_once`` sends one chat request,
streaming or not, and returns the reply text, completion tokens and finish reason;
``faulty_clients`` sends the bad ones a server must survive beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class Reply:
    status: int
    text: str = ""
    completion_tokens: int = 0
    finish_reason: str | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launch(model: str, *extra: str, startup_timeout: float = 120.0, log: str | None = None):
    """Run ``dlm serve MODEL`` on 127.0.0.1; yields its base URL and stops it afterwards. Its output
    goes to the file ``log`` when given (a test reads it for tracebacks; a pipe nobody reads would
    stall the server once full)."""
    port = free_port()
    dlm = Path(sys.executable).with_name("dlm")
    cmd = [str(dlm)] if dlm.exists() else [sys.executable, "-m", "dlm_backend.cli"]
    out = open(log, "wb") if log else subprocess.PIPE        # noqa: SIM115 - closed when the server stops
    proc = subprocess.Popen([*cmd, "serve", model, "--port", str(port), "--served-model-name", "m", *extra],
                            stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                said = Path(log).read_bytes() if log else proc.stdout.read()
                raise RuntimeError(f"dlm serve exited: {said.decode(errors='replace')[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("dlm serve did not become healthy in time")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log:
            out.close()


async def chat_once(client: httpx.AsyncClient, content: str, stream: bool, **knobs) -> Reply:
    """One chat completion; streamed replies are reassembled from their deltas."""
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "stream": stream, **knobs}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if not stream:
        r = await client.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            return Reply(r.status_code)
        data = r.json()
        return Reply(200, data["choices"][0]["message"]["content"] or "", data["usage"]["completion_tokens"],
                     data["choices"][0]["finish_reason"])
    reply, done = Reply(0), False
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        reply.status = r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            if "error" in event:
                reply.status = 500
            for choice in event.get("choices", []):
                reply.text += choice["delta"].get("content") or ""
                reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
            if event.get("usage"):
                reply.completion_tokens = event["usage"]["completion_tokens"]
    if not done:                    # a stream cut short is a lost request, whatever its status
        reply.status = 0
    return reply


#: What ``faulty_clients`` expects back, per round: malformed JSON, an oversized body (against
#: ``--max-body-bytes 65536``), a wrong API key, a stream dropped after its first chunk (0).
FAULT_STATUSES = [400, 413, 401, 0]


async def faulty_clients(client: httpx.AsyncClient, rounds: int = 4, **knobs) -> list[int]:
    """Bad clients, ``rounds`` of each kind of FAULT_STATUSES; each returns the status it got (0 for a
    stream it dropped on purpose, which the server must abort)."""
    chat = "/v1/chat/completions"
    json_headers = {"content-type": "application/json"}

    async def malformed():
        return (await client.post(chat, content=b'{"messages": [{"role": ', headers=json_headers)).status_code

    async def oversized():
        big = b'{"messages": [{"role": "user", "content": "' + b"x" * 100_000 + b'"}]}'
        return (await client.post(chat, content=big, headers=json_headers)).status_code

    async def wrong_key():
        body = {"messages": [{"role": "user", "content": "hi"}]}
        return (await client.post(chat, json=body, headers={"Authorization": "Bearer nope"})).status_code

    async def dropped_stream():
        body = {"messages": [{"role": "user", "content": "Who are you?"}], "stream": True, **knobs,
                "sampler": "llada", "steps": 32}
        async with client.stream("POST", chat, json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    break             # leave mid-stream: the server must abort the request
        return 0

    return await asyncio.gather(*(job() for job in [malformed, oversized, wrong_key, dropped_stream] * rounds))
