"""`dlm serve` over several nodes, as far as one machine allows: two torchrun launches (node 0 and
node 1, one process each) meet over loopback; rank 0 serves HTTP, rank 1 only runs its shard. Its
replies equal one process's, and stopping node 0 ends node 1 too (no worker left waiting)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
httpx = pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from loadgen import free_port, launch  # noqa: E402  (benchmarks/loadgen.py)

PROMPTS = ["Hi!", "Name 3 colors."]
BODY = {"model": "m", "max_tokens": 12, "temperature": 0}


def _replies(url: str) -> list[str]:
    out = []
    for prompt in PROMPTS:
        r = httpx.post(url + "/v1/chat/completions", timeout=120,
                       json={**BODY, "messages": [{"role": "user", "content": prompt}]})
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["message"]["content"])
    return out


def _torchrun_serve(model: Path, port: int, master_port: int, rank: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(master_port),
         "--max-restarts", "0", "-m", "dlm_backend.cli", "serve", str(model), "--tensor-parallel-size", "2",
         "--port", str(port), "--served-model-name", "m", "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _healthy(url: str, nodes: list[subprocess.Popen], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in nodes):
            raise AssertionError("a node exited: " + " | ".join(p.communicate()[0][-2000:] for p in nodes))
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError("dlm serve under torchrun did not become healthy")


def test_serve_over_two_torchrun_nodes_answers_as_one_process_and_stops_cleanly(dream_chat):
    with launch(str(dream_chat), "--device", "cpu") as url:
        solo = _replies(url)
    port, master_port = free_port(), free_port()
    nodes = [_torchrun_serve(dream_chat, port, master_port, rank) for rank in (0, 1)]
    try:
        url = f"http://127.0.0.1:{port}"
        _healthy(url, nodes)
        assert _replies(url) == solo
        nodes[0].send_signal(signal.SIGTERM)           # node 0 stops: rank 0 closes, rank 1 leaves
        logs = [p.communicate(timeout=60)[0] for p in nodes]
        assert nodes[1].returncode == 0, logs[1][-2000:]
        # torchrun's own agent on node 1 may log that node 0's store went away at its exit barrier;
        # no frame of a traceback may be ours.
        ours = [line for line in logs[1].splitlines() if "File " in line and "dlm_backend" in line]
        assert not ours, logs[1][-2000:]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()
