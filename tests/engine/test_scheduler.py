"""Admission and batching (engine/scheduler.py): requests admitted in order by count and by free KV
pages, each step's batch within the token budget, rotating so no request starves, pages returned
when a request ends."""

import pytest

from tests.helpers import FIXTURES

from dlm_backend import LLM, SamplingParams
from dlm_backend.errors import QueueFullError
from dlm_backend.engine.requests.canvas_sequence import CanvasSequence
from dlm_backend.engine.engine_config import EngineLimits
from dlm_backend.engine.kv import PageAllocator
from dlm_backend.engine.samplers.base import TokenInfo
from dlm_backend.engine.samplers.llada import LLaDASampler
from dlm_backend.engine.scheduler import Scheduler
from dlm_backend.engine.requests.sequence import Status

SDAR = FIXTURES / "parity-block" / "sdar-tiny"
TOKENS = TokenInfo(mask_id=9, eos_ids=(2,))


def request(prompt_len: int, cache: str = "none", max_tokens: int = 8) -> CanvasSequence:
    """A full-sequence request (plain Python, no model): its pass feeds prompt + max_tokens rows."""
    params = SamplingParams(sampler="llada", max_tokens=max_tokens, block_length=8, cache=cache)
    return CanvasSequence([1] * prompt_len, params, LLaDASampler(), TOKENS)


def test_requests_are_admitted_in_order_up_to_max_num_seqs():
    sched = Scheduler(EngineLimits(max_num_seqs=2), logits_shift=0, allocator=None)
    seqs = [request(4) for _ in range(3)]
    for s in seqs:
        sched.add(s)
    assert sched.schedule().seqs == seqs[:2] and [s.status for s in seqs] == [Status.RUNNING] * 2 + [Status.WAITING]
    seqs[0].finish("stop")
    assert sched.remove_finished() == [seqs[0]]
    assert sched.schedule().seqs == seqs[1:] and sched.num_unfinished == 2


def test_a_batch_keeps_to_the_token_budget_and_rotates_so_none_starves():
    # Each pass feeds 12 rows (4 prompt + 8 canvas); 30 rows fit two of the three.
    sched = Scheduler(EngineLimits(max_num_batched_tokens=30), logits_shift=0, allocator=None)
    a, b, c = (request(4) for _ in range(3))
    for s in (a, b, c):
        sched.add(s)
    assert sched.schedule().seqs == [a, b]
    assert sched.schedule().seqs == [c, a]                       # the one left out goes first
    assert sched.schedule().seqs == [b, c]
    big = Scheduler(EngineLimits(max_num_batched_tokens=5), logits_shift=0, allocator=None)
    big.add(a)
    assert big.schedule().seqs == [a]                            # over the budget alone: it still runs


def test_admission_waits_for_pages_and_finished_requests_give_them_back():
    alloc = PageAllocator(num_pages=4, page_size=4)
    sched = Scheduler(EngineLimits(), logits_shift=0, allocator=alloc, prefix_caching=False)
    a, b = request(4, cache="dual"), request(4, cache="dual")   # 12 positions: 3 pages each
    sched.add(a)
    sched.add(b)
    assert sched.schedule().seqs == [a] and len(a.pages) == 3 and alloc.num_free == 1
    assert sched.waiting[0] is b and sched.schedule().seqs == [a]    # b waits: its pages are not free
    a.finish("stop")
    sched.remove_finished()
    assert a.pages == [] and alloc.num_free == 4
    assert sched.schedule().seqs == [b] and len(b.pages) == 3
    free = request(4, cache="none")                             # no KV cache: needs no pages
    sched.add(free)
    assert sched.schedule().seqs == [b, free]


def test_admission_waits_for_free_pages_and_outputs_do_not_change():
    # 1 MiB holds 85 pages of sdar-tiny (12 KiB each); a canvas of 12 blocks of 64 takes 48: one at a time.
    llm = LLM(str(SDAR), dtype="float32", kv_cache_memory=1 << 20, config_overrides={"max_position_embeddings": 4096})
    engine = llm.engine
    assert engine.allocator.num_pages == 85
    params = SamplingParams(sampler="sdar", max_tokens=700, block_length=64, steps=1, ignore_eos=True)   # 12 blocks
    prompts = [[5, 6, 7, 8, 9, 10, 11, i] for i in range(3)]
    solo = [llm.generate(prompt_token_ids=[p], sampling_params=params)[0].token_ids for p in prompts]
    ids = [engine.add_request(p, params).request_id for p in prompts]
    engine.step()
    assert (engine.num_running, engine.num_waiting) == (1, 2)          # admitted by pages, not by count
    assert engine.allocator.num_used == 48
    done = {}
    while engine.has_unfinished:
        assert engine.num_running <= 1
        done.update({c.request_id: c.output.token_ids for c in engine.step() if c.finished})
    assert [done[i] for i in ids] == solo and engine.allocator.num_used == 0


def test_startable_counts_in_order_by_sequence_slots_and_pages():
    from dlm_backend.engine.scheduler import fifo_fit

    assert fifo_fit([3, 3, 1], slots=3, pages=7) == 3
    assert fifo_fit([3, 5, 1], slots=3, pages=7) == 1            # the first that does not fit holds back the rest
    assert fifo_fit([0, 0, 0], slots=2, pages=0) == 2 and fifo_fit([], slots=2, pages=5) == 0
    alloc = PageAllocator(num_pages=7, page_size=4)
    sched = Scheduler(EngineLimits(max_num_seqs=3), logits_shift=0, allocator=alloc, prefix_caching=False)
    for seq in (request(4, cache="dual"), request(4, cache="dual"), request(4, cache="dual")):   # 3 pages each
        sched.add(seq)
    assert sched.startable() == 2 and sched.schedule().seqs == list(sched.running) and len(sched.running) == 2
    assert sched.startable() == 0                                 # 1 page left, 3 slots: pages decide


def test_requests_waiting_for_kv_pages_count_against_max_waiting():
    """85 KV pages and requests of 48: one runs whatever max_num_seqs says, so max_waiting bounds the
    others. Counting free sequence slots as room let a server queue 15 under a max_waiting of 6."""
    llm = LLM(str(SDAR), dtype="float32", kv_cache_memory=1 << 20, max_num_seqs=16, max_waiting=2)
    engine = llm.engine
    params = SamplingParams(sampler="sdar", max_tokens=700, block_length=64, steps=1, ignore_eos=True)   # 48 pages
    prompts = [[5, 6, 7, 8, 9, 10, 11, i] for i in range(4)]
    solo = [llm.generate(prompt_token_ids=[p], sampling_params=params)[0].token_ids for p in prompts[:3]]
    ids = [engine.add_request(p, params).request_id for p in prompts[:3]]      # 1 can start, 2 wait for pages
    rejected = engine.stats.rejected
    with pytest.raises(QueueFullError, match="2 requests waiting for a sequence slot or KV pages"):
        engine.add_request(prompts[3], params)
    assert engine.stats.rejected == rejected + 1 and (engine.num_queued, engine.capacity) == (2, 3)
    engine.step()
    assert (engine.num_running, engine.num_waiting, engine.num_queued, engine.capacity) == (1, 2, 2, 3)
    forget = engine.add_holder(lambda: 4)          # a front door that accepted a 4th request gets it queued
    extra = engine.add_request(prompts[3], params).request_id
    forget()
    assert engine.is_full and engine.num_queued == 3
    engine.abort(extra)
    done = {}
    while engine.has_unfinished:
        assert engine.num_running <= 1
        done.update({c.request_id: c.output.token_ids for c in engine.step() if c.finished})
    assert [done[i] for i in ids] == solo and engine.capacity == 16 + 2       # idle: every slot counts again
    llm.close()


def test_the_scheduler_plans_each_request_once_and_planning_changes_nothing():
    # The runner runs the passes the scheduler planned; planning a request again gives the same pass
    # and leaves its state alone (the sampler's block state is made when the pass begins).
    sched = Scheduler(EngineLimits(), logits_shift=0, allocator=None)
    seq = request(4)
    sched.add(seq)
    batch = sched.schedule()
    assert batch.seqs == [seq] and len(batch.passes) == 1 and seq.block_state is None
    assert seq.plan(0) == batch.passes[0] and seq.block_state is None
    seq.begin_pass(batch.passes[0])
    assert seq.block_state is not None and seq.plan(0) == batch.passes[0]
