"""The paged KV cache (engine/kv/): pages owned and returned, prompt pages shared by hash (exactly),
the pool sized by its memory budget. Admission by free pages: test_scheduler.py; a request larger
than the whole cache: requests/test_admission.py."""

import shutil

import pytest
import torch
from tests.helpers import FIXTURES

from dlm_backend import LLM, SamplingParams
from dlm_backend.errors import SamplingParamsError
from dlm_backend.engine.kv import KVPool, PageAllocator, page_hashes

SDAR = FIXTURES / "parity-block" / "sdar-tiny"
FASTDLLM = FIXTURES / "parity-block" / "fastdllm2-tiny"


def test_pages_are_held_shared_by_hash_and_evicted_least_recently_released_first():
    alloc = PageAllocator(num_pages=6, page_size=4)
    h = page_hashes(list(range(12)), 4, 3)
    a, shared = alloc.reserve(4, h)                       # nothing cached yet
    assert shared == 0 and len(set(a)) == 4 and alloc.num_free == 2
    for page, key in zip(a, h):
        alloc.publish(page, key)
    b, shared = alloc.reserve(4, h[:2])                   # the first two prompt pages are a's
    assert shared == 2 and b[:2] == a[:2] and alloc.num_free == 0
    assert alloc.reserve(1, []) is None                   # nothing free: the request waits
    alloc.release(a)
    assert alloc.num_free == 2                            # a's own pages; the shared ones b still holds
    alloc.release(b)
    assert alloc.num_free == 6 and alloc.hits == 2 and alloc.lookups == 5
    c, shared = alloc.reserve(6, [])                      # needs every page: cached prefixes are evicted
    assert shared == 0 and sorted(c) == list(range(6))
    assert alloc.reserve(1, h[:1]) is None                # and forgotten


def test_a_chained_hash_names_the_whole_prefix_not_the_page_alone():
    x = page_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, 2)
    y = page_hashes([9, 9, 9, 9, 5, 6, 7, 8], 4, 2)
    assert x[1] != y[1] and page_hashes([1, 2, 3, 4], 4, 1, seed=8) != x[:1]


def test_the_pool_is_sized_by_its_memory_budget():
    llm = LLM(str(SDAR), dtype="float32", kv_cache_memory=1 << 20)
    a, pool = llm.engine.model_args, llm.engine.runner.pool
    page = KVPool.page_bytes(a.kv_shapes, pool.page_size, pool.dtype)
    assert pool.num_pages == (1 << 20) // page and pool.nbytes <= (1 << 20) + 2 * page


def _run(llm, prompts, params):
    return [(o.token_ids, o.num_forward_passes) for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]


@pytest.mark.parametrize("folder", [SDAR, FASTDLLM], ids=["sdar", "fastdllm2"])
def test_shared_prompt_pages_change_no_token_and_save_the_prefill(folder):
    system = list(range(3, 3 + 48))                      # three pages of a shared "system prompt"
    prompts = [system + [100 + i, 101 + i, 102] for i in range(4)] + [system]
    params = SamplingParams(max_tokens=12, cache="prefix", ignore_eos=True)
    mask = {"mask_token_id": 500} if folder == FASTDLLM else {}          # Fast-dLLM's is in its tokenizer
    cold = LLM(str(folder), dtype="float32", prefix_caching=False, config_overrides=mask)
    want = [cold.generate(prompt_token_ids=[p], sampling_params=params.replace(sampler=cold.sampling_params().sampler))[0]
            for p in prompts]
    warm = LLM(str(folder), dtype="float32", config_overrides=mask)
    p = params.replace(sampler=warm.sampling_params().sampler)
    first = warm.generate(prompt_token_ids=[prompts[0]], sampling_params=p)[0]
    rest = warm.generate(prompt_token_ids=prompts[1:], sampling_params=p)
    assert [o.token_ids for o in [first, *rest]] == [o.token_ids for o in want]
    assert [o.num_forward_passes for o in [first, *rest]] == [o.num_forward_passes for o in want]
    kv = warm.engine.allocator
    assert kv.hits >= 2 * len(rest) and 0 < kv.hit_rate <= 1


def test_a_page_is_shared_while_it_is_being_written_and_forgotten_if_never_written():
    alloc = PageAllocator(num_pages=8, page_size=4)
    h = page_hashes(list(range(8)), 4, 2)
    a, shared = alloc.reserve(3, h, writer=1)
    assert shared == 0 and alloc.writer(h[0]) == 1 and not alloc.written(h[0])
    b, shared = alloc.reserve(3, h, writer=2)              # admitted in the same step: shares a's pending pages
    assert shared == 2 and b[:2] == a[:2]
    alloc.publish(a[0], h[0])
    assert alloc.written(h[0]) and alloc.writer(h[0]) is None and alloc.writer(h[1]) == 1
    alloc.release(a)                                        # a ends before writing its second page
    alloc.release(b)
    assert alloc.writer(h[1]) is None and alloc.num_free == 8
    c, shared = alloc.reserve(2, h, writer=3)
    assert shared == 1 and c[0] == a[0]                     # the written page is still cached, the other is not


def _engine_run(engine, prompts, params, abort_first_after=None):
    ids = [engine.add_request(p, params).request_id for p in prompts]
    done, steps = {}, 0
    while engine.has_unfinished:
        if steps == abort_first_after:
            done[ids[0]] = engine.abort(ids[0]).output
        done.update({c.request_id: c.output for c in engine.step() if c.finished})
        steps += 1
    return [done.get(i) for i in ids]


def test_requests_admitted_together_compute_their_shared_prompt_once():
    system = list(range(100, 100 + 64))                    # four pages no other test uses
    prompts = [system + [200 + i, 7, 8] for i in range(4)]
    params = SamplingParams(sampler="sdar", max_tokens=12, ignore_eos=True)
    solo = LLM(str(SDAR), dtype="float32", prefix_caching=False)
    want = [solo.generate(prompt_token_ids=[p], sampling_params=params)[0].token_ids for p in prompts]
    llm = LLM(str(SDAR), dtype="float32")
    hits = llm.engine.allocator.hits
    outs = _engine_run(llm.engine, prompts, params)
    assert [o.token_ids for o in outs] == want
    assert llm.engine.allocator.hits - hits == 3 * 4        # three requests found all four pages
    # The first writes them in its prefill; the others wait for it and have no prefill of their own
    # (their own tokens sit in the first decoded block).
    assert [o.num_cache_passes for o in outs] == [outs[0].num_cache_passes] + [outs[0].num_cache_passes - 1] * 3


def test_when_the_writer_of_a_shared_page_ends_first_another_request_writes_it():
    system = list(range(200, 200 + 64))
    prompts = [system + [200 + i, 7, 8] for i in range(3)]
    params = SamplingParams(sampler="sdar", max_tokens=12, ignore_eos=True)
    solo = LLM(str(SDAR), dtype="float32", prefix_caching=False)
    want = [solo.generate(prompt_token_ids=[p], sampling_params=params)[0].token_ids for p in prompts]
    llm = LLM(str(SDAR), dtype="float32")
    outs = _engine_run(llm.engine, prompts, params, abort_first_after=1)   # after admission, before its prefill
    assert outs[0].finish_reason == "abort" and [o.token_ids for o in outs[1:]] == want[1:]
    assert llm.engine.allocator.num_used == 0


def test_layers_of_different_shapes_get_pages_of_their_own_size():
    # DiffusionGemma-like: two sliding layers (2 heads of 16), a full one (1 head of 32), then one more sliding
    shapes = [(2, 16), (2, 16), (1, 32), (2, 16)]
    pool = KVPool(shapes, page_size=16, num_pages=3, dtype=torch.float32, device=torch.device("cpu"))
    assert [tuple(k.shape) for k in pool.k] == [(4, 16, 2, 16)] * 2 + [(4, 16, 1, 32), (4, 16, 2, 16)]
    assert len(pool.groups) == 2                          # one tensor per shape, layers are views of it
    pool.k[3][1, 0] = 7.0
    assert pool.groups[0][0][2, 1, 0].eq(7.0).all()       # layer 3 is the sliding group's third layer
    per_page = KVPool.page_bytes(shapes, 16, torch.float32)
    assert per_page == 2 * 16 * 4 * (3 * 32 + 32) and pool.nbytes == 4 * per_page   # 3 pages + scratch


#: Two 16-token pages whose Python tuple hashes are equal (found by a brute-force search of ~2.9e9
#: candidates): a prefix cache that names pages by ``hash()`` maps one onto the other's keys.
COLLIDING = ([37, 40, 32, 34, 46, 42, 38, 35, 32, 43, 44, 42, 47, 34, 35, 33],
             [35, 38, 33, 34, 47, 41, 47, 39, 47, 33, 34, 35, 34, 39, 44, 37])


def test_pages_whose_python_hashes_collide_get_different_names():
    x, y = COLLIDING
    assert hash(tuple(x)) == hash(tuple(y))                  # the pair still collides under hash()
    assert page_hashes(x, 16, 1, seed=4) != page_hashes(y, 16, 1, seed=4)
    assert page_hashes(x, 16, 1, salt="a") != page_hashes(x, 16, 1, salt="b")   # a salt keeps tenants apart


def test_a_colliding_prompt_never_reads_the_other_prompts_cached_keys():
    # SDAR pages hold 16 positions (blocks of 4): each prompt's first page is shared by name. With
    # names from hash(), Y + tail was answered from X's keys; each must answer as it does alone.
    x, y = COLLIDING
    tail = [5, 6, 7]
    params = SamplingParams(max_tokens=8, ignore_eos=True, cache="prefix")
    with LLM(str(SDAR), dtype="float32", prefix_caching=False) as alone:
        want = [alone.generate(prompt_token_ids=[p + tail], sampling_params=params)[0].token_ids for p in (x, y)]
    with LLM(str(SDAR), dtype="float32") as shared:
        alloc = shared.engine.allocator                      # an engine other tests may share: count from here
        lookups, hits = alloc.lookups, alloc.hits
        got = [shared.generate(prompt_token_ids=[p + tail], sampling_params=params)[0].token_ids for p in (x, y)]
        assert (alloc.lookups - lookups, alloc.hits - hits) == (2, 0)
    assert got == want and want[0] != want[1]


def test_a_cache_salt_shares_prompt_pages_only_within_its_tenant(tmp_path):
    prompt, tail = list(range(10, 42)), [5, 6, 7]                # two full 16-position pages, then the tail
    with LLM(str(shutil.copytree(SDAR, tmp_path / "m")), dtype="float32") as llm:     # a cache of its own
        alloc = llm.engine.allocator
        counts = []
        for salt in ("tenant-a", "tenant-b", "tenant-a", None):
            lookups, hits = alloc.lookups, alloc.hits
            params = SamplingParams(max_tokens=8, ignore_eos=True, cache="prefix", cache_salt=salt)
            out = llm.generate(prompt_token_ids=[prompt + tail], sampling_params=params)[0]
            counts.append((alloc.lookups - lookups, alloc.hits - hits, out.token_ids))
    assert [c[:2] for c in counts] == [(2, 0), (2, 0), (2, 2), (2, 0)]  # b and the unsalted miss a's pages
    assert len({tuple(c[2]) for c in counts}) == 1                     # a salt changes what is shared, not tokens
    with pytest.raises(SamplingParamsError, match="cache_salt must be a string of at most 256"):
        SamplingParams(cache_salt="x" * 257)
