"""The first async call for a model loads its weights in a worker thread, never on the event loop.

Loading is made slow (0.6 s) so that a load on the loop would show as a gap between the ticks of
a task that runs beside the call; an 8B checkpoint takes tens of seconds. Each test first makes
the same call on a model already loaded, so the framework's own first-call work (imports, tracer
set-up: up to 0.4 s for LangChain) is not counted.
"""

import asyncio
import os
import time

import pytest
from helpers import make_chat_checkpoint

import dlm_backend.engine.engine as engine_module

LOAD_S = 0.6
MESSAGES = [{"role": "user", "content": "hi"}]
KNOBS = {"max_tokens": 8, "block_length": 8}


@pytest.fixture
def slow_fresh_model(tmp_path, monkeypatch) -> str:
    real = engine_module.load_model

    def slow_load(*args, **kwargs):
        time.sleep(LOAD_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "load_model", slow_load)
    return str(make_chat_checkpoint(tmp_path / "model", "dream"))    # a new path: not loaded yet


def longest_stall(call, warm_up) -> float:
    """Run ``call()`` (a coroutine factory) beside a 10 ms ticker; the longest gap between ticks.
    ``warm_up()``, the same call on a loaded model, runs first and is not measured."""
    async def main():
        await warm_up()
        gaps, done = [], asyncio.Event()

        async def tick():
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.02)
        await call()
        done.set()
        await ticker
        return max(gaps)
    return asyncio.run(main())


def test_langchain_ainvoke(slow_fresh_model, dream_chat):
    pytest.importorskip("langchain_core")
    from dlm_backend.adapters.langchain import ChatDLM

    model, loaded = ChatDLM(model=slow_fresh_model, **KNOBS), ChatDLM(model=str(dream_chat), **KNOBS)
    assert longest_stall(lambda: model.ainvoke("hi"), lambda: loaded.ainvoke("hi")) < LOAD_S / 2


def test_langchain_astream_first(slow_fresh_model, dream_chat):
    pytest.importorskip("langchain_core")
    from dlm_backend.adapters.langchain import ChatDLM

    def consume(path):
        async def run():
            async for _ in ChatDLM(model=path, **KNOBS).astream("hi"):
                pass
        return run
    assert longest_stall(consume(slow_fresh_model), consume(str(dream_chat))) < LOAD_S / 2


def test_llamaindex_achat(slow_fresh_model, dream_chat):
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import ChatMessage

    from dlm_backend.adapters.llamaindex import DLM

    llm, loaded = DLM(model=slow_fresh_model, **KNOBS), DLM(model=str(dream_chat), **KNOBS)
    hi = [ChatMessage(role="user", content="hi")]
    assert longest_stall(lambda: llm.achat(hi), lambda: loaded.achat(hi)) < LOAD_S / 2


def test_litellm_acompletion(slow_fresh_model, dream_chat):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    import dlm_backend  # noqa: F401  (registers dlm/...)

    def call(path):
        return lambda: litellm.acompletion(model=f"dlm/{path}", messages=MESSAGES, **KNOBS)
    assert longest_stall(call(slow_fresh_model), call(dream_chat)) < LOAD_S / 2


def test_lazy_server_first_request(slow_fresh_model, dream_chat):
    httpx = pytest.importorskip("httpx")
    from dlm_backend.server.app import create_app

    def post(path):
        app = create_app(str(path))

        async def run():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                r = await client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **KNOBS})
                assert r.status_code == 200, r.text
        return run
    warm = post(dream_chat)
    asyncio.run(warm())                  # loads dream_chat here, off the measured loop
    assert longest_stall(post(slow_fresh_model), warm) < LOAD_S / 2
