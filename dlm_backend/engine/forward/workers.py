"""The processes of a tensor-parallel engine: rank 0 (the engine: scheduler, samplers, this rank's
shard) and workers 1..N-1, which load their shard and run every forward rank 0 broadcasts.

On one node, :func:`start` starts the workers as fresh interpreters (``python -m
dlm_backend.engine.forward``: CUDA cannot fork, and unlike multiprocessing's spawn the caller's
script is not re-imported, so it needs no ``if __name__ == "__main__"`` guard) and they meet rank 0
on a loopback TCP store. Under ``torchrun`` (several nodes), every rank is already running: rank 0 goes
on as the engine and the others serve as workers inside :func:`start`, then exit when rank 0
closes. Workers never schedule; a worker that dies fails rank 0's forward with
:class:`ParallelWorkerError`, and the engine stays failed (``LLMEngine.failure``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from dlm_backend.engine.checkpoint.folder import checkpoint_config, resolve_checkpoint
from dlm_backend.engine.checkpoint.load import load_shard
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.forward.runner import ModelRunner
from dlm_backend.engine.kernels import resolve_kernels
from dlm_backend.engine.kv.sizing import make_pool
from dlm_backend.engine.parallel.group import TPGroup
from dlm_backend.errors import DLMError, ParallelWorkerError

#: How long the step-input (gloo) collectives wait for a rank, the load handshake of a 206 GB
#: checkpoint included, before they fail.
COLLECTIVE_TIMEOUT_S = 1800
#: How long a forward's NCCL collective waits for a rank (a pass takes well under a second): a worker
#: lost inside a forward on GPUs ends in NCCL's watchdog after this, not in a clear error (on CPU, gloo
#: reports the lost peer at once).
NCCL_TIMEOUT_S = 300
#: How long close() waits for a worker to leave before it is terminated.
JOIN_TIMEOUT_S = 10
#: How often rank 0 looks at its starting workers (their store keys and whether they still run).
START_POLL_S = 0.05
_READY, _FAILED = "dlm/ready/{}", "dlm/failed/{}"


def _launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "MASTER_ADDR" in os.environ)


def worker_rank() -> int:
    """This process's rank under torchrun (0 outside it): a rank above 0 serves as a worker only."""
    return int(os.environ.get("RANK", "0")) if _launched_by_torchrun() else 0


def _device(base: torch.device, local_rank: int) -> torch.device:
    return torch.device("cuda", local_rank) if base.type == "cuda" else base


def init_group(rank: int, world: int, device: torch.device, store=None) -> TPGroup:
    """Join the engine's process group (NCCL on CUDA, gloo on CPU; step inputs on a gloo group): on
    rank 0's ``store`` when it started the workers, else torchrun's environment."""
    if dist.is_initialized():
        raise DLMError("This process already runs a tensor-parallel engine (torch.distributed is initialised). "
                       "Close it first (LLM.close()), or share it: one tensor-parallel engine per process.")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if store is not None and rank:
        store.set(_READY.format(rank), "")              # rank 0 stops watching this worker's start
    timeout = NCCL_TIMEOUT_S if backend == "nccl" else COLLECTIVE_TIMEOUT_S
    where = {"store": store} if store is not None else {"init_method": "env://"}
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout), **where)
    cpu_group = (dist.new_group(backend="gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
                 if backend == "nccl" else None)
    return TPGroup(rank, world, device, cpu_group)


class Workers:
    """Rank 0's side of the workers: sends each forward's batch, notices when one is gone."""

    def __init__(self, group: TPGroup, procs: list):
        self.group, self.procs = group, procs
        self.error: ParallelWorkerError | None = None
        self._closed = False

    def dead(self) -> str | None:
        """A description of the first spawned worker that is no longer running (None: all are)."""
        for rank, p in enumerate(self.procs, start=1):
            if p.poll() is not None:
                return f"worker rank {rank} (pid {p.pid}) exited with code {p.returncode}"
        return None

    @property
    def healthy(self) -> bool:
        return self.error is None and self.dead() is None

    def failure(self, cause: BaseException | None = None) -> ParallelWorkerError:
        """The error every request of a failed engine gets (made once; the engine stays failed)."""
        if self.error is None:
            what = self.dead() or f"a rank lost contact ({cause})"
            self.error = ParallelWorkerError(
                f"The tensor-parallel engine lost a worker: {what}. Its in-flight requests fail and it takes no "
                "more; restart it (a new LLM, or restart `dlm serve`), and check the worker's log and memory.")
        return self.error

    def send(self, batch) -> None:
        if self.error is not None or self.dead() is not None:
            raise self.failure()
        try:
            self.group.broadcast(batch)
        except RuntimeError as exc:
            raise self.failure(exc) from exc

    def close(self, abort: bool = False) -> None:
        """Stop the workers (a None batch; ``abort``: terminate them, as when the engine failed to
        build) and leave the process group."""
        if self._closed:
            return
        self._closed = True
        if self.healthy and not abort:
            try:
                self.group.broadcast(None)
            except RuntimeError:
                pass
        for p in self.procs:
            if abort:
                p.terminate()
            try:
                p.wait(JOIN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if dist.is_initialized():
            dist.destroy_process_group()


def start(config: EngineConfig) -> tuple[TPGroup, Workers]:
    """Rank 0's group and its workers for ``config.tensor_parallel_size`` ranks. Under torchrun, a rank
    other than 0 serves as a worker here and leaves the process with SystemExit(0) when rank 0 closes."""
    world, base = config.tensor_parallel_size, config.torch_device
    if _launched_by_torchrun():
        got = int(os.environ.get("WORLD_SIZE", "1"))
        if got != world:
            raise DLMError(f"torchrun started {got} processes but tensor_parallel_size is {world}; give torchrun "
                           f"--nnodes x --nproc-per-node = {world}.")
        rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        group = init_group(rank, world, _device(base, local))
        if rank != 0:
            try:
                serve(config, group)
            finally:
                dist.destroy_process_group()
            raise SystemExit(0)
        return group, Workers(group, [])
    if base.type == "cuda" and torch.cuda.device_count() < world:
        raise DLMError(f"tensor_parallel_size={world} needs {world} GPUs; this machine shows "
                       f"{torch.cuda.device_count()}. Use fewer, or launch over several nodes with torchrun.")
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    spec = json.dumps(dataclasses.asdict(config))
    # The workers import the very package rank 0 runs, wherever it was found (a checkout on sys.path).
    package_root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    procs = [subprocess.Popen(_worker_command(spec, r, world, f"127.0.0.1:{store.port}"), env=env)
             for r in range(1, world)]
    try:
        _watch_start(procs, store)
        group = init_group(0, world, _device(base, 0), store)
    except BaseException:
        for p in procs:
            p.terminate()
        raise
    return group, Workers(group, procs)


def _worker_command(spec: str, rank: int, world: int, address: str) -> list[str]:
    return [sys.executable, "-m", "dlm_backend.engine.forward", spec, str(rank), str(world), address]


def _watch_start(procs, store) -> None:
    """Wait until every worker is about to join the group, or raise a DLMError for the first that
    failed to start (its message, sent over the store) or exited: the group's own rendezvous would
    wait COLLECTIVE_TIMEOUT_S for a worker that is gone."""
    deadline = time.monotonic() + COLLECTIVE_TIMEOUT_S
    while True:
        for rank, p in enumerate(procs, start=1):
            if store.check([_FAILED.format(rank)]):
                message = store.get(_FAILED.format(rank)).decode(errors="replace")
                raise DLMError(f"Tensor-parallel worker {rank} failed to start: {message}")
            if p.poll() is not None:
                raise DLMError(f"Tensor-parallel worker {rank} (pid {p.pid}) exited with code {p.returncode} "
                               "before joining the engine; its output above says why.")
        if store.check([_READY.format(r) for r in range(1, len(procs) + 1)]):
            return
        if time.monotonic() > deadline:
            raise DLMError(f"Tensor-parallel workers did not start within {COLLECTIVE_TIMEOUT_S} s.")
        time.sleep(START_POLL_S)


def worker_main(spec: str, rank: int, world: int, address: str) -> None:
    """A started worker: reach rank 0's store, join the group, then :func:`serve`. A failure before
    joining is sent to rank 0 (which raises it) and re-raised here."""
    host, port = address.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), world, is_master=False, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        config = EngineConfig(**json.loads(spec))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))      # the ranks share the machine's cores
        group = init_group(rank, world, _device(config.torch_device, rank), store)
    except Exception as exc:
        store.set(_FAILED.format(rank), f"{exc}" if isinstance(exc, DLMError) else f"{type(exc).__name__}: {exc}")
        raise
    try:
        serve(config, group)
    finally:
        dist.destroy_process_group()


def shard_runner(config: EngineConfig, tp: TPGroup, triton: bool) -> ModelRunner:
    """A worker's runner: its shard of the checkpoint and a KV pool of the engine's page count (no
    tokenizer, no sampler: rank 0 decides everything)."""
    folder = resolve_checkpoint(config.model, config.revision)
    model = load_shard(config, folder, {**checkpoint_config(folder), **config.config_overrides}, tp)
    pool = make_pool(model, config.kv_cache_memory, config.torch_dtype, tp.device, tp)
    return ModelRunner(model, tp.device, config.torch_dtype, None, pool, triton)


@torch.inference_mode()
def serve(config: EngineConfig, group: TPGroup) -> None:
    """A worker's life: load its shard, size the KV pool as rank 0 does, run each broadcast forward
    until rank 0 sends None (or goes away: the broadcast raises and the worker exits)."""
    triton = resolve_kernels(config.kernels, group.device)
    runner = shard_runner(config, group, triton)
    while (batch := group.broadcast()) is not None:
        runner.execute(batch)

