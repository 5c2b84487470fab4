"""Load test: 64 concurrent streaming and non-streaming clients against a real ``dlm serve`` process.

Every request must complete (none lost, none refused) and each output must equal the same request run
alone: the engine batches concurrent requests into shared passes without changing anyone's result.
Runs on the embedded dlm-tiny when it is shipped, else on the tiny test checkpoint.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
httpx = pytest.importorskip("httpx")

from dlm_backend.engine.loader import EMBEDDED_MODEL  # noqa: E402
from dlm_backend.server.loadgen import chat_once, launch  # noqa: E402

CLIENTS = 64
PROMPTS = [
    "Hi!", "Who are you?", "What is 7 plus 5?", "Sort these numbers: 42, 7, 19",
    "Reverse this list: apple, pear, plum", "Context:\nAda lives in Oslo.\n\nQuestion: Where does Ada live?",
    "Name 3 colors.", "Thanks!", "What is 12 times 3?", "Count the words: red, blue, green, pink",
    "Give me 2 animals, comma separated.", "Goodbye!", "Compute 40 - 13.", "Hello",
    "Extract the person as JSON: Bo is 30 and lives in Rome.", "What is your name?",
]
KNOBS = {"max_tokens": 32, "block_length": 32, "sampler": "threshold", "threshold": 0.9, "kv_cache": "dual"}


@pytest.fixture(scope="module")
def server(dream_chat):
    model = EMBEDDED_MODEL if (EMBEDDED_MODEL / "model.safetensors").exists() else dream_chat
    with launch(str(model), "--max-num-seqs", str(CLIENTS)) as url:
        yield url


async def test_64_concurrent_clients_complete_and_match_their_solo_runs(server):
    limits = httpx.Limits(max_connections=CLIENTS + 8, max_keepalive_connections=CLIENTS + 8)
    async with httpx.AsyncClient(base_url=server, timeout=600, limits=limits) as client:
        solo = {}
        for prompt in PROMPTS:                       # one at a time: nothing else in the batch
            reply = await chat_once(client, prompt, stream=False, **KNOBS)
            assert reply.status == 200
            solo[prompt] = reply.text
        jobs = [(PROMPTS[i % len(PROMPTS)], i % 2 == 1) for i in range(CLIENTS)]
        replies = await asyncio.gather(*(chat_once(client, p, stream=s, **KNOBS) for p, s in jobs))
        metrics = (await client.get("/metrics")).text

    assert [r.status for r in replies] == [200] * CLIENTS, "every request completes"
    assert all(r.finish_reason in ("stop", "length") for r in replies)
    mismatched = [(p, s, r.text, solo[p]) for (p, s), r in zip(jobs, replies) if r.text != solo[p]]
    assert not mismatched, mismatched[:3]
    streamed = [r for (_, s), r in zip(jobs, replies) if s]
    assert len(streamed) == CLIENTS // 2 and all(r.completion_tokens > 0 for r in streamed)
    assert "dlm_running_requests 0.0" in metrics and "dlm_queue_depth 0.0" in metrics
    # Shared passes: the 64 concurrent requests needed far fewer engine steps than request passes.
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line and not line.startswith("#"))
    assert float(values["dlm_forward_passes_total"]) > 2 * float(values["dlm_engine_steps_total"])
