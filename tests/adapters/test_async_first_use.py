"""The first async call for a model loads its weights in a worker thread, never on the event loop.

An 8B checkpoint takes tens of seconds to load; on the loop that would stall every other request.
Each test records the thread that runs the (real) load and compares it with the loop's thread.
"""

import asyncio
import os
import threading

import pytest
from tests.helpers import make_chat_checkpoint

import dlm_backend.engine.checkpoint.load as engine_module

MESSAGES = [{"role": "user", "content": "hi"}]
KNOBS = {"max_tokens": 8, "block_length": 8}


@pytest.fixture
def fresh_model(tmp_path, monkeypatch):
    """A checkpoint at a new path (not loaded yet) and the list of threads that loaded weights."""
    threads, real = [], engine_module.load_model

    def recording_load(*args, **kwargs):
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "load_model", recording_load)
    return str(make_chat_checkpoint(tmp_path / "model", "dream")), threads


def load_thread_vs_loop(call, threads) -> tuple[list[int], int]:
    """Run ``call()`` (a coroutine factory) on a new loop: (the threads that loaded, the loop's thread)."""
    async def main():
        await call()
        return threading.get_ident()
    loop_thread = asyncio.run(main())
    return threads, loop_thread


def assert_loaded_off_the_loop(call, threads) -> None:
    loaders, loop_thread = load_thread_vs_loop(call, threads)
    assert len(loaders) == 1 and loaders[0] != loop_thread


def test_langchain_ainvoke(fresh_model):
    pytest.importorskip("langchain_core")
    from dlm_backend.adapters.langchain import ChatDLM

    path, threads = fresh_model
    assert_loaded_off_the_loop(lambda: ChatDLM(model=path, **KNOBS).ainvoke("hi"), threads)


def test_langchain_astream(fresh_model):
    pytest.importorskip("langchain_core")
    from dlm_backend.adapters.langchain import ChatDLM

    path, threads = fresh_model

    async def consume():
        async for _ in ChatDLM(model=path, **KNOBS).astream("hi"):
            pass
    assert_loaded_off_the_loop(consume, threads)


def test_llamaindex_achat_and_metadata(fresh_model):
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import ChatMessage

    from dlm_backend.adapters.llamaindex import DLM

    path, threads = fresh_model
    llm = DLM(model=path, **KNOBS)
    assert llm.metadata.context_window == 512 and threads == []   # config.json only
    assert_loaded_off_the_loop(lambda: llm.achat([ChatMessage(role="user", content="hi")]), threads)


def test_litellm_acompletion(fresh_model):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    import dlm_backend.adapters.litellm  # noqa: F401  (registers dlm/...)
    import dlm_backend  # noqa: F401  (registers dlm/...)

    path, threads = fresh_model
    assert_loaded_off_the_loop(lambda: litellm.acompletion(model=f"dlm/{path}", messages=MESSAGES, **KNOBS), threads)


def test_lazy_server_first_request(fresh_model):
    httpx = pytest.importorskip("httpx")
    from dlm_backend.server.app import create_app

    path, threads = fresh_model
    app = create_app(path, served_name="m")

    async def post():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            r = await client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **KNOBS})
            assert r.status_code == 200, r.text
    assert_loaded_off_the_loop(post, threads)


def test_a_loading_model_does_not_hold_up_a_loaded_one(fresh_model, dream_chat, monkeypatch):
    import time

    from dlm_backend import LLM

    LLM(str(dream_chat))                                     # loaded before the slow load starts
    started, release = threading.Event(), threading.Event()
    real = engine_module.load_model

    def held_load(*args, **kwargs):
        started.set()
        release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "load_model", held_load)
    path, _ = fresh_model
    loader = threading.Thread(target=LLM, args=(path,))
    loader.start()
    try:
        assert started.wait(10)
        t = time.perf_counter()
        LLM(str(dream_chat))
        assert time.perf_counter() - t < 1.0                 # not the held load's (up to) 10 s
    finally:
        release.set()
        loader.join(10)


#: The bar is 50 ms (measured: 7-31 ms on 2 cores, 160-260 ms before, 1.1-1.7 s for LlamaIndex's aquery
#: and chat engine); a shared 2-core test machine adds scheduling noise, so the test allows 100 ms. The
#: probe builds the application's objects before it measures and leaves out the garbage collector's
#: pauses: inside the window those had reached 80 ms (the agent's tool schemas) and 40-160 ms.
STALL_LIMIT_MS = 100
DOORS = ["langchain_ainvoke", "langchain_astream", "llamaindex_achat", "llamaindex_aquery", "llamaindex_chat_engine",
         "llamaindex_function_agent", "litellm_acompletion"]


@pytest.mark.parametrize("door", DOORS)
def test_no_first_async_call_stalls_the_event_loop(tmp_path, door):
    """A ticking coroutine runs through the door's first call, which loads its model, in a fresh
    process. The loop stalled while the load imported torch._dynamo in a worker thread (the import
    holds the GIL), while LlamaIndex's token counting loaded the weights on the loop, and while a
    request was planned (tokenized) on it."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from dlm_backend.engine.checkpoint.folder import EMBEDDED_MODEL

    pytest.importorskip({"langchain": "langchain_core", "llamaindex": "llama_index.core",
                         "litellm": "litellm"}[door.split("_")[0]])
    model = shutil.copytree(EMBEDDED_MODEL, tmp_path / "dlm-tiny")    # its window holds LlamaIndex's prompts
    probe = Path(__file__).with_name("stall_probe.py")
    out = subprocess.run([sys.executable, str(probe), door, str(model)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    stall = float(out.stdout.strip().splitlines()[-1])
    assert stall < STALL_LIMIT_MS, f"{door}: the loop stalled {stall:.0f} ms"


def test_a_request_is_planned_off_the_loop(dream_chat, monkeypatch):
    """Planning tokenizes the prompt and renders the template (and the first request of a model
    measures its vocabulary): chat.acomplete did it on the event loop."""
    from dlm_backend import LLM, chat

    threads, real = [], chat.Plan.__init__

    def recording(self, *args, **kwargs):
        threads.append(threading.get_ident())
        real(self, *args, **kwargs)

    monkeypatch.setattr(chat.Plan, "__init__", recording)
    llm = LLM(str(dream_chat))
    request = chat.ChatRequest(MESSAGES, llm.sampling_params(**KNOBS))

    async def main():
        await chat.acomplete(llm, request)
        async for _ in chat.astream(llm, request):
            pass
        return threading.get_ident()
    loop_thread = asyncio.run(main())
    assert len(threads) == 2 and loop_thread not in threads
