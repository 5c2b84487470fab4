"""A background thread that steps the engine whenever requests are pending.

Callers in any thread or event loop submit requests and receive :class:`StreamChunk` objects through
a callback, so concurrent callers share denoising passes and async callers never block their loop.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from dlm_backend.engine.engine import LLMEngine
from dlm_backend.engine.outputs import StreamChunk
from dlm_backend.engine.params import SamplingParams

log = logging.getLogger(__name__)
Sink = Callable[[StreamChunk], None]


class EngineLoop:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._sinks: dict[str, Sink] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, prompt_token_ids: list[int], params: SamplingParams, sink: Sink,
               request_id: str | None = None) -> str:
        """Queue a request (DLMError raised here, in the caller's thread, for bad input)."""
        with self._lock:
            seq = self.engine.add_request(prompt_token_ids, params, request_id)
            self._sinks[seq.request_id] = sink
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="dlm-engine", daemon=True)
                self._thread.start()
            self._wake.notify()
        return seq.request_id

    def abort(self, request_id: str) -> None:
        with self._lock:
            self.engine.abort(request_id)
            self._wake.notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self.engine.has_unfinished and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                chunks = self.engine.step()
                sinks = [(self._sinks.get(c.request_id), c) for c in chunks]
                for c in chunks:
                    if c.finished:
                        self._sinks.pop(c.request_id, None)
            for sink, chunk in sinks:   # deliver outside the lock: sinks may submit new work
                if sink is not None:
                    try:
                        sink(chunk)
                    except Exception:  # noqa: BLE001 - a broken consumer must not stop the engine
                        log.exception("stream consumer for %s failed", chunk.request_id)
