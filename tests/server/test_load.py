"""Load test: 64 concurrent streaming and non-streaming clients against a real ``dlm serve`` process.

Every request must complete (none lost, none refused) and each output must equal the same request run
alone: the engine batches concurrent requests into shared passes without changing anyone's result.
Faulty clients run among them (malformed JSON, oversized bodies, a wrong API key, streams dropped
mid-way) and must get their 4xx or be cleaned up without touching the others.
Runs on the embedded dlm-tiny when it is shipped, else on the tiny test checkpoint.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
httpx = pytest.importorskip("httpx")

from dlm_backend.engine.checkpoint.folder import EMBEDDED_MODEL  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from loadgen import FAULT_STATUSES, chat_once, faulty_clients, launch  # noqa: E402  (benchmarks/loadgen.py)

CLIENTS = 64
PROMPTS = [
    "Hi!", "Who are you?", "What is 7 plus 5?", "Sort these numbers: 42, 7, 19",
    "Reverse this list: apple, pear, plum", "Context:\nAda lives in Oslo.\n\nQuestion: Where does Ada live?",
    "Name 3 colors.", "Thanks!", "What is 12 times 3?", "Count the words: red, blue, green, pink",
    "Give me 2 animals, comma separated.", "Goodbye!", "Compute 40 - 13.", "Hello",
    "Extract the person as JSON: Bo is 30 and lives in Rome.", "What is your name?",
]
KEY = "sk-load-test"
KNOBS = {"max_tokens": 32, "block_length": 32, "sampler": "threshold", "threshold": 0.9, "kv_cache": "dual"}


@pytest.fixture(scope="module")
def server(dream_chat):
    model = EMBEDDED_MODEL if (EMBEDDED_MODEL / "model.safetensors").exists() else dream_chat
    with launch(str(model), "--max-num-seqs", str(CLIENTS), "--api-key", KEY, "--max-body-bytes", "65536") as url:
        yield url


async def test_64_concurrent_clients_complete_and_match_their_solo_runs(server):
    limits = httpx.Limits(max_connections=CLIENTS + 24, max_keepalive_connections=CLIENTS + 24)
    async with httpx.AsyncClient(base_url=server, timeout=600, limits=limits,
                                 headers={"Authorization": f"Bearer {KEY}"}) as client:
        solo = {}
        for prompt in PROMPTS:                       # one at a time: nothing else in the batch
            reply = await chat_once(client, prompt, stream=False, **KNOBS)
            assert reply.status == 200
            solo[prompt] = reply.text
        before = _counters((await client.get("/metrics")).text)
        jobs = [(PROMPTS[i % len(PROMPTS)], i % 2 == 1) for i in range(CLIENTS)]
        replies, bad = await asyncio.gather(asyncio.gather(*(chat_once(client, p, stream=s, **KNOBS) for p, s in jobs)),
                                            faulty_clients(client, **KNOBS))
        # Dropped streams are aborted when their disconnect arrives; one whose client left right after
        # the role chunk may only now be submitted (and aborted), so wait for the queue too.
        for _ in range(100):
            metrics = (await client.get("/metrics")).text
            if "dlm_running_requests 0.0" in metrics and "dlm_queue_depth 0.0" in metrics:
                break
            await asyncio.sleep(0.05)

    assert bad == FAULT_STATUSES * 4

    assert [r.status for r in replies] == [200] * CLIENTS, "every request completes"
    assert all(r.finish_reason in ("stop", "length") for r in replies)
    mismatched = [(p, s, r.text, solo[p]) for (p, s), r in zip(jobs, replies) if r.text != solo[p]]
    assert not mismatched, mismatched[:3]
    streamed = [r for (_, s), r in zip(jobs, replies) if s]
    assert len(streamed) == CLIENTS // 2 and all(r.completion_tokens > 0 for r in streamed)
    assert "dlm_running_requests 0.0" in metrics and "dlm_queue_depth 0.0" in metrics
    # Shared passes: the concurrent phase took far fewer engine steps than its requests' passes (the
    # solo phase, one request per step, is left out: the more confident the model, the fewer
    # passes a request needs and the more the solo phase would dilute the ratio).
    after = _counters(metrics)
    passes, steps = (after[k] - before[k] for k in ("dlm_forward_passes_total", "dlm_engine_steps_total"))
    # Without batching the ratio is 1.0. It depends on how requests arriving over HTTP overlap on
    # 2 cores, so the bar only proves batching: measured 1.97 (329 over 167) with an earlier
    # model, 1.47 (267 over 182) to about 1.6 with s6, whose replies take fewer passes. The
    # throughput figure itself is benchmarks/bench_serving.py's.
    assert passes > 1.2 * steps, (passes, steps)


def _counters(metrics: str) -> dict[str, float]:
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in metrics.splitlines()
                                     if line and not line.startswith("#"))}
