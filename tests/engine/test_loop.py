"""Driving the engine (engine/loop.py) from threads and event loops: callers share passes, async
callers never block their loop, aborts and closes end requests with a final chunk, and a consumer
that fails does not stop the others."""

import asyncio
import json
import queue
import time

import pytest
from tests.helpers import PARITY

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.engine import LLMEngine
from dlm_backend.engine.loop import EngineLoop
from dlm_backend.errors import DLMError

PROMPT = json.loads((PARITY / "llada-tiny" / "cases.json").read_text())["cases"][0]["prompt"]
PROMPTS = [PROMPT, PROMPT[:4], PROMPT[2:] + [7, 8, 9, 10, 11, 12, 13]]
PARAMS = SamplingParams(sampler="llada", max_tokens=16, block_length=8, ignore_eos=True)


@pytest.fixture
def loop():
    """A loop over an engine of its own (not the shared one every LLM handle uses)."""
    loop = EngineLoop(LLMEngine(EngineConfig(model=str(PARITY / "llada-tiny"))))
    yield loop
    loop.close()


def test_close_ends_every_request_with_an_abort_and_refuses_new_ones(loop):
    got = {i: queue.Queue() for i in range(2)}
    ids = [loop.submit(p, PARAMS, got[i].put) for i, p in enumerate(PROMPTS[:2])]
    loop.step()
    assert loop.engine.num_running == 2
    loop.close()
    final = [list(got[i].queue)[-1] for i in range(2)]
    assert [(c.request_id, c.finished, c.finish_reason) for c in final] == [(i, True, "abort") for i in ids]
    assert final[0].output.num_forward_passes == 1
    loop.close()                                            # twice is fine
    with pytest.raises(DLMError, match="This engine was closed"):
        loop.submit(PROMPT, PARAMS, lambda chunk: None)
    loop.step()                                             # a step after close does nothing


def test_a_failing_consumer_does_not_stop_the_others(loop, caplog):
    def broken(chunk):
        raise RuntimeError("consumer went away")

    ok = queue.Queue()
    loop.submit(PROMPTS[0], PARAMS, broken)
    loop.submit(PROMPTS[1], PARAMS, ok.put)
    chunks = list(loop.drive(ok))
    alone = LLM(str(PARITY / "llada-tiny")).generate(prompt_token_ids=[PROMPTS[1]], sampling_params=PARAMS)[0]
    assert chunks[-1].finished and chunks[-1].output.token_ids == alone.token_ids
    assert "consumer went away" in caplog.text
    assert not loop.engine.has_unfinished                   # the broken one's request ran to its end too


def test_a_background_request_finishes_without_its_caller_driving(loop):
    got = queue.Queue()
    loop.submit(PROMPT, PARAMS, got.put, background=True)
    chunks = []
    while not chunks or not chunks[-1].finished:
        chunks.append(got.get(timeout=30))                  # only waits: the loop's thread steps
    assert len(chunks[-1].output.token_ids) == 16


def test_async_api_does_not_block_the_event_loop(dream_chat):
    llm = LLM(str(dream_chat))
    params = SamplingParams(sampler="llada", max_tokens=32, block_length=8, ignore_eos=True)
    messages = [{"role": "user", "content": "hello"}]

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        out = await llm.achat(messages, params)
        streamed = [c async for c in llm.astream_chat(messages, params)]
        many = await asyncio.gather(*(llm.achat(messages, params) for _ in range(4)))
        task.cancel()
        return ticks, out, streamed, many

    ticks, out, streamed, many = asyncio.run(main())
    assert ticks > 5
    assert out.text == llm.chat(messages, params).text == streamed[-1].output.text
    assert all(m.token_ids == out.token_ids for m in many)


def test_abandoned_stream_frees_its_slot(dream_chat):
    llm = LLM(str(dream_chat))
    stream = llm.stream_chat([{"role": "user", "content": "hi"}],
                             SamplingParams(sampler="llada", max_tokens=64, block_length=8, ignore_eos=True))
    next(stream)
    stream.close()
    for _ in range(200):
        if not llm.engine.has_unfinished:
            break
        time.sleep(0.01)
    assert not llm.engine.has_unfinished


def test_concurrent_threads_share_forward_passes(monkeypatch):
    import threading

    llm = LLM(str(PARITY / "llada-tiny"))
    params = SamplingParams(sampler="llada", max_tokens=16, block_length=8, ignore_eos=True)
    solo = [llm.generate(prompt_token_ids=[p], sampling_params=params)[0].token_ids for p in PROMPTS]
    steps = []
    original = llm.engine.runner.step
    monkeypatch.setattr(llm.engine.runner, "step", lambda batch: (steps.append(len(batch)), original(batch)))
    results = {}
    barrier = threading.Barrier(len(PROMPTS))

    def worker(i):
        barrier.wait()
        results[i] = llm.generate(prompt_token_ids=[PROMPTS[i]], sampling_params=params)[0].token_ids

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(PROMPTS))] == solo
    assert max(steps) > 1 and len(steps) < 16 * len(PROMPTS)     # passes were shared


def test_request_aborted_by_another_thread_returns_abort():
    import threading

    llm = LLM(str(PARITY / "llada-tiny"))
    params = SamplingParams(sampler="llada", max_tokens=256, block_length=8, ignore_eos=True)
    seen = []
    original = llm.engine.runner.step

    def step(batch):
        seen.extend(s.request_id for s in batch.seqs)
        original(batch)

    llm.engine.runner.step = step
    try:
        timer = threading.Timer(0.2, lambda: llm._loop.abort(seen[0]))
        timer.start()
        out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0]
        timer.join()
    finally:
        del llm.engine.runner.step
    assert out.finish_reason == "abort" and out.num_forward_passes < 256
    assert not llm.engine.has_unfinished


def test_submit_and_abort_wait_for_the_pass_in_flight_not_for_later_ones(loop, monkeypatch):
    """A background stepper released the state lock and took it again before a waiting thread
    woke, so an abort waited up to 4.9 s behind 50 ms passes on 2 cores. Counted in passes, not
    seconds: between asking and getting in, at most one new pass may start."""
    original, passes = loop.engine.runner.step, []

    def slow_step(seqs):
        passes.append(1)
        time.sleep(0.01)
        return original(seqs)

    monkeypatch.setattr(loop.engine.runner, "step", slow_step)
    long = PARAMS.replace(max_tokens=64, block_length=8, steps=64)
    waited = []
    for _ in range(12):
        running = loop.submit(PROMPT, long, lambda chunk: None, background=True)
        while len(passes) < 2:                              # the stepper is busy
            time.sleep(0.001)
        before = len(passes)
        late = loop.submit(PROMPTS[1], long, lambda chunk: None, background=True)
        waited.append(len(passes) - before)
        before = len(passes)
        loop.abort(running)
        loop.abort(late)
        waited.append(len(passes) - before)
        passes.clear()
    assert max(waited) <= 1, waited
    assert not loop.engine.has_unfinished
