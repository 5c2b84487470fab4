"""One engine per (model, device, dtype, execution switches) in the process, shared by every front door.

``acquire`` hands out the engine for a configuration, loading it on first use, and counts the
handle; ``release`` returns one, and the last release frees the weights and caches. Each model
loads under its own lock, so requests for a model already loaded never wait while another one
loads (tens of seconds for an 8B checkpoint).
"""

from __future__ import annotations

import threading

from dlm_backend.engine.engine import LLMEngine
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.loop import EngineLoop

_loops: dict[tuple, EngineLoop] = {}
_handles: dict[tuple, int] = {}
_loading: dict[tuple, threading.Lock] = {}
_lock = threading.Lock()


def acquire(config: EngineConfig, **limits) -> EngineLoop:
    """The shared engine loop for ``config`` (loaded now if needed), with ``limits`` (EngineLimits
    fields; None keeps the engine's) applied to it."""
    key = config.key
    with _lock:
        lock = _loading.setdefault(key, threading.Lock())
    with lock:
        loop = _loops.get(key)
        if loop is None:
            loop = EngineLoop(LLMEngine(config))
            with _lock:
                _loops[key] = loop
        if any(v is not None for v in limits.values()):
            loop.set_limits(**limits)                  # a bad limit raises before a handle is counted
        with _lock:
            _handles[key] = _handles.get(key, 0) + 1
    return loop


def release(loop: EngineLoop) -> None:
    """Return one handle; the last one closes the engine (its requests end with ``abort``)."""
    key = loop.engine.config.key
    with _lock:
        if _loops.get(key) is not loop:
            return
        _handles[key] -= 1
        if _handles[key] > 0:
            return
        del _loops[key], _handles[key]
    loop.close()


def loaded() -> list[tuple]:
    """Keys of the engines loaded in this process."""
    with _lock:
        return list(_loops)
