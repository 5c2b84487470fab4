"""Engine counters for monitoring: totals since start plus rates over a sliding window.

The engine records one entry per step; the server exposes them at ``/metrics``. Rates are computed
over the last ``window_s`` seconds (10 by default, about a Prometheus scrape interval), so a scrape
shows current load rather than a lifetime average.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """Totals and a sliding window of ``(time, engine steps, request passes, tokens)``."""

    window_s: float = 10.0
    steps: int = 0                  # batched forward passes the engine ran
    request_passes: int = 0         # forward passes summed over requests (a batch of 8 counts 8)
    generated_tokens: int = 0       # tokens committed and reported to callers
    finished: Counter = field(default_factory=Counter)      # finish_reason -> requests
    rejected: int = 0               # refused because the queue was full
    _recent: deque = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record_step(self, batch_size: int, tokens: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self.steps += 1
            self.request_passes += batch_size
            self.generated_tokens += tokens
            self._recent.append((now, batch_size, tokens))
            self._trim(now)

    def record_finish(self, reason: str | None) -> None:
        with self._lock:
            self.finished[reason or "unknown"] += 1

    def record_rejected(self) -> None:
        with self._lock:
            self.rejected += 1

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()

    def rates(self, now: float | None = None) -> dict[str, float]:
        """Steps/s, request passes/s and tokens/s over the window; passes per token over all time."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._trim(now)
            recent = list(self._recent)
            per_token = self.request_passes / self.generated_tokens if self.generated_tokens else 0.0
        span = self.window_s if recent else 1.0
        return {
            "steps_per_second": len(recent) / span,
            "forward_passes_per_second": sum(r[1] for r in recent) / span,
            "tokens_per_second": sum(r[2] for r in recent) / span,
            "forward_passes_per_token": per_token,
        }


@dataclass(frozen=True)
class MemoryReport:
    """Where an engine's memory went at start-up: the weights (quantized ones by kind) and the KV
    pool that got what they left. Logged once and shown by ``dlm serve`` and ``/v1/models``."""

    weight_bytes: int
    kv_cache_bytes: int
    kv_pages: int
    page_size: int
    quantized: dict[str, int]           # kind ("int4 g128", "fp8 per-channel, token activations") -> weights

    def __str__(self) -> str:
        kinds = ", ".join(f"{n} x {k}" for k, n in sorted(self.quantized.items())) or "none quantized"
        return (f"weights {human_bytes(self.weight_bytes)} ({kinds}); KV cache {human_bytes(self.kv_cache_bytes)} "
                f"({self.kv_pages} pages of {self.page_size} positions)")


def human_bytes(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps it at least 1 ("512 B", "23.4 MiB", "1.00 GiB"),
    with three significant digits: a tiny model's weights in GiB read "0.00"."""
    value, unit = float(n), "B"
    for larger in ("KiB", "MiB", "GiB", "TiB"):
        if round(value) < 1024:           # 1023.98 KiB reads "1.00 MiB", not "1024 KiB"
            break
        value, unit = value / 1024, larger
    if unit == "B":
        return f"{n} B"
    return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
