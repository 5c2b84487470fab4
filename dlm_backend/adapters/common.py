"""What the framework adapters share: one engine handle per model, and their knob fields."""

from __future__ import annotations

import threading

from dlm_backend.engine.params import DEFAULTS, KNOBS
from dlm_backend.llm import LLM

#: Names every framework front door leaves to the framework: LangChain's and LiteLLM's ``cache``
#: is their response cache, so the KV cache mode is ``kv_cache`` in all the adapters alike.
TAKEN = ("cache",)

_handles: dict[tuple, LLM] = {}
_lock = threading.Lock()


def shared_llm(model: str | None, device: str | None = None) -> LLM:
    """The adapters' handle on the shared engine for (model, device): weights load on first use,
    once per process, and stay loaded for every adapter instance naming that model."""
    key = (model, device)
    with _lock:
        llm = _handles.get(key)
    if llm is None:
        llm = LLM(model, device=device)           # loads outside the lock (other models keep serving)
        with _lock:
            llm = _handles.setdefault(key, llm)
    return llm


def knob_fields(field) -> dict:
    """Pydantic field definitions for every knob, named as the front doors name them
    (``kv_cache``): ``None`` = unset (the checkpoint's default, else the table's), described by the
    knob table. ``field`` is the framework's ``Field``."""
    out = {}
    for name, knob in KNOBS.items():
        public = knob.aliases[0] if name in TAKEN else name
        kind = list[knob.item] if knob.kind is list else knob.kind
        default = getattr(DEFAULTS, name)
        out[public] = (kind | None, field(default=None, description=f"{knob.doc} (default {default!r})"))
    return out
