"""The user-facing ``LLM``: generate, chat and stream, in sync and async forms."""

from __future__ import annotations

import asyncio
import queue
import threading
from contextlib import aclosing
from typing import AsyncIterator, Iterator

from dlm_backend.engine.engine import EngineConfig, LLMEngine
from dlm_backend.engine.loader import default_model
from dlm_backend.engine.loop import EngineLoop
from dlm_backend.engine.outputs import GenerationOutput, StreamChunk
from dlm_backend.engine.params import SamplingParams, layered
from dlm_backend.errors import DLMError, EngineError, TokenizerError

_shared: dict[tuple, EngineLoop] = {}
_loading: dict[tuple, threading.Lock] = {}
_shared_lock = threading.Lock()


def _engine_loop(config: EngineConfig) -> EngineLoop:
    """One engine per (model, device, dtype, limits) in the process, shared by every front door.

    Each model loads under its own lock, so requests for a model already loaded never wait while
    another one loads (tens of seconds for an 8B checkpoint).
    """
    key = tuple(vars(config).values())
    loop = _shared.get(key)
    if loop is not None:
        return loop
    with _shared_lock:
        lock = _loading.setdefault(key, threading.Lock())
    with lock:
        loop = _shared.get(key)
        if loop is None:
            loop = _shared[key] = EngineLoop(LLMEngine(config))
        return loop


class LLM:
    """A masked-diffusion language model on the local engine.

    ``model`` is a local checkpoint folder or a hub id (``"GSAI-ML/LLaDA-8B-Instruct"``); by default
    ``$DLM_MODEL`` or the embedded dlm-tiny, which runs anywhere without a download. Weights load
    once per process and configuration; every ``LLM`` naming the same model shares them and their
    batches. Methods taking ``messages`` render them with the checkpoint's chat template.
    """

    def __init__(self, model: str | None = None, *, device: str | None = None, dtype: str = "auto",
                 revision: str | None = None, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 32768, max_model_len: int | None = None,
                 max_waiting: int = 1024):
        self.config = EngineConfig(model=str(model or default_model()), device=device, dtype=dtype, revision=revision,
                                   max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                   max_model_len=max_model_len, max_waiting=max_waiting)
        self._loop = _engine_loop(self.config)

    @property
    def engine(self) -> LLMEngine:
        return self._loop.engine

    @property
    def tokenizer(self):
        if self.engine.tokenizer is None:
            raise TokenizerError(f"{self.config.model} has no tokenizer.json; text prompts and chat need "
                                 "one. Pass prompt_token_ids instead.")
        return self.engine.tokenizer

    def sampling_params(self, **changes) -> SamplingParams:
        """The checkpoint's decoding defaults (its ``generation_config.json``) with ``changes`` applied
        (naming another sampler than the checkpoint's drops them; see :func:`params.layered`).

        Every method here uses ``sampling_params()`` when given no SamplingParams; a SamplingParams
        built by hand is used as it is.
        """
        return SamplingParams(**layered(self.engine.sampling_defaults, changes))

    # -- prompts ------------------------------------------------------------------------------

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None, **template_kwargs) -> list[int]:
        """Token ids of ``messages`` rendered with the chat template, ready for the assistant turn.
        OpenAI shapes are accepted (content-part lists, tool calls with JSON-string arguments)."""
        from dlm_backend.chat.messages import normalize_messages    # chat builds on the engine, not back

        messages = normalize_messages(messages)
        return self.tokenizer.encode(self.tokenizer.apply_chat_template(messages, tools=tools, **template_kwargs))

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

    # -- sync ---------------------------------------------------------------------------------

    def generate(self, prompts: str | list[str] | None = None, sampling_params: SamplingParams | None = None,
                 *, prompt_token_ids: list[int] | list[list[int]] | None = None,
                 response_template: list[int | None] | None = None) -> list[GenerationOutput]:
        """Complete raw prompts (no chat template); all are batched together. One output per prompt.

        ``response_template`` fixes output tokens in advance (``None`` marks a slot to denoise).
        """
        params = sampling_params or self.sampling_params()
        batches = self._prompt_ids(prompts, prompt_token_ids)
        results: list[queue.Queue] = [queue.Queue() for _ in batches]
        submitted = []
        try:
            for ids, q in zip(batches, results):
                submitted.append(self._loop.submit(ids, params, _final_only(q.put),
                                                   response_template=response_template))
            return [_unwrap(list(self._loop.drive(q))[-1]) for q in results]
        except BaseException:
            # A later prompt refused, an EngineError, Ctrl-C: nobody will read the rest, and a
            # request left running is batched with every later call (0.009 s became 0.42 s).
            for request_id in submitted:
                self._loop.abort(request_id)
            raise

    def chat(self, messages: list[dict], sampling_params: SamplingParams | None = None, *,
             tools: list[dict] | None = None, **template_kwargs) -> GenerationOutput:
        """Answer one conversation (``[{"role": ..., "content": ...}, ...]``)."""
        ids = self.encode_chat(messages, tools, **template_kwargs)
        return self.generate(prompt_token_ids=[ids], sampling_params=sampling_params)[0]

    def stream(self, prompt: str | None = None, sampling_params: SamplingParams | None = None, *,
               prompt_token_ids: list[int] | None = None,
               response_template: list[int | None] | None = None) -> Iterator[StreamChunk]:
        """Yield committed output in order as the engine finalises it; the last chunk is ``finished``."""
        ids = self._prompt_ids(prompt, None if prompt_token_ids is None else [prompt_token_ids])[0]
        return self._stream_ids(ids, sampling_params or self.sampling_params(), response_template)

    def stream_chat(self, messages: list[dict], sampling_params: SamplingParams | None = None, *,
                    tools: list[dict] | None = None, **template_kwargs) -> Iterator[StreamChunk]:
        """Stream the answer to one conversation."""
        return self._stream_ids(self.encode_chat(messages, tools, **template_kwargs),
                                sampling_params or self.sampling_params())

    def _stream_ids(self, ids: list[int], params: SamplingParams,
                    response_template: list[int | None] | None = None) -> Iterator[StreamChunk]:
        q: queue.Queue = queue.Queue()
        self.engine.check(ids, params, response_template)     # bad input raises here, at the call

        def chunks():
            # Submitted on the first next(): a stream never iterated queues nothing.
            request_id = self._loop.submit(ids, params, q.put, response_template=response_template)
            finished = False
            try:
                for chunk in self._loop.drive(q):
                    finished = chunk.finished
                    if chunk.error:
                        raise EngineError(f"Request {chunk.request_id} failed: {chunk.error}")
                    yield chunk
            finally:
                if not finished:   # consumer stopped early: free the slot at the next step
                    self._loop.abort(request_id)

        return chunks()

    # -- async --------------------------------------------------------------------------------

    async def agenerate(self, prompts=None, sampling_params: SamplingParams | None = None, *,
                        prompt_token_ids=None, response_template=None) -> list[GenerationOutput]:
        """``generate`` without blocking the event loop."""
        params = sampling_params or self.sampling_params()
        futures, request_ids = [], []
        try:
            for ids in self._prompt_ids(prompts, prompt_token_ids):
                q = _AsyncQueue()
                request_ids.append(self._loop.submit(ids, params, _final_only(q.put), background=True,
                                                     response_template=response_template))
                futures.append(q.get())
            gathered, futures = asyncio.gather(*futures), []
            chunks = await gathered
        except BaseException:
            # Cancelled (a client went away, a timeout) or a later prompt was refused: free the
            # slots now rather than finishing work nobody will read. Aborting a finished id is a no-op.
            for request_id in request_ids:
                self._loop.abort(request_id)
            for future in futures:     # coroutines never handed to gather
                future.close()
            raise
        return [_unwrap(chunk) for chunk in chunks]

    async def achat(self, messages: list[dict], sampling_params: SamplingParams | None = None, *,
                    tools: list[dict] | None = None, **template_kwargs) -> GenerationOutput:
        """``chat`` without blocking the event loop."""
        ids = self.encode_chat(messages, tools, **template_kwargs)
        return (await self.agenerate(prompt_token_ids=[ids], sampling_params=sampling_params))[0]

    async def astream(self, prompt: str | None = None, sampling_params: SamplingParams | None = None, *,
                      prompt_token_ids: list[int] | None = None,
                      response_template: list[int | None] | None = None) -> AsyncIterator[StreamChunk]:
        """``stream`` without blocking the event loop."""
        ids = self._prompt_ids(prompt, None if prompt_token_ids is None else [prompt_token_ids])[0]
        async with aclosing(self._astream_ids(ids, sampling_params or self.sampling_params(), response_template)) as s:
            async for chunk in s:
                yield chunk

    async def astream_chat(self, messages: list[dict], sampling_params: SamplingParams | None = None, *,
                           tools: list[dict] | None = None, **template_kwargs) -> AsyncIterator[StreamChunk]:
        ids = self.encode_chat(messages, tools, **template_kwargs)
        async with aclosing(self._astream_ids(ids, sampling_params or self.sampling_params())) as s:
            async for chunk in s:
                yield chunk

    async def _astream_ids(self, ids: list[int], params: SamplingParams,
                           response_template: list[int | None] | None = None) -> AsyncIterator[StreamChunk]:
        q = _AsyncQueue()
        request_id = self._loop.submit(ids, params, q.put, background=True, response_template=response_template)
        finished = False
        try:
            while not finished:
                chunk = await q.get()
                finished = chunk.finished
                if chunk.error:
                    raise EngineError(f"Request {chunk.request_id} failed: {chunk.error}")
                yield chunk
        finally:
            if not finished:
                self._loop.abort(request_id)


class _AsyncQueue:
    """Thread-safe handoff from the engine thread into the caller's event loop."""

    def __init__(self):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def get(self):
        return await self._queue.get()


def _final_only(put):
    return lambda chunk: put(chunk) if chunk.finished else None


def _unwrap(chunk: StreamChunk) -> GenerationOutput:
    if chunk.error:
        raise EngineError(f"Request {chunk.request_id} failed inside the engine: {chunk.error}")
    return chunk.output
