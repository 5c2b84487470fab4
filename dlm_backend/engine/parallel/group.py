"""The tensor-parallel group of one engine: its rank, its collectives, and how dimensions split.

A model is built under :func:`building` (``with building(group): model = cls.from_config(...)``):
every parallel layer captures the group then, so two engines in one process (a TP engine and a
one-device one) never see each other's shards. ``group is None`` means one device: the layers are
then plain torch layers and every collective here is skipped.

Collectives are torch.distributed's, on the engine's process group (NCCL on CUDA, gloo on CPU); step
inputs (small host objects) travel over a gloo group, as vLLM's ``cpu_group``. Each collective adds
its payload to :attr:`TPGroup.bytes`, which the communication benchmark reads.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dlm_backend.errors import DLMError

_local = threading.local()


@dataclass
class TPGroup:
    """This process's place in a tensor-parallel engine of ``world`` ranks (rank 0 schedules)."""

    rank: int
    world: int
    device: torch.device
    #: the gloo group that carries step inputs; None: the default group (gloo already, on CPU)
    cpu_group: object = None
    #: payload bytes per collective kind ("all_reduce", "all_gather", "broadcast") since the last reset
    bytes: Counter = field(default_factory=Counter)

    # -- how dimensions split ------------------------------------------------------------------

    def split(self, size: int, what: str) -> slice:
        """This rank's contiguous 1/world of ``size`` (``what`` names the dimension in the error)."""
        if size % self.world:
            fits = [n for n in range(1, min(size, 64) + 1) if size % n == 0]
            raise DLMError(f"tensor_parallel_size={self.world} must divide {what} ({size}). Choose one that "
                           f"does ({', '.join(map(str, fits))}).")
        n = size // self.world
        return slice(self.rank * n, (self.rank + 1) * n)

    def kv_heads(self, kv_heads: int, heads: int) -> slice:
        """The key/value heads this rank keeps: its share when ``world`` divides them, else the one
        head its query heads read (replicated over ``world / kv_heads`` ranks, as SGLang and vLLM)."""
        self.split(heads, "the attention heads")
        if kv_heads % self.world == 0:
            return self.split(kv_heads, "the key/value heads")
        if self.world % kv_heads:
            raise DLMError(f"tensor_parallel_size={self.world} and the {kv_heads} key/value heads: one must "
                           "divide the other (the heads split, or each is replicated on whole ranks). Choose "
                           f"a size that divides {kv_heads} or is a multiple of it.")
        head = self.rank // (self.world // kv_heads)
        return slice(head, head + 1)

    def vocab(self, vocab: int) -> tuple[int, int]:
        """This rank's rows ``[lo, hi)`` of a vocabulary-parallel table; every rank holds
        ``ceil(vocab / world)`` rows, the last one padded, so the gather is one equal-size collective."""
        per = -(-vocab // self.world)
        lo = min(self.rank * per, vocab)
        return lo, min(lo + per, vocab)

    # -- collectives ---------------------------------------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place (each rank holds a partial sum)."""
        self.bytes["all_reduce"] += x.numel() * x.element_size()
        dist.all_reduce(x)
        return x

    def gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, v]`` of every rank, concatenated along the last dim: ``[N, world * v]``."""
        self.bytes["all_gather"] += x.numel() * x.element_size()
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def broadcast(self, obj=None):
        """Rank 0's ``obj`` on every rank (pickled; a size then the bytes, two broadcasts: what
        ``dist.broadcast_object_list`` does, written out so the payload is counted without pickling twice)."""
        if self.rank == 0:
            data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([data.numel()], dtype=torch.long)
        else:
            size = torch.zeros(1, dtype=torch.long)
        dist.broadcast(size, src=0, group=self.cpu_group)
        if self.rank != 0:
            data = torch.empty(int(size), dtype=torch.uint8)
        dist.broadcast(data, src=0, group=self.cpu_group)
        self.bytes["broadcast"] += int(size) + size.element_size()
        return obj if self.rank == 0 else pickle.loads(data.numpy().tobytes())

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's ``value`` (KV pages: each device's budget, the pool the same)."""
        t = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t)


def agree(group: TPGroup, build):
    """``build()`` on every rank; if it fails on any, every rank raises a DLMError naming the first
    failure (a bad size, a missing tensor), so no rank waits for a shard that never loads."""
    result, status = None, None
    try:
        result = build()
    except Exception as exc:  # noqa: BLE001 - reported to every rank below
        status = f"{exc}" if isinstance(exc, DLMError) else f"{type(exc).__name__}: {exc}"
    statuses = [None] * group.world
    dist.all_gather_object(statuses, status, group=group.cpu_group)
    failed = [(r, s) for r, s in enumerate(statuses) if s is not None]
    if failed:
        rank, message = failed[0]
        raise DLMError(message if rank == group.rank else
                       f"Rank {rank} of the tensor-parallel engine failed: {message}")
    return result


@contextlib.contextmanager
def building(group: TPGroup | None):
    """Build models inside this block for ``group`` (None: one device)."""
    previous = getattr(_local, "group", None)
    _local.group = group
    try:
        yield group
    finally:
        _local.group = previous


def build_group() -> TPGroup | None:
    """The group of the model being built (None outside :func:`building`, or for one device)."""
    group = getattr(_local, "group", None)
    return group if group is not None and group.world > 1 else None
