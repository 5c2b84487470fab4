"""The user-facing ``LLM``: generate, chat and stream, in sync and async forms."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from typing import AsyncIterator, Iterator

from dlm_backend.chat.prompt import prompt_ids
from dlm_backend.chat.tool_calls import normalize_tools
from dlm_backend.engine import shared_engines as shared
from dlm_backend.engine.checkpoint.folder import default_model
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.outputs import GenerationOutput, StreamChunk
from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.sampling_defaults import layered
from dlm_backend.errors import DLMError, EngineError, RequestTimeoutError, TokenizerError


class LLM:
    """A diffusion language model on the local engine.

    ``model`` is a local checkpoint folder or a hub id (``"GSAI-ML/LLaDA-8B-Instruct"``); by default
    ``$DLM_MODEL`` or the embedded dlm-tiny, which runs anywhere without a download. Weights load
    once per process and (model, device, dtype); every ``LLM`` naming the same model shares them and
    their batches. Limits given here (``max_num_seqs``, ``max_waiting``, ...) are set on the shared
    engine; ``None`` keeps its own. ``kv_cache_memory`` (bytes) sizes the KV pages all requests
    share; ``prefix_caching`` shares identical prompt prefixes between them. ``tensor_parallel_size``
    splits the model over that many devices (processes: GPUs, or CPU ranks over gloo), rank 0 here
    scheduling for all (under ``torchrun``, see the README, ranks other than 0 serve as workers inside
    this call and exit when rank 0 closes). ``quantization`` (``"int8"``, ``"int4"`` or ``"fp8"``:
    docs/quantization.md) quantizes a full-precision checkpoint's weights as they load, and is part
    of what engines are shared by; ``llm.engine.memory`` reports what the weights and KV cache took.
    ``close()`` (or ``with LLM(...) as llm:``) returns this handle, and the last handle frees the
    weights and caches. Methods taking ``messages`` render them with the checkpoint's chat template.
    """

    def __init__(self, model: str | None = None, *, device: str | None = None, dtype: str = "auto",
                 revision: str | None = None, kernels: str | None = None, cuda_graphs: bool | None = None,
                 config_overrides: dict | None = None, kv_cache_memory: int | None = None,
                 prefix_caching: bool | None = None, tensor_parallel_size: int | None = None,
                 quantization: str | None = None, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, max_model_len: int | None = None,
                 max_waiting: int | None = None):
        switches = {k: v for k, v in (("kernels", kernels), ("cuda_graphs", cuda_graphs),
                                      ("config_overrides", config_overrides), ("kv_cache_memory", kv_cache_memory),
                                      ("prefix_caching", prefix_caching),
                                      ("tensor_parallel_size", tensor_parallel_size),
                                      ("quantization", quantization)) if v is not None}
        self.config = EngineConfig(model=str(model or default_model()), device=device, dtype=dtype,
                                   revision=revision, **switches)
        self._loop = shared.acquire(self.config, max_num_seqs=max_num_seqs, max_waiting=max_waiting,
                                    max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len)
        self._closed = False

    def close(self) -> None:
        """Return this handle to the shared engine; the last one frees the weights and caches."""
        if not self._closed:
            self._closed = True
            shared.release(self._loop)

    @property
    def closed(self) -> bool:
        """Whether ``close()`` gave this handle back (it cannot be used again)."""
        return self._closed

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def engine(self):
        return self._loop.engine

    @property
    def tokenizer(self):
        if self.engine.tokenizer is None:
            raise TokenizerError(f"{self.config.model} has no tokenizer.json; text prompts and chat need "
                                 "one. Pass prompt_token_ids instead.")
        return self.engine.tokenizer

    def sampling_params(self, **changes) -> SamplingParams:
        """The checkpoint's decoding defaults (its ``generation_config.json``) with ``changes`` applied
        (naming another sampler than the checkpoint's drops them; see :func:`sampling_defaults.layered`);
        a registered sampler's own knobs are taken by name too (``per_pass=4``).

        The one place defaults are layered: every method here uses ``sampling_params()`` when given
        no SamplingParams, and every front door builds its request's parameters here (the adapters
        through ``chat.request_params``); a SamplingParams built by hand is used as it is.
        """
        return SamplingParams(**layered(self.engine.sampling_defaults, changes))

    # -- prompts ------------------------------------------------------------------------------

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None, **template_kwargs) -> list[int]:
        """Token ids of ``messages`` and ``tools`` as every front door sends them (chat/prompt.py: the
        chat template, or tools written in as text where it has no tool listing), ready for the
        assistant turn. OpenAI shapes are accepted (content-part lists, tool calls with JSON-string
        arguments)."""
        return prompt_ids(self.tokenizer, messages, normalize_tools(tools), **template_kwargs)

    def _prompt_ids(self, prompts, prompt_token_ids) -> list[list[int]]:
        if (prompts is None) == (prompt_token_ids is None):
            raise DLMError("Pass exactly one of prompts (text) or prompt_token_ids.")
        if prompts is not None:
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
            if not all(isinstance(p, str) for p in prompts):
                raise DLMError("prompts must be text (a string or a list of strings); pass token ids as "
                               "prompt_token_ids=[...].")
            return [self.tokenizer.encode(p) for p in prompts]
        ids = list(prompt_token_ids)
        if ids and all(isinstance(t, int) for t in ids):
            return [ids]
        if not all(isinstance(p, (list, tuple)) for p in ids):
            raise DLMError("prompt_token_ids must be a list of token ids or a list of such lists, "
                           "e.g. [[1, 2, 3], [4, 5]].")
        return [list(p) for p in ids]

    @contextlib.contextmanager
    def _requests(self, background: bool, timeout: float | None = None):
        """Submit requests; whatever ends the block (done, a later prompt refused, an EngineError,
        Ctrl-C, a cancelled task, a stream closed early) aborts the ones still running, since a
        request left running is batched with every later call. Aborting a finished request is a no-op.
        ``timeout`` (seconds from now) aborts them too; their chunks then raise RequestTimeoutError."""
        batch = _Batch(self._loop, background, timeout)
        try:
            yield batch
        finally:
            batch.close()

    # -- generate -----------------------------------------------------------------------------

    def generate(self, prompts: str | list[str] | None = None, sampling_params: SamplingParams | None = None,
                 *, prompt_token_ids: list[int] | list[list[int]] | None = None,
                 response_template: list[int | None] | None = None, timeout: float | None = None) -> list[GenerationOutput]:
        """Complete raw prompts (no chat template); all are batched together. One output per prompt.

        ``response_template`` fixes output tokens in advance (``None`` marks a slot to denoise).
        ``timeout`` (seconds; every method here takes one) aborts the requests still running when it
        passes, at the end of the engine's current step, and raises RequestTimeoutError.
        """
        params = sampling_params or self.sampling_params()
        with self._requests(background=False, timeout=timeout) as batch:
            queues = []
            for ids in self._prompt_ids(prompts, prompt_token_ids):
                queues.append(queue.Queue())
                batch.submit(ids, params, _final_only(queues[-1].put), response_template)
            return [batch.checked(list(self._loop.drive(q))[-1]).output for q in queues]

    async def agenerate(self, prompts=None, sampling_params: SamplingParams | None = None, *,
                        prompt_token_ids=None, response_template=None, timeout: float | None = None) -> list[GenerationOutput]:
        """``generate`` without blocking the event loop (a background thread steps the engine)."""
        params = sampling_params or self.sampling_params()
        with self._requests(background=True, timeout=timeout) as batch:
            queues = []
            for ids in self._prompt_ids(prompts, prompt_token_ids):
                queues.append(_AsyncQueue())
                batch.submit(ids, params, _final_only(queues[-1].put), response_template)
            return [batch.checked(await q.get()).output for q in queues]

    def chat(self, messages: list[dict], sampling_params: SamplingParams | None = None, *,
             tools: list[dict] | None = None, timeout: float | None = None, **template_kwargs) -> GenerationOutput:
        """Answer one conversation (``[{"role": ..., "content": ...}, ...]``); ``tools`` go into the
        prompt as every front door puts them (:meth:`encode_chat`). The answer is the model's text:
        reading tool calls out of it is the chat layer's (``dlm_backend.chat``)."""
        ids = self.encode_chat(messages, tools, **template_kwargs)
        return self.generate(prompt_token_ids=[ids], sampling_params=sampling_params, timeout=timeout)[0]

    async def achat(self, messages: list[dict], sampling_params: SamplingParams | None = None, *,
                    tools: list[dict] | None = None, timeout: float | None = None, **template_kwargs) -> GenerationOutput:
        """``chat`` without blocking the event loop."""
        ids = self.encode_chat(messages, tools, **template_kwargs)
        return (await self.agenerate(prompt_token_ids=[ids], sampling_params=sampling_params, timeout=timeout))[0]

    # -- stream -------------------------------------------------------------------------------

    def stream(self, prompt: str | None = None, sampling_params: SamplingParams | None = None, *,
               prompt_token_ids: list[int] | None = None, response_template: list[int | None] | None = None,
               timeout: float | None = None) -> Iterator[StreamChunk]:
        """Yield committed output in order as the engine finalises it; the last chunk is ``finished``.
        Bad input raises here, at the call; the request is queued (and ``timeout`` starts) on the
        first ``next()``."""
        ids = self._prompt_ids(prompt, None if prompt_token_ids is None else [prompt_token_ids])[0]
        seq = self.engine.admit(ids, sampling_params or self.sampling_params(), response_template=response_template)

        def chunks():
            q: queue.Queue = queue.Queue()
            with self._requests(background=False, timeout=timeout) as batch:
                batch.enqueue(seq, q.put)
                for chunk in self._loop.drive(q):
                    yield batch.checked(chunk)
        return chunks()

    async def astream(self, prompt: str | None = None, sampling_params: SamplingParams | None = None, *,
                      prompt_token_ids: list[int] | None = None, response_template: list[int | None] | None = None,
                      timeout: float | None = None) -> AsyncIterator[StreamChunk]:
        """``stream`` without blocking the event loop."""
        ids = self._prompt_ids(prompt, None if prompt_token_ids is None else [prompt_token_ids])[0]
        q = _AsyncQueue()
        with self._requests(background=True, timeout=timeout) as batch:
            batch.submit(ids, sampling_params or self.sampling_params(), q.put, response_template)
            while not (chunk := batch.checked(await q.get())).finished:
                yield chunk
            yield chunk

    def stream_chat(self, messages: list[dict], sampling_params: SamplingParams | None = None, *,
                    tools: list[dict] | None = None, timeout: float | None = None,
                    **template_kwargs) -> Iterator[StreamChunk]:
        """Stream the answer to one conversation."""
        return self.stream(prompt_token_ids=self.encode_chat(messages, tools, **template_kwargs),
                           sampling_params=sampling_params, timeout=timeout)

    async def astream_chat(self, messages: list[dict], sampling_params: SamplingParams | None = None, *,
                           tools: list[dict] | None = None, timeout: float | None = None,
                           **template_kwargs) -> AsyncIterator[StreamChunk]:
        """``stream_chat`` without blocking the event loop."""
        ids = self.encode_chat(messages, tools, **template_kwargs)
        chunks = self.astream(prompt_token_ids=ids, sampling_params=sampling_params, timeout=timeout)
        async with contextlib.aclosing(chunks) as s:
            async for chunk in s:
                yield chunk


class _AsyncQueue:
    """Thread-safe handoff from the engine thread into the caller's event loop."""

    def __init__(self):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def get(self):
        return await self._queue.get()


class _Batch:
    """The requests of one call: submitted through it, aborted when the call ends, or when its
    ``timeout`` passes. The abort then runs in a timer thread, since it waits for the engine's
    current step, which neither the caller's thread nor its event loop should."""

    def __init__(self, loop, background: bool, timeout: float | None):
        self.loop, self.background, self.ids = loop, background, []
        self.timeout, self.timed_out, self._timer = timeout, False, None
        if timeout is not None:
            if timeout <= 0:
                raise self.expired()
            self._timer = threading.Timer(timeout, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def expired(self) -> RequestTimeoutError:
        return RequestTimeoutError(f"The request did not finish in time: its timeout ({max(self.timeout, 0):.3g} s "
                                   "from when it was queued) passed, so it was aborted and its engine slot freed.")

    def _expire(self) -> None:
        self.timed_out = True
        for request_id in list(self.ids):
            self.loop.abort(request_id)

    def submit(self, prompt_ids, params, sink, template=None) -> str:
        return self.enqueue(self.loop.engine.admit(prompt_ids, params, response_template=template), sink)

    def enqueue(self, seq, sink) -> str:
        """Queue an admitted request (``LLMEngine.admit``) as one of this call's."""
        if self.timed_out:
            raise self.expired()
        self.ids.append(self.loop.enqueue(seq, sink, background=self.background))
        if self.timed_out:                  # expired while this one was being queued
            self.loop.abort(self.ids[-1])
        return self.ids[-1]

    def checked(self, chunk: StreamChunk) -> StreamChunk:
        """``chunk``, or the error it carries: the engine's, or this call's timeout."""
        if chunk.finished and chunk.finish_reason == "abort" and self.timed_out:
            raise self.expired()
        if chunk.error:
            failure = self.loop.engine.failure
            if failure is not None:                 # the engine itself failed (a lost worker), not this request
                raise failure
            raise EngineError(f"Request {chunk.request_id} failed inside the engine: {chunk.error}")
        return chunk

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for request_id in self.ids:
            self.loop.abort(request_id)


def _final_only(put):
    return lambda chunk: put(chunk) if chunk.finished else None
