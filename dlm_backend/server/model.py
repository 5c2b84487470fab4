"""The model behind one server: loaded once off the event loop, its limits, and the slots it holds.

A request takes a slot before anything is queued or a 200 goes out, and gives it back when its
response ends (a stream: when the stream closes, however it closes). The slot is a context manager
that gives it back on leaving, unless a stream took it over with :meth:`Slot.hand_over`: a streamed
request refused before its stream began kept its slot, and eight such 400s left a 4 + 4 server
answering 429 to everyone. The slots are the engine's
capacity, ``max_num_seqs`` running plus ``max_waiting`` queued, so a burst past it is a 429 with
Retry-After at once, never a 200 whose stream then carries an error.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from dlm_backend import chat
from dlm_backend.chat.prompt import check_length, longest_token, prompt_limit
from dlm_backend.errors import ContextLengthError, DLMError
from dlm_backend.llm import LLM
from dlm_backend.server.settings import ServerConfig

log = logging.getLogger("dlm_backend.server")


class Busy(Exception):
    """The server is at capacity: 429 with Retry-After."""


class Unavailable(Exception):
    """The model could not be loaded: 503. The reason (paths included) goes to the server's log only."""


class Slot:
    """One request's place in the engine's capacity; given back exactly once."""

    def __init__(self, served: "ServedModel"):
        self.served, self.held, self.handed = served, True, False

    def release(self) -> None:
        with self.served.lock:
            if self.held:
                self.held = False
                self.served.held -= 1

    def hand_over(self):
        """Leave the release to whoever calls the returned function (a stream, when it closes)."""
        self.handed = True
        return self.release

    def __enter__(self) -> "Slot":
        return self

    def __exit__(self, *exc) -> None:
        if not self.handed:
            self.release()


class ServedModel:
    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        self.lock = threading.Lock()
        self.held = 0
        self._llm: LLM | None = None
        self._load_lock = threading.Lock()

    @property
    def capacity(self) -> int:
        limits = self.llm().engine.limits           # the shared engine's: another front door may set them
        return limits.max_num_seqs + limits.max_waiting

    @property
    def loaded(self) -> LLM | None:
        return self._llm

    def llm(self) -> LLM:
        """The model, loaded on first use (a failure is a 503 here; the detail goes to the log)."""
        if self._llm is None:
            with self._load_lock:
                if self._llm is None:
                    try:
                        llm = LLM(self.cfg.model, device=self.cfg.device, dtype=self.cfg.dtype,
                                  kv_cache_memory=self.cfg.kv_cache_memory,
                                  prefix_caching=self.cfg.prefix_caching,
                                  tensor_parallel_size=self.cfg.tensor_parallel_size, **self.cfg.limits)
                        if llm.engine.tokenizer is not None:     # the prompt-length bound, before requests
                            longest_token(llm.engine.tokenizer)
                        self._llm = llm
                    except DLMError as exc:
                        log.error("the model could not be loaded: %s", exc)
                        raise Unavailable("The model could not be loaded; the server's log says why.") from None
        return self._llm

    async def load(self) -> LLM:
        return self._llm or await asyncio.to_thread(self.llm)

    def reserve(self) -> Slot:
        """A slot for one request, or Busy when every slot is taken."""
        limits = self.llm().engine.limits           # read before the lock: a first use loads the model
        with self.lock:
            if self.held >= limits.max_num_seqs + limits.max_waiting:
                raise Busy(f"The server is at capacity ({limits.max_num_seqs} running, "
                           f"{limits.max_waiting} queued); retry shortly.")
            self.held += 1
        return Slot(self)

    def admit(self, prompt_ids: list[int], params, template: list | None = None) -> None:
        """This server's limits and the engine's own checks, before anything is queued or a 200 goes
        out (a streamed response's errors would otherwise arrive as an event after a 200)."""
        cfg = self.cfg
        if cfg.max_prompt_tokens is not None and len(prompt_ids) > cfg.max_prompt_tokens:
            raise DLMError(f"The prompt has {len(prompt_ids)} tokens, over this server's limit of "
                           f"{cfg.max_prompt_tokens}; shorten it (fewer documents or turns).", param="messages")
        self.llm().engine.admit(prompt_ids, params, response_template=template)

    def params(self, knobs: dict):
        """The request's SamplingParams from its body's knobs (checked once, by the body:
        protocol.py), layered over the checkpoint's defaults; no ``max_tokens`` means the default
        canvas within this server's limit."""
        limit = self.cfg.max_tokens_limit
        params = self.llm().sampling_params(**knobs)
        if params.max_tokens > limit:                            # before the prompt is looked at
            if "max_tokens" in knobs:
                raise DLMError(f"max_tokens {params.max_tokens} is over this server's limit of {limit}; ask for "
                               "fewer tokens.", param="max_tokens")
            params = params.replace(max_tokens=limit)
        return params

    def plan_chat(self, body, knobs: dict) -> chat.Plan:
        """A chat body planned and admitted (in a worker thread: a big schema is work)."""
        request = chat.ChatRequest.from_call(body.messages, self.params(knobs), dict(body))
        plan = chat.Plan(self.llm(), request, max_prompt_tokens=self.cfg.max_prompt_tokens)
        self.admit(plan.prompt_ids, plan.params, plan.template)
        return plan

    def prompt_ids(self, prompt, knobs: dict):
        """A completion body's prompt ids and SamplingParams, admitted (a text that cannot fit is
        refused by its length before it is tokenized)."""
        params = self.params(knobs)
        limit = prompt_limit(self.llm(), params.max_tokens, self.cfg.max_prompt_tokens)
        if isinstance(prompt, str):
            check_length(self.llm().tokenizer, prompt, *limit, param="prompt")
        elif len(prompt) > limit[0]:            # before each id is checked against the vocabulary
            raise ContextLengthError(f"The prompt has {len(prompt)} tokens, over {limit[0]}: {limit[1]}. Shorten "
                                     "it or lower max_tokens.", param="prompt")
        ids = self.llm().tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        self.admit(ids, params)
        return ids, params

    def close(self) -> None:
        if self._llm is not None:
            self._llm.close()
            self._llm = None
