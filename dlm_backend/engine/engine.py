"""The engine: admits requests, schedules denoising passes, reports what each request committed.

It never touches tensors (the :class:`ModelRunner` does), loads nothing itself (engine/checkpoint/load.py)
and keeps no per-request state outside :class:`Sequence`. ``step()`` advances every scheduled
request by one pass and returns a chunk for each request that committed output.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from dlm_backend.engine.checkpoint.load import Checkpoint, open_checkpoint
from dlm_backend.engine.engine_config import EngineConfig, EngineLimits
from dlm_backend.engine.forward.runner import ModelRunner
from dlm_backend.engine.forward.workers import start as start_workers
from dlm_backend.engine.kernels import resolve_kernels
from dlm_backend.engine.kv import PageAllocator
from dlm_backend.engine.kv.sizing import make_pool
from dlm_backend.engine.metrics import EngineStats, MemoryReport
from dlm_backend.engine.outputs import StreamChunk
from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.quant.methods import quantized_summary
from dlm_backend.engine.requests import schedule_class
from dlm_backend.engine.requests.admission import admit, find_sampler
from dlm_backend.engine.requests.sequence import ScheduledBatch, Sequence
from dlm_backend.engine.samplers.base import Sampler
from dlm_backend.engine.samplers.random import ReplayRandom
from dlm_backend.engine.scheduler import Scheduler, fifo_fit
from dlm_backend.errors import ParallelWorkerError, QueueFullError, SamplingParamsError

log = logging.getLogger(__name__)


class LLMEngine:
    """Synchronous engine: ``add_request`` then ``step`` until ``has_unfinished`` is False."""

    def __init__(self, config: EngineConfig, limits: EngineLimits | None = None):
        from dlm_backend.plugins import registered_samplers

        self.config = config
        self._holders: list[Callable[[], int]] = []      # front doors' places (add_holder)
        tp, self.workers = start_workers(config) if config.tensor_parallel_size > 1 else (None, None)
        try:
            self._build(config, tp, registered_samplers(), limits)
        except BaseException:
            if self.workers is not None:            # they would wait for a forward that never comes
                self.workers.close(abort=True)
            raise

    def _build(self, config: EngineConfig, tp, samplers, limits) -> None:
        self.device, self.dtype = tp.device if tp else config.torch_device, config.torch_dtype
        triton = resolve_kernels(config.kernels, self.device)      # before the weights load
        self.checkpoint: Checkpoint = open_checkpoint(config, tp)
        model = self.checkpoint.model
        self.samplers: dict[str, Sampler] = {name: cls() for name, cls in samplers.items()}
        if "sampler" in self.sampling_defaults:
            try:
                find_sampler(self.samplers, self.sampling_defaults["sampler"])
            except SamplingParamsError as exc:
                raise SamplingParamsError(f"{self.checkpoint.folder / 'generation_config.json'}: 'dlm_sampling' "
                                          f"names a sampler that is not registered. {exc}") from None
        pool = make_pool(model, config.kv_cache_memory, self.dtype, self.device, tp)
        self.page_size = pool.page_size
        # On GPU the pool takes a share of what the weights left free, so quantized weights buy pages.
        self.memory = MemoryReport(sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())),
                                   pool.nbytes, pool.num_pages, pool.page_size, quantized_summary(model)[0])
        log.info("%s: %s", self.checkpoint.name, self.memory)
        self.allocator = PageAllocator(pool.num_pages, self.page_size)
        self.runner = ModelRunner(model, self.device, self.dtype, self.tokens, pool, triton, config.cuda_graphs,
                                  self.workers)
        self.limits = limits or EngineLimits()
        self.scheduler = Scheduler(self.limits, model.logits_shift, self.allocator, config.prefix_caching)
        self.sequence_class = schedule_class(model.schedule)      # the family names how its requests decode
        self.stats = EngineStats()

    # -- what the checkpoint brings -----------------------------------------------------------

    @property
    def tokenizer(self):
        return self.checkpoint.tokenizer

    @property
    def tokens(self):
        return self.checkpoint.tokens

    @property
    def model(self):
        """The loaded model (this rank's shard): for tools that check its forward, such as ``dlm parity``."""
        return self.checkpoint.model

    @property
    def model_args(self):
        return self.model.args

    @property
    def sampling_defaults(self) -> dict:
        return self.checkpoint.sampling_defaults

    @property
    def architecture(self) -> str:
        return type(self.checkpoint.model).__name__

    @property
    def max_model_len(self) -> int:
        own = self.model_args.max_positions
        return min(self.limits.max_model_len or own, own)

    # -- requests ---------------------------------------------------------------------------

    def set_limits(self, **changes) -> None:
        """Change limits on the running engine (fields of :class:`EngineLimits`; None = keep)."""
        values = {**vars(self.limits), **{k: v for k, v in changes.items() if v is not None}}
        self.limits = EngineLimits(**values)
        self.scheduler.limits = self.limits

    def admit(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
              response_template: list[int | None] | None = None) -> Sequence:
        """Check one request and build its :class:`Sequence` without queueing it (a DLMError on bad
        input): a server admits before a streamed response's 200 goes out, and queues what it got.

        ``response_template`` fixes output tokens in advance (``None`` = a slot to denoise); it must
        fit in ``max_tokens``. A sampler made for another family's schedule is refused.
        """
        self._check_schedule(params)
        return admit(self, prompt_token_ids, params, request_id, response_template)

    def _decodes(self, sampler: Sampler) -> bool:
        """Whether ``sampler`` decodes this model's requests: it names no schedules, or one this
        model's schedule is (or derives from: a plugin's variant of the full-sequence canvas)."""
        return sampler.schedules is None or any(issubclass(self.sequence_class, schedule_class(name))
                                                for name in sampler.schedules)

    def _check_schedule(self, params: SamplingParams) -> None:
        """A SamplingParamsError when ``params.sampler`` is made for other schedules than this model's
        (``Sampler.schedules``): LLaDA's rule on an SDAR checkpoint decoded silently."""
        if not isinstance(params, SamplingParams):
            return                                   # admission's to refuse, naming the type
        sampler, model = self.samplers.get(params.sampler), self.checkpoint.model
        if sampler is None or self._decodes(sampler):
            return                                   # an unknown name is admission's to refuse
        fits = sorted(n for n, s in self.samplers.items() if s.noise == model.noise and self._decodes(s))
        raise SamplingParamsError(
            f"Sampler {params.sampler!r} is made for models decoded with the "
            f"{' or '.join(map(repr, sampler.schedules))} schedule, and {self.architecture} is decoded with "
            f"{model.schedule!r}. Use one of its family's samplers: {', '.join(fits)}.", param="sampler")

    def enqueue(self, seq: Sequence, draws: list[dict] | None = None) -> Sequence:
        """Queue an admitted request; a QueueFullError past ``max_waiting``. ``draws`` replays a
        recorded run's random draws instead of drawing (samplers/random.py ``ReplayRandom``: ``dlm
        parity`` checks a sampled reference run with it)."""
        if self.failure is not None:
            raise self.failure
        if self.is_full:
            self.stats.record_rejected()
            raise QueueFullError(f"The engine's queue is full ({self.num_queued} requests waiting for a sequence "
                                 f"slot or KV pages; max_waiting is {self.limits.max_waiting}). Retry shortly, or "
                                 "raise max_waiting or the KV cache (kv_cache_memory).")
        if draws is not None:
            seq.random = ReplayRandom(draws, self.device)
        self.scheduler.add(seq)
        return seq

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    response_template: list[int | None] | None = None, draws: list[dict] | None = None) -> Sequence:
        """Admit and queue one request (:meth:`admit`, :meth:`enqueue`); raises a DLMError (and queues
        nothing) on bad input."""
        return self.enqueue(self.admit(prompt_token_ids, params, request_id, response_template), draws)

    def abort(self, request_id: str) -> StreamChunk | None:
        """Cancel a request now, freeing its slot and cache; returns its final chunk (None if unknown)."""
        seq = self.scheduler.find(request_id)
        if seq is None:
            return None
        seq.finish("abort")
        chunk = seq.take_chunk(time.monotonic())
        self.stats.record_finish("abort")
        self.scheduler.remove_finished()
        return chunk

    @property
    def failure(self) -> ParallelWorkerError | None:
        """Why this engine can run no more (a tensor-parallel worker died); None while it can."""
        if self.workers is None or self.workers.healthy:
            return None
        return self.workers.failure()

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    @property
    def num_queued(self) -> int:
        """Waiting requests the next step cannot start, for want of a sequence slot or of their KV
        pages: what ``max_waiting`` bounds (a request that can start at once is not queued)."""
        return len(self.scheduler.waiting) - self.scheduler.startable()

    @property
    def capacity(self) -> int:
        """How many requests (running and waiting) the engine holds now before it refuses one: those
        running, those the next step can start, and ``max_waiting`` more. While every waiting request
        can start, each free sequence slot counts (a request not yet here needs pages nobody knows);
        once one cannot, every request behind it waits too, so only those ahead of it count."""
        running, waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        start = self.scheduler.startable()
        free = max(0, self.limits.max_num_seqs - running) if start == waiting else start
        return running + free + self.limits.max_waiting

    @property
    def is_full(self) -> bool:
        """No room for another request: ``max_waiting`` requests already wait for a sequence slot or
        for KV pages (requests that can start at the next step do not count, so a burst into an idle
        engine is never refused while slots and pages last), and no front door holds a place unused.

        With 85 KV pages and requests of 46, one runs and the rest wait whatever ``max_num_seqs``
        says: counting free sequence slots instead let 15 wait under a ``max_waiting`` of 6.
        """
        held = sum(count() for count in self._holders)
        return self.num_queued >= self.limits.max_waiting and self.scheduler.num_unfinished >= held

    def add_holder(self, held: Callable[[], int]) -> Callable[[], None]:
        """Count a front door's places: ``held()`` is how many requests it has accepted and not
        finished (a server's slots, taken before a request is planned and kept between its
        generations). While the doors hold more places than the engine has requests, none is refused:
        a request a door accepted never meets a full queue later, where a streamed one would fail
        after its 200. The door bounds its places itself (:meth:`capacity`, :meth:`queue_fits`).
        Returns the function that stops counting them."""
        self._holders.append(held)
        return lambda: self._holders.remove(held)

    def queue_fits(self, demands: list[int]) -> bool:
        """Whether requests needing ``demands`` KV pages each, in arrival order and alone on this
        engine, leave at most ``max_waiting`` of them waiting: a front door's check of the requests
        it holds (each one's pages are known once it is admitted) before it takes one more."""
        started = fifo_fit(demands, self.limits.max_num_seqs, self.allocator.num_pages)
        return len(demands) - started <= self.limits.max_waiting

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    # -- stepping ---------------------------------------------------------------------------

    def step(self) -> list[StreamChunk]:
        """One denoising pass for the scheduled requests; chunks for those that committed output."""
        now = time.monotonic
        # Requests finished before their first pass (a template fixing every slot) report at once.
        chunks = [seq.take_chunk(now()) for seq in self.scheduler.remove_finished()]
        scheduled = self.scheduler.schedule()
        batch = scheduled.seqs
        if batch:
            self._run_isolated(scheduled)
        if self.failure is not None:          # nothing can run again: every request still here fails now
            lost = [s for s in (*self.scheduler.running, *self.scheduler.waiting) if s not in batch]
            for seq in (*batch, *lost):
                if not seq.is_finished:
                    seq.fail(self.failure)
            chunks += [seq.take_chunk(now()) for seq in lost]
        for seq in batch:
            chunk = seq.take_chunk(now())
            if chunk.delta_token_ids or chunk.delta_text or chunk.finished or chunk.canvas:
                chunks.append(chunk)
        if batch:
            self.stats.record_step(len(batch), sum(len(c.delta_token_ids) for c in chunks))
        for chunk in chunks:
            if chunk.finished:
                self.stats.record_finish("error" if chunk.error else chunk.finish_reason)
        for seq in batch:                     # prompt pages now cached become shareable
            if not seq.is_finished and self.config.prefix_caching:
                for page, h in seq.clean_prompt_pages(self.page_size):
                    self.allocator.publish(page, h)
        self.scheduler.remove_finished()
        return chunks

    def _run_isolated(self, scheduled: ScheduledBatch) -> None:
        """Run one pass; if it fails, retry the requests one by one (each planned again: some may
        have recorded their pass) so only the culprit fails."""
        batch = scheduled.seqs
        passes = {s.seq_id: s.num_forward_passes for s in batch}
        try:
            self.runner.step(scheduled)
            return
        except ParallelWorkerError:
            return                                # step() fails every request of a failed engine
        except Exception as exc:  # noqa: BLE001 - any failure must stay inside its request
            if len(batch) == 1:
                batch[0].fail(exc)
                return
        for seq in batch:
            if seq.num_forward_passes == passes[seq.seq_id] and not seq.is_finished:
                try:
                    self.runner.step(self.scheduler.plan([seq]))
                except Exception as exc:  # noqa: BLE001
                    seq.fail(exc)

    def close(self) -> list[StreamChunk]:
        """Abort what is still queued or running (their final chunks are returned) and free the
        weights, caches and graphs; the engine takes no requests afterwards."""
        chunks = []
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            seq.finish("abort")
            chunks.append(seq.take_chunk(time.monotonic()))
        self.scheduler.remove_finished()
        self.runner.close()
        return chunks
