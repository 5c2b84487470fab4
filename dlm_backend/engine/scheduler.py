"""Admits requests and picks which running ones share the next denoising pass."""

from __future__ import annotations

from collections import deque

from dlm_backend.engine.sequence import Sequence, Status


class Scheduler:
    """FIFO admission up to ``limits.max_num_seqs``; each step batches running requests whose query
    windows fit ``limits.max_num_batched_tokens`` (always at least one), rotating so none starves."""

    def __init__(self, limits, logits_shift: int):
        self.limits = limits            # EngineLimits, replaced when the engine's limits change
        self.logits_shift = logits_shift
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def find(self, request_id: str) -> Sequence | None:
        return next((s for s in (*self.running, *self.waiting) if s.request_id == request_id), None)

    def schedule(self) -> list[Sequence]:
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            seq = self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
        batch, budget = [], self.limits.max_num_batched_tokens
        for seq in self.running:
            start, end, _ = seq.window(self.logits_shift)
            cost = (end - start) * (2 if seq.params.cfg_scale > 0 else 1)
            if batch and cost > budget:
                break
            batch.append(seq)
            budget -= cost
        if len(batch) < len(self.running):   # the rest go first next time
            self.running = self.running[len(batch):] + batch
        return batch

    def remove_finished(self) -> list[Sequence]:
        done = [s for s in self.running if s.is_finished]
        self.running = [s for s in self.running if not s.is_finished]
        done += [s for s in self.waiting if s.is_finished]
        self.waiting = deque(s for s in self.waiting if not s.is_finished)
        return done
