"""The first async call for a model loads its weights in a worker thread, never on the event loop.

Loading is made slow (0.6 s) so that a load on the loop would show as a gap between the ticks of
a task that runs beside the call; an 8B checkpoint takes tens of seconds.
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


def longest_stall(call) -> float:
    """Run ``call()`` (a coroutine factory) beside a 10 ms ticker; the longest gap between ticks."""
    async def main():
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


def test_langchain_ainvoke(slow_fresh_model):
    pytest.importorskip("langchain_core")
    from dlm_backend.adapters.langchain import ChatDLM

    model = ChatDLM(model=slow_fresh_model, **KNOBS)
    assert longest_stall(lambda: model.ainvoke("hi")) < LOAD_S / 2


def test_langchain_astream_first(slow_fresh_model):
    pytest.importorskip("langchain_core")
    from dlm_backend.adapters.langchain import ChatDLM

    async def consume():
        async for _ in ChatDLM(model=slow_fresh_model, **KNOBS).astream("hi"):
            pass
    assert longest_stall(consume) < LOAD_S / 2


def test_llamaindex_achat(slow_fresh_model):
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import ChatMessage

    from dlm_backend.adapters.llamaindex import DLM

    llm = DLM(model=slow_fresh_model, **KNOBS)
    assert longest_stall(lambda: llm.achat([ChatMessage(role="user", content="hi")])) < LOAD_S / 2


def test_litellm_acompletion(slow_fresh_model):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    import dlm_backend  # noqa: F401  (registers dlm/...)

    call = lambda: litellm.acompletion(model=f"dlm/{slow_fresh_model}", messages=MESSAGES, **KNOBS)  # noqa: E731
    assert longest_stall(call) < LOAD_S / 2


def test_lazy_server_first_request(slow_fresh_model):
    httpx = pytest.importorskip("httpx")
    from dlm_backend.server.app import create_app

    app = create_app(slow_fresh_model)

    async def post():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            r = await client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **KNOBS})
            assert r.status_code == 200, r.text
    assert longest_stall(post) < LOAD_S / 2
