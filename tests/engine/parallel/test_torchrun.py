"""Several nodes, as far as one machine allows: two torchrun launches (node 0 and node 1, one process
each) meet over loopback, and rank 0's tokens equal one device's."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers import PARITY

from dlm_backend import LLM

LLADA = PARITY / "llada-tiny"
SCRIPT = Path(__file__).with_name("torchrun_generate.py")
ROOT = Path(__file__).resolve().parents[3]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_launched_by_torchrun_give_the_one_device_tokens():
    port = _port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "--max-restarts", "0", str(SCRIPT), str(LLADA), "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for rank in (0, 1)]
    logs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], logs
    got = json.loads(next(line for line in logs[0].splitlines() if line.startswith("TOKENS "))[7:])
    assert "TOKENS" not in logs[1]                      # rank 1 only served
    solo = LLM(str(LLADA), device="cpu", dtype="float32")
    params = solo.sampling_params(temperature=0.0, ignore_eos=True, max_tokens=12)
    want = [o.token_ids for o in solo.generate(prompt_token_ids=[[5, 6, 7, 8, 9], [20, 21, 22]], sampling_params=params)]
    assert got == want
