"""What the framework adapters share: their knob fields and the checks on them, both read from the
knob table; the engine handles each adapter holds until its ``close()``; the model's tokenizer for
token counting without its weights; readable model names; work moved off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from pathlib import Path
from typing import Any

from dlm_backend.chat import UNSUPPORTED, Deadline, logprobs_knob, refuse_unsupported
from dlm_backend.engine.checkpoint.folder import EMBEDDED_MODEL, default_model, resolve_checkpoint
from dlm_backend.engine.checkpoint.load import checkpoint_tokenizer
from dlm_backend.engine.checkpoint.tokenizer import Tokenizer
from dlm_backend.engine.params import (DEFAULTS, FRAMEWORK_NAMES, FRAMEWORK_TAKEN, KNOB_NAMES, KNOBS, knob_values,
                                       unknown_field)
from dlm_backend.engine.quant.methods import METHODS
from dlm_backend.errors import DLMError, TokenizerError
from dlm_backend.llm import LLM
from dlm_backend.plugins import registered_knobs

#: The framework front doors' knob fields, named as the knob table names them there: name -> field.
KNOB_FIELDS: dict[str, str] = {public: name for name, public in FRAMEWORK_NAMES.items()}
#: The adapters' ``quantization`` field, described from the methods table (names and what each is).
QUANTIZATION_DOC = ("quantize a full-precision checkpoint's weights as they load: "
                    + "; ".join(f"{name} ({what})" for name, what in METHODS.items())
                    + "; default: the checkpoint's own precision")


def knob_fields(field) -> dict:
    """Pydantic field definitions for every knob, named as the front doors name them
    (``kv_cache``): ``None`` = unset (the checkpoint's default, else the table's), described by the
    knob table. ``field`` is the framework's ``Field``."""
    out = {}
    for public, name in KNOB_FIELDS.items():
        knob = KNOBS[name]
        kind = list[knob.item] if knob.kind is list else knob.kind
        default = getattr(DEFAULTS, name)
        out[public] = (kind | None, field(default=None, description=f"{knob.doc} (default {default!r})"))
    return out


def constructor_args(cls, data: Any, where: str) -> Any:
    """An adapter's constructor arguments, checked by name before the framework sees them
    (frameworks drop names they do not know, so a typo would silently decode with the defaults).

    A knob's other names (``max_new_tokens``, as the server and LiteLLM take) set the knob's field;
    a name that is neither a field nor a knob is a DLMError naming the nearest valid one; a knob
    value under a name the framework owns (``cache="prefix"``) names the knob's own field.
    """
    if not isinstance(data, dict):
        return data
    own = set()
    for name, info in cls.model_fields.items():
        own |= {name} | {a for a in (info.alias, info.validation_alias) if isinstance(a, str)}
    knob_names = [n for n in KNOB_NAMES if n not in FRAMEWORK_TAKEN]
    out: dict = {}
    given: dict = {}                                   # field -> the name the caller used for it
    for name, value in data.items():
        if name in FRAMEWORK_TAKEN and _is_knob_value(name, value, name in own):
            public = FRAMEWORK_NAMES[name]
            raise DLMError(f"{where}: {name} is not a decoding knob at the framework front doors; the knob is "
                           f"{public} there: pass {public}={value!r:.60}.", param=name)
        if name in own:
            target = name
        elif name in knob_names:
            target = FRAMEWORK_NAMES[KNOB_NAMES[name]]
        else:
            raise unknown_field(name, sorted(own | set(knob_names)), where, kind="fields")
        if target in given:
            raise DLMError(f"{where}: {name} and {given[target]} name the same knob; pass one.", param=name)
        given[target] = name
        out[target] = value
    return out


def _is_knob_value(name: str, value: Any, framework_field: bool) -> bool:
    """Whether ``value`` passed as ``name`` is meant for the knob (any value where the framework has
    no such field; otherwise a value the knob itself would take)."""
    if not framework_field:
        return True
    try:
        KNOBS[name].check(name, value)
    except DLMError:
        return False
    return True


#: The adapters' ``logprobs`` field, as OpenAI's clients name it (``top_logprobs`` is the knob field).
LOGPROBS_DOC = ("return each token's log-probability (the one at the diffusion pass that committed it), with "
                "top_logprobs alternatives, where the framework's OpenAI integration puts them")


def logprobs_layer(fields: dict, kwargs: dict) -> dict:
    """The ``logprobs`` knob of one call, from OpenAI's two fields: a call's ``logprobs`` /
    ``top_logprobs`` (taken out of ``kwargs``) over the adapter's own ``fields``; ``top_logprobs``
    alone, as OpenAI refuses it, is a DLMError (chat.logprobs_knob)."""
    asked = kwargs.pop("logprobs", fields.get("logprobs"))
    top = kwargs.pop("top_logprobs", fields.get("top_logprobs"))
    n = logprobs_knob(asked, top)
    return {"top_logprobs": n}            # the knob's name at the framework doors (None: none)


def refuse_unserved(kwargs: dict) -> None:
    """Take the OpenAI fields this backend does not serve (chat.UNSUPPORTED: ``logprobs``, ``n``, ...)
    out of a call's ``kwargs``: at their neutral values (``logprobs=False``, ``n=1``) they pass, as
    the server and LiteLLM take them; otherwise a DLMError names the field and why."""
    refuse_unsupported({name: kwargs.pop(name) for name in UNSUPPORTED if name in kwargs})


def check_knob_values(given: dict, where: str) -> None:
    """The knob table's per-knob checks (type, range, allowed values) on an adapter's knob fields or
    extra knobs, at construction: a SamplingParamsError naming the knob as the adapter spells it.
    Rules tying knobs together wait for the call, which may change either of them."""
    plugin = registered_knobs()                 # a registered sampler's own knobs, by their own names
    for name, value in knob_values(given, FRAMEWORK_TAKEN, where).items():
        (KNOBS.get(name) or plugin[name]).check(FRAMEWORK_NAMES.get(name, name), value)


class Handles:
    """The engine handles one adapter holds, one per (model, device, quantization): taken on first
    use (which loads the weights unless some front door holds them already) and given back by
    :meth:`close`, after which the next use takes a new one. A closed handle is never handed out.
    The quantization is part of the key because it is part of the engine's: handles asking for
    int4 and for full precision must not share the weights either one loaded."""

    def __init__(self):
        self._llms: dict[tuple, LLM] = {}
        self._lock = threading.Lock()

    def get(self, model: str | None, device: str | None = None, quantization: str | None = None) -> LLM:
        key = (model, device, quantization)
        with self._lock:
            llm = self._llms.get(key)
        if llm is not None and not llm.closed:
            return llm
        # loads outside the lock (other models keep serving)
        fresh = LLM(model, device=device, quantization=quantization)
        with self._lock:
            llm = self._llms.get(key)
            if llm is None or llm.closed:
                self._llms[key], llm, fresh = fresh, fresh, None
        if fresh is not None:                          # another thread took one first: give this one back
            fresh.close()
        return llm

    def loaded(self, model: str | None, device: str | None = None, quantization: str | None = None) -> LLM | None:
        """The handle held for ``model`` (on ``device``, so quantized), or None (nothing is loaded here)."""
        with self._lock:
            llm = self._llms.get((model, device, quantization))
        return llm if llm is not None and not llm.closed else None

    def close(self) -> None:
        """Give every handle back; the last handle on an engine frees its weights and caches."""
        with self._lock:
            llms, self._llms = list(self._llms.values()), {}
        for llm in llms:
            llm.close()

    # An adapter copied (LangChain and pydantic deep-copy models) starts with no handles of its own
    # rather than sharing a lock; a shallow copy shares them, as it shares every other attribute.
    def __deepcopy__(self, memo) -> "Handles":
        return Handles()

    def __reduce__(self):
        return (Handles, ())


def display_name(model: str | None) -> str:
    """The model's name as LangSmith and ``model_name`` show it: as the caller gave it (ChatOpenAI
    reports the "gpt-4o" it was given), or ``$DLM_MODEL``, except that the embedded model is
    "dlm-tiny", not a path inside the installed package."""
    name = str(model or default_model())
    with contextlib.suppress(OSError):
        if Path(name).expanduser().resolve() == EMBEDDED_MODEL.resolve():
            return "dlm-tiny"
    return name


def model_tokenizer(model: str | None, handles: "Handles | None" = None, device: str | None = None,
                    quantization: str | None = None) -> Tokenizer:
    """The model's tokenizer and chat template for counting tokens: a loaded engine's, else read
    from the checkpoint alone (milliseconds; frameworks count on the event loop, where loading
    the weights stalled LlamaIndex's first ``aquery`` for 2.6 s). The counts are the engine's."""
    if handles is not None and (llm := handles.loaded(model, device, quantization)) is not None:
        return llm.tokenizer
    return _tokenizer_of(str(model or default_model()))


@functools.lru_cache(maxsize=16)
def _tokenizer_of(model: str) -> Tokenizer:
    tokenizer = checkpoint_tokenizer(resolve_checkpoint(model, patterns=["*.json", "*.jinja", "tokenizer*"]))
    if tokenizer is None:               # a folder without tokenizer.json, a GGUF file without a vocabulary
        raise TokenizerError(f"{model} has no tokenizer, so its tokens cannot be counted.")
    return tokenizer


async def off_loop(deadline: Deadline, work, *args):
    """``work(*args)`` in a worker thread within ``deadline``: a first call loads the weights and
    planning tokenizes, neither of which may stall the event loop. Past the deadline the call
    raises RequestTimeoutError (a load goes on in its thread; the next call finds it done)."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(work, *args), deadline.left())
    except TimeoutError:
        if deadline.timeout is None:               # the work's own (an engine request's)
            raise
        raise deadline.expired() from None
