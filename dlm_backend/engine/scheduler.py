"""Admits requests by free KV pages and picks which running ones share the next forward."""

from __future__ import annotations

from collections import deque

from dlm_backend.engine.kv import PageAllocator
from dlm_backend.engine.sequence import Sequence, Status


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

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def find(self, request_id: str) -> Sequence | None:
        return next((s for s in (*self.running, *self.waiting) if s.request_id == request_id), None)

    def _admit(self, seq: Sequence) -> bool:
        """Give ``seq`` its pages (shared prefix first); False when they are not free yet."""
        if not seq.kv_positions:
            return True
        alloc = self.allocator
        hashes = seq.prefix_hashes(alloc.page_size) if self.prefix_caching else []
        got = alloc.reserve(alloc.pages_for(seq.kv_positions), hashes)
        if got is None:
            return False
        seq.pages, shared = got
        seq.num_cached = shared * alloc.page_size           # shared prompt pages need no prefill
        seq.published = shared
        return True

    def schedule(self) -> list[Sequence]:
        while self.waiting and len(self.running) < self.limits.max_num_seqs and self._admit(self.waiting[0]):
            seq = self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
        batch, budget = [], self.limits.max_num_batched_tokens
        for seq in self.running:
            cost = seq.plan(self.logits_shift).num_tokens
            if batch and cost > budget:
                break
            batch.append(seq)
            budget -= cost
        if len(batch) < len(self.running):   # the rest go first next time
            self.running = self.running[len(batch):] + batch
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
