"""Block-diffusion requests (engine/requests/block_sequence.py) beyond the reference fixtures: mixed batches, what
streaming emits and when, stop tokens, empty prompts and response templates."""

import pytest
from tests.helpers import FIXTURES

from dlm_backend import LLM, SamplingParams
from dlm_backend.errors import DLMError

SDAR = FIXTURES / "parity-block" / "sdar-tiny"
LLADA2 = FIXTURES / "parity-block" / "llada2-tiny"
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32], [40, 41, 42]]


@pytest.fixture(scope="module")
def sdar():
    return LLM(str(SDAR), dtype="float32")


@pytest.fixture(scope="module")
def llada2():
    return LLM(str(LLADA2), dtype="float32", config_overrides={"mask_token_id": 494})


def test_a_mixed_batch_gives_every_request_its_solo_output(sdar):
    """Samplers, cache modes (paged and unpaged passes packed in one forward) and lengths mixed."""
    configs = [SamplingParams(sampler="sdar", max_tokens=20, cache="prefix", ignore_eos=True),
               SamplingParams(sampler="sdar", max_tokens=13, cache="none", ignore_eos=True),
               SamplingParams(sampler="threshold", threshold=0.3, max_tokens=16, cache="dual", ignore_eos=True),
               SamplingParams(sampler="llada2", max_tokens=9, steps=2, cache="prefix", ignore_eos=True)]
    jobs = [(p, c) for p in PROMPTS for c in configs]
    solo = [sdar.generate(prompt_token_ids=[p], sampling_params=c)[0] for p, c in jobs]
    engine = sdar.engine
    ids = [engine.add_request(p, c).request_id for p, c in jobs]
    done = {}
    while engine.has_unfinished:
        done.update({ch.request_id: ch.output for ch in engine.step() if ch.finished})
    for (p, c), want, rid in zip(jobs, solo, ids):
        got = done[rid]
        assert (got.token_ids, got.num_forward_passes) == (want.token_ids, want.num_forward_passes), c


def test_streaming_emits_what_is_final_and_an_editing_sampler_emits_whole_blocks(llada2):
    prompt = PROMPTS[1]                                   # 13 tokens: the first block (8) holds its tail
    plain = SamplingParams(sampler="llada2", max_tokens=19, block_length=8, cache="prefix", ignore_eos=True)
    chunks = [c.delta_token_ids for c in llada2.stream(prompt_token_ids=prompt, sampling_params=plain)]
    assert len([c for c in chunks if c]) > 3                 # one token a pass: many small chunks
    edit = plain.replace(sampler="llada2_edit", threshold=0.5, editing_threshold=0.6)
    out = llada2.generate(prompt_token_ids=[prompt], sampling_params=edit)[0]
    sizes = [len(c.delta_token_ids) for c in llada2.stream(prompt_token_ids=prompt, sampling_params=edit)]
    ends = [13 + sum(sizes[:i + 1]) for i, n in enumerate(sizes) if n]
    assert all(e % 8 == 0 or e == 13 + 19 for e in ends)      # a block is final only once it is done
    assert sum(sizes) == len(out.token_ids) == 19


def test_a_stop_token_ends_the_request_early_or_at_its_block(sdar):
    free = sdar.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=SamplingParams(
        sampler="sdar", max_tokens=24, ignore_eos=True))[0]
    stop = free.token_ids[9]
    cut = free.token_ids.index(stop)
    early = SamplingParams(sampler="sdar", max_tokens=24, ignore_eos=True, stop_token_ids=[stop])
    out = sdar.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=early)[0]
    assert out.token_ids == free.token_ids[:cut] and (out.finish_reason, out.stop_reason) == ("stop", stop)
    late = sdar.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=early.replace(eos_early_stop=False))[0]
    assert late.token_ids == out.token_ids and late.num_forward_passes >= out.num_forward_passes


def test_an_empty_prompt_decodes_from_a_block_of_masks_on_block_models_only(sdar):
    out = sdar.generate(prompt_token_ids=[[]], sampling_params=SamplingParams(sampler="sdar", max_tokens=8,
                                                                              ignore_eos=True))[0]
    assert len(out.token_ids) == 8
    with pytest.raises(DLMError, match="prompt is empty"):
        LLM(str(FIXTURES / "parity" / "llada-tiny")).generate(prompt_token_ids=[[]])


def test_a_response_template_fixes_slots_across_blocks(sdar):
    # Fixed tokens fill one whole block and parts of others; only the free slots are decoded.
    template = [100, 101, None, 103, 104, 105, 106, 107, None, None, 110]
    params = SamplingParams(sampler="sdar", max_tokens=len(template), ignore_eos=True)
    out = sdar.generate(prompt_token_ids=[PROMPTS[2] + [50]], sampling_params=params, response_template=template)[0]
    assert [t for t, want in zip(out.token_ids, template) if want is not None] == [t for t in template if t is not None]
    # One token a pass: the three free slots and the one past the output's end in the last block (decoded,
    # as the references decode their last block whole); the block the template fills costs nothing.
    assert out.num_forward_passes == 4


@pytest.mark.parametrize("sampler", ["threshold", "factor", "entropy_bounded"])
@pytest.mark.parametrize("cache", ["none", "prefix"])
def test_the_full_sequence_rules_decode_block_models_too(sdar, sampler, cache):
    params = SamplingParams(sampler=sampler, max_tokens=18, cache=cache, threshold=0.3, factor=2.0, gamma=1.0,
                            ignore_eos=True)
    out = sdar.generate(prompt_token_ids=[PROMPTS[1]], sampling_params=params)[0]
    same = sdar.generate(prompt_token_ids=[PROMPTS[1]], sampling_params=params.replace(
        cache="prefix" if cache == "none" else "none"))[0]
    assert len(out.token_ids) == 18 and out.token_ids == same.token_ids       # paged and unpaged agree
    assert out.num_forward_passes == same.num_forward_passes
