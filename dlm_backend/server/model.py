"""The model behind one server: loaded once off the event loop, its limits, and the slots it holds.

A request takes a slot before anything is queued or a 200 goes out, and gives it back when its
response ends (a stream: when the stream closes, however it closes). The slot is a context manager
that gives it back on leaving, unless a stream took it over with :meth:`Slot.hand_over`: a streamed
request refused before its stream began kept its slot, and eight such 400s left a 4 + 4 server
answering 429 to everyone.

The slots follow the engine's own back-pressure (``LLMEngine.capacity``): its running requests, those
it can start, and ``max_waiting`` more, by sequence slots and by KV pages. A request is checked
twice: for a slot before it is planned, and once planned, with the KV pages it needs now known,
against the pages of the requests this server already holds (``LLMEngine.queue_fits``): a burst of
requests larger than the pool is a 429 with Retry-After for those past ``max_waiting``, never a 200
whose stream then carries an error (the engine refuses no request a server slot holds).
"""

from __future__ import annotations

import asyncio
import dataclasses
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
                self.served.planned.pop(self, None)

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
        self.planned: dict[Slot, int] = {}          # KV pages each planned request needs, in admission order
        self._llm: LLM | None = None
        self._forget = None                         # stops the engine counting this server's slots
        self._load_lock = threading.Lock()

    @property
    def capacity(self) -> int:
        """Requests the shared engine holds now before refusing one (another front door may set its limits)."""
        return self.llm().engine.capacity

    @property
    def loaded(self) -> LLM | None:
        return self._llm

    def llm(self) -> LLM:
        """The model, loaded on first use (a failure is a 503 here; the detail goes to the log)."""
        if self._llm is None:
            try:
                return self.start()
            except DLMError as exc:
                log.error("the model could not be loaded: %s", exc)
                raise Unavailable("The model could not be loaded; the server's log says why.") from None
        return self._llm

    def start(self) -> LLM:
        """Load the model now, before serving: a DLMError says why it cannot be (``dlm serve`` prints
        it as one line, where a lazy load's failure is a 503 for the request that found it)."""
        with self._load_lock:
            if self._llm is None:
                llm = LLM(self.cfg.model, device=self.cfg.device, dtype=self.cfg.dtype,
                          kv_cache_memory=self.cfg.kv_cache_memory, prefix_caching=self.cfg.prefix_caching,
                          tensor_parallel_size=self.cfg.tensor_parallel_size, quantization=self.cfg.quantization,
                          **self.cfg.limits)
                try:
                    if llm.engine.tokenizer is not None:     # the prompt-length bound, before requests
                        longest_token(llm.engine.tokenizer)
                except DLMError:
                    llm.close()
                    raise
                self._forget = llm.engine.add_holder(lambda: self.held)
                self._llm = llm
        return self._llm

    def engine_facts(self) -> dict:
        """What ``/v1/models`` reports of the engine under its ``dlm`` key: the quantization method
        asked for and, once the model is loaded, where its memory went (``MemoryReport``'s fields)."""
        facts: dict = {"quantization": self.cfg.quantization}
        if self._llm is not None:
            facts["memory"] = dataclasses.asdict(self._llm.engine.memory)
        return facts

    def summary(self) -> str:
        """The loaded model in one line, for ``dlm serve``'s start-up: names, quantization, memory."""
        llm = self.llm()
        names = ", ".join(self.cfg.served_names)
        return (f"{names} loaded on {llm.engine.device} (quantization {self.cfg.quantization or 'none'}): "
                f"{llm.engine.memory}")

    async def load(self) -> LLM:
        return self._llm or await asyncio.to_thread(self.llm)

    def reserve(self) -> Slot:
        """A slot for one request, or Busy when the engine holds all it can now (:attr:`capacity`)."""
        engine = self.llm().engine                  # before the lock: a first use loads the model
        with self.lock:
            if self.held >= engine.capacity:
                raise Busy(f"The server is at capacity ({engine.num_running} requests running, {engine.num_queued} "
                           f"waiting for a sequence slot or KV pages, max_waiting {engine.limits.max_waiting}); "
                           "retry shortly.")
            self.held += 1
        return Slot(self)

    def admit(self, slot: Slot, prompt_ids: list[int], params, template: list | None = None) -> None:
        """This server's limits and the engine's own checks, before anything is queued or a 200 goes
        out (a streamed response's errors would otherwise arrive as an event after a 200); then the
        request's KV pages against those of the requests this server holds (Busy past ``max_waiting``)."""
        cfg = self.cfg
        if cfg.max_prompt_tokens is not None and len(prompt_ids) > cfg.max_prompt_tokens:
            raise DLMError(f"The prompt has {len(prompt_ids)} tokens, over this server's limit of "
                           f"{cfg.max_prompt_tokens}; shorten it (fewer documents or turns).", param="messages")
        engine = self.llm().engine
        pages = engine.allocator.pages_for(engine.admit(prompt_ids, params, response_template=template).kv_positions)
        with self.lock:
            if not slot.held:
                return
            if not engine.queue_fits([*self.planned.values(), pages]):
                raise Busy(f"The server is at capacity: the requests it holds fill the KV cache "
                           f"({engine.allocator.num_pages} pages) and {engine.limits.max_waiting} more wait for "
                           "pages; retry shortly.")
            self.planned[slot] = pages

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

    def plan_chat(self, slot: Slot, body, knobs: dict) -> chat.Plan:
        """A chat body planned and admitted under ``slot`` (in a worker thread: a big schema is work)."""
        request = chat.ChatRequest.from_call(body.messages, self.params(knobs), dict(body))
        plan = chat.Plan(self.llm(), request, max_prompt_tokens=self.cfg.max_prompt_tokens)
        self.admit(slot, plan.prompt_ids, plan.params, plan.template)
        return plan

    def prompt_ids(self, slot: Slot, prompt, knobs: dict):
        """A completion body's prompt ids and SamplingParams, admitted under ``slot`` (a text that
        cannot fit is refused by its length before it is tokenized)."""
        params = self.params(knobs)
        limit = prompt_limit(self.llm(), params.max_tokens, self.cfg.max_prompt_tokens)
        if isinstance(prompt, str):
            check_length(self.llm().tokenizer, prompt, *limit, param="prompt")
        elif len(prompt) > limit[0]:            # before each id is checked against the vocabulary
            raise ContextLengthError(f"The prompt has {len(prompt)} tokens, over {limit[0]}: {limit[1]}. Shorten "
                                     "it or lower max_tokens.", param="prompt")
        ids = self.llm().tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        self.admit(slot, ids, params)
        return ids, params

    def close(self) -> None:
        if self._llm is not None:
            self._forget()
            self._llm.close()
            self._llm = None
