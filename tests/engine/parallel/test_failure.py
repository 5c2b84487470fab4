"""A tensor-parallel engine that loses a worker fails its requests at once, stays failed and says so
(the server's /health too); a size the model cannot split by is refused on every rank. No hangs."""

import pytest
from fastapi.testclient import TestClient
from tests.helpers import FIXTURES, PARITY

from dlm_backend import LLM
from dlm_backend.errors import DLMError, EngineError
from dlm_backend.server import create_app
from dlm_backend.server.settings import ServerConfig

LLADA, SDAR = PARITY / "llada-tiny", FIXTURES / "parity-block" / "sdar-tiny"
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32], [40, 41, 42]]


def _llm(folder, **kw) -> LLM:
    return LLM(str(folder), device="cpu", dtype="float32", tensor_parallel_size=2, **kw)


def _greedy(llm: LLM, **kw):
    return llm.sampling_params(temperature=0.0, ignore_eos=True, **kw)


def test_a_dying_worker_fails_the_requests_in_flight_and_the_engine_stays_failed():
    llm = _llm(LLADA)
    try:
        engine = llm.engine
        params = _greedy(llm, max_tokens=32)
        running = [engine.add_request(p, params).request_id for p in PROMPTS]
        engine.step()
        assert engine.failure is None
        worker = engine.workers.procs[0]
        worker.kill()
        worker.wait()
        chunks = engine.step()
        assert sorted(c.request_id for c in chunks if c.finished) == sorted(running)
        assert all("lost a worker" in c.error and "exited with code -9" in c.error for c in chunks)
        with pytest.raises(EngineError, match="lost a worker: worker rank 1"):
            engine.add_request(PROMPTS[0], params)
        with pytest.raises(EngineError, match="restart it"):
            llm.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=params)
    finally:
        llm.close()                                    # returns at once: nothing waits for the dead rank


def test_a_peer_lost_inside_a_collective_fails_the_step_instead_of_hanging():
    llm = _llm(SDAR)
    try:
        engine = llm.engine
        worker = engine.workers.procs[0]
        worker.kill()
        worker.wait()
        engine.workers.dead = lambda: None             # not noticed before the broadcast: gloo's error is the signal
        engine.add_request(PROMPTS[0], _greedy(llm, max_tokens=8))
        chunk = engine.step()[0]
        assert chunk.finished and "lost a worker: a rank lost contact" in chunk.error
    finally:
        llm.close()


def test_a_size_the_model_cannot_split_by_is_a_clear_error_on_every_rank():
    with pytest.raises(DLMError, match=r"tensor_parallel_size=3 must divide the attention heads \(4\)"):
        LLM(str(LLADA), device="cpu", dtype="float32", tensor_parallel_size=3)
    with pytest.raises(DLMError, match=r"tensor_parallel_size=3 must divide the attention heads \(4\)"):
        LLM(str(FIXTURES / "parity-block" / "diffusiongemma-tiny"), device="cpu", dtype="float32",
            tensor_parallel_size=3)
    with pytest.raises(DLMError, match="tensor_parallel_size must be an integer >= 1"):
        LLM(str(LLADA), device="cpu", dtype="float32", tensor_parallel_size=0)
    _llm(LLADA).close()                                 # the failed starts left nothing behind


def test_a_family_not_built_from_the_parallel_layers_is_refused_by_name(monkeypatch):
    """A plugin family of plain layers (the default) would load whole on each rank with one rank's
    KV heads: refused before any worker starts."""
    from dlm_backend.engine.models.llada import LLaDAModelLM

    monkeypatch.setattr(LLaDAModelLM, "tensor_parallel", False)
    with pytest.raises(DLMError, match="LLaDAModelLM does not split over devices yet"):
        LLM(str(LLADA), device="cpu", dtype="float32", tensor_parallel_size=2)


def test_the_server_reports_unhealthy_and_answers_503_once_a_worker_is_gone():
    app = create_app(config=ServerConfig(model=str(SDAR), device="cpu", dtype="float32", tensor_parallel_size=2,
                                         allowed_hosts=None))
    with TestClient(app) as client:
        app.state.llm()
        body = {"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0}
        assert client.post("/v1/completions", json=body).status_code == 200
        assert client.get("/health").json() == {"status": "ok"}
        worker = app.state.served.loaded.engine.workers.procs[0]
        worker.kill()
        worker.wait()
        health = client.get("/health")
        assert health.status_code == 503 and "lost a worker" in health.json()["detail"]
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 503 and "lost a worker" in r.json()["error"]["message"]


def test_a_worker_that_fails_to_start_is_a_clear_error_at_once(monkeypatch):
    """Before joining the group, a worker's error reaches rank 0 over the store (here: a spec its
    config rejects); a worker that exits without a word is named with its exit code. Neither waits
    for the group's rendezvous (COLLECTIVE_TIMEOUT_S, 30 min)."""
    import sys
    import time

    from dlm_backend.engine.forward import workers

    real = workers._worker_command
    monkeypatch.setattr(workers, "_worker_command", lambda spec, *a: real(spec.replace('"float32"', '"float64"'), *a))
    start = time.monotonic()
    with pytest.raises(DLMError, match="worker 1 failed to start: dtype 'float64' is not supported"):
        _llm(LLADA)
    monkeypatch.setattr(workers, "_worker_command", lambda *a: [sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(DLMError, match=r"worker 1 \(pid \d+\) exited with code 3 before joining"):
        _llm(LLADA)
    assert time.monotonic() - start < 120
    monkeypatch.undo()
    _llm(LLADA).close()                                 # nothing was left behind
