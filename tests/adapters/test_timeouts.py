"""A caller's timeout at every front door: the request is aborted (its engine slot freed) and the
framework's own timeout error is raised, soon after the timeout rather than when the answer is done.

``ChatDLM(timeout=0.5)`` and ``litellm.completion(..., timeout=0.5)`` were accepted and ignored (the
LiteLLM call returned after 23 s). The reference integrations raise: ChatOpenAI and LlamaIndex's
OpenAI LLM an ``openai.APITimeoutError``, LiteLLM's providers ``litellm.Timeout``. Here LangChain and
LlamaIndex get a ``TimeoutError`` (RequestTimeoutError) and LiteLLM its ``litellm.Timeout``.
"""

import asyncio
import gc
import os
import time

import pytest
from tests.helpers import make_chat_checkpoint

from dlm_backend import LLM

TIMEOUT = 0.3
#: 128 passes of at least 50 ms each: over 6 s unless the timeout stops it.
SLOW = {"max_tokens": 128, "block_length": 8, "sampler": "llada", "steps": 128, "ignore_eos": True}
#: What "soon after the timeout" allows on a busy machine: a pass in flight, the abort, the raise. On
#: 2 cores they take 0.32-0.54 s. The 1-4 s outliers seen inside the whole suite were aborts starved
#: of the engine's lock by its stepping thread (engine/loop.py, StateLock).
RAISED_WITHIN = 2.0


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    """A checkpoint of its own whose engine sleeps 50 ms per pass (the other tests' engines are untouched)."""
    path = str(make_chat_checkpoint(tmp_path_factory.mktemp("slow") / "model", "dream"))
    llm = LLM(path)                                   # held, so every front door shares this engine
    engine = llm.engine
    original = engine.runner.step

    def slow_step(seqs):
        time.sleep(0.05)
        return original(seqs)

    engine.runner.step = slow_step
    yield path, engine
    engine.runner.step = original
    llm.close()


def assert_aborted_in_time(call, error, engine):
    """``call()`` raises ``error`` within RAISED_WITHIN s, and the engine holds nothing afterwards."""
    aborted = engine.stats.finished["abort"]
    gc.collect()              # a full collection of the suite's heap is not the front door's latency
    started = time.monotonic()
    with pytest.raises(error) as raised:
        call()
    elapsed = time.monotonic() - started
    assert elapsed < RAISED_WITHIN, f"raised {elapsed:.2f} s after the call, for a {TIMEOUT} s timeout"
    assert not engine.has_unfinished                  # the slot is free at once, not when the answer ends
    assert engine.stats.finished["abort"] == aborted + 1
    return raised.value


def test_llm_methods_take_a_timeout(slow_model):
    from dlm_backend.errors import RequestTimeoutError

    path, engine = slow_model
    llm = LLM(path)
    params = llm.sampling_params(**SLOW)
    hi = [{"role": "user", "content": "hi"}]
    assert_aborted_in_time(lambda: llm.chat(hi, params, timeout=TIMEOUT), RequestTimeoutError, engine)
    assert_aborted_in_time(lambda: list(llm.stream_chat(hi, params, timeout=TIMEOUT)), RequestTimeoutError, engine)
    assert_aborted_in_time(lambda: asyncio.run(llm.achat(hi, params, timeout=TIMEOUT)), RequestTimeoutError, engine)
    with pytest.raises(TimeoutError):                 # a TimeoutError: generic retry policies catch it
        llm.generate("hi", params, timeout=0)
    assert llm.chat(hi, llm.sampling_params(max_tokens=8, block_length=8), timeout=60).finish_reason
    llm.close()


@pytest.mark.parametrize("how", ["invoke", "ainvoke", "stream", "astream", "per_call"])
def test_langchain_timeout(slow_model, how):
    pytest.importorskip("langchain_core")
    from dlm_backend.adapters.langchain import ChatDLM

    path, engine = slow_model
    model = ChatDLM(model=path, timeout=TIMEOUT, **SLOW)

    async def astream():
        return [c async for c in model.astream("hi")]
    calls = {"invoke": lambda: model.invoke("hi"), "ainvoke": lambda: asyncio.run(model.ainvoke("hi")),
             "stream": lambda: list(model.stream("hi")), "astream": lambda: asyncio.run(astream()),
             "per_call": lambda: ChatDLM(model=path, **SLOW).invoke("hi", timeout=TIMEOUT)}
    error = assert_aborted_in_time(calls[how], TimeoutError, engine)
    assert f"timeout of {TIMEOUT:g} s" in str(error)
    model.close()


@pytest.mark.parametrize("how", ["chat", "achat", "stream_chat", "complete"])
def test_llamaindex_timeout(slow_model, how):
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import ChatMessage

    from dlm_backend.adapters.llamaindex import DLM

    path, engine = slow_model
    llm = DLM(model=path, timeout=TIMEOUT, **SLOW)
    hi = [ChatMessage(role="user", content="hi")]
    calls = {"chat": lambda: llm.chat(hi), "achat": lambda: asyncio.run(llm.achat(hi)),
             "stream_chat": lambda: list(llm.stream_chat(hi)), "complete": lambda: llm.complete("hi")}
    assert_aborted_in_time(calls[how], TimeoutError, engine)
    llm.close()


@pytest.mark.parametrize("how", ["completion", "acompletion", "stream", "astream"])
def test_litellm_timeout_is_litellm_timeout(slow_model, how):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    import dlm_backend.adapters.litellm  # noqa: F401  (registers dlm/...)

    path, engine = slow_model
    kwargs = dict(model=f"dlm/{path}", messages=[{"role": "user", "content": "hi"}], timeout=TIMEOUT, **SLOW)

    async def astream():
        return [c async for c in await litellm.acompletion(stream=True, **kwargs)]
    calls = {"completion": lambda: litellm.completion(**kwargs),
             "acompletion": lambda: asyncio.run(litellm.acompletion(**kwargs)),
             "stream": lambda: list(litellm.completion(stream=True, **kwargs)), "astream": lambda: asyncio.run(astream())}
    error = assert_aborted_in_time(calls[how], litellm.Timeout, engine)
    assert error.status_code == 408 and error.llm_provider == "dlm"
