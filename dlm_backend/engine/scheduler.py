"""Admits requests by free KV pages and picks which running ones share the next forward."""

from __future__ import annotations

from collections import deque
from typing import Iterable

from dlm_backend.engine.kv import PageAllocator
from dlm_backend.engine.requests.sequence import ScheduledBatch, Sequence, Status


class Scheduler:
    """FIFO admission: the next waiting request runs once ``limits.max_num_seqs`` allow it and the
    pages its canvas needs are free (full prompt pages found in the prefix cache are shared, not
    taken); each step batches running requests whose passes fit ``limits.max_num_batched_tokens``
    (always at least one), rotating so none starves. Pages go back when a request ends."""

    def __init__(self, limits, logits_shift: int, allocator: PageAllocator | None, prefix_caching: bool = True):
        self.limits = limits            # EngineLimits, replaced when the engine's limits change
        self.logits_shift = logits_shift
        self.allocator = allocator
        self.prefix_caching = prefix_caching
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._running_ids: set[int] = set()

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def startable(self) -> int:
        """How many waiting requests the next :meth:`schedule` starts if nothing ends first: in order,
        each needs a free sequence slot and the KV pages of its canvas. Prompt pages the prefix cache
        would share are counted as needed too, so this errs toward fewer (at most by the requests
        that only shared pages would let in)."""
        alloc, waiting = self.allocator, tuple(self.waiting)   # a copy: a server thread reads this mid-step
        demands = (alloc.pages_for(s.kv_positions) if alloc else 0 for s in waiting)
        return fifo_fit(demands, self.limits.max_num_seqs - len(self.running), alloc.num_free if alloc else 0)

    def find(self, request_id: str) -> Sequence | None:
        return next((s for s in (*self.running, *self.waiting) if s.request_id == request_id), None)

    def _admit(self, seq: Sequence) -> bool:
        """Give ``seq`` its pages (shared prefix first); False when they are not free yet."""
        if not seq.kv_positions:
            return True
        alloc = self.allocator
        seq.hashes = seq.prefix_hashes(alloc.page_size) if self.prefix_caching else []
        got = alloc.reserve(alloc.pages_for(seq.kv_positions), seq.hashes, writer=seq.seq_id)
        if got is None:
            return False
        seq.pages, seq.num_shared = got
        self._catch_up(seq)
        return True

    def _catch_up(self, seq: Sequence) -> bool:
        """Count shared prompt pages written since as cached; True while the next one is still being
        written by another running request (the request waits for it rather than compute it twice)."""
        alloc, size = self.allocator, self.allocator.page_size
        while seq.num_cached // size < seq.num_shared:
            h = seq.hashes[seq.num_cached // size]
            if not alloc.written(h):
                writer = alloc.writer(h)
                return writer is not None and writer != seq.seq_id and writer in self._running_ids
            seq.num_cached += size
            seq.published += 1
        return False

    def plan(self, seqs: list[Sequence]) -> ScheduledBatch:
        """``seqs`` with their next passes (a request retried alone after a failed batch re-plans)."""
        return ScheduledBatch.of(seqs, self.logits_shift)

    def schedule(self) -> ScheduledBatch:
        while self.waiting and len(self.running) < self.limits.max_num_seqs and self._admit(self.waiting[0]):
            seq = self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
        self._running_ids = {s.seq_id for s in self.running}
        batch, budget = ScheduledBatch(), self.limits.max_num_batched_tokens
        for seq in self.running:
            if seq.num_shared and self._catch_up(seq):
                continue                                 # its prompt's keys are on their way
            step = seq.plan(self.logits_shift)
            if batch and step.num_tokens > budget:
                break
            batch.add(seq, step)
            budget -= step.num_tokens
        if batch and batch.seqs[-1] is not self.running[-1]:  # the rest go first next time
            i = self.running.index(batch.seqs[-1]) + 1
            self.running = self.running[i:] + self.running[:i]
        return batch

    def remove_finished(self) -> list[Sequence]:
        """Take finished requests out, their pages back to the allocator."""
        done = [s for s in self.running if s.is_finished] + [s for s in self.waiting if s.is_finished]
        self.running = [s for s in self.running if not s.is_finished]
        self.waiting = deque(s for s in self.waiting if not s.is_finished)
        for seq in done:
            if seq.pages and self.allocator is not None:
                self.allocator.release(seq.pages)
                seq.pages = []
        return done


def fifo_fit(demands: Iterable[int], slots: int, pages: int) -> int:
    """How many of ``demands`` (KV pages per request, in queue order) start together within ``slots``
    requests and ``pages`` free pages: admission is in order, so the first that does not fit holds
    back every request behind it."""
    n = 0
    for need in demands:
        if n >= slots or need > pages:
            break
        pages -= need
        n += 1
    return n
