"""The engine (engine/engine.py): requests batched into shared passes without changing anyone's output,
passes reported, and a failing request failing alone."""

import json

import pytest
from tests.helpers import PARITY, run_to_end

from dlm_backend import LLM, SamplingParams
from dlm_backend.errors import EngineError

PROMPT = json.loads((PARITY / "llada-tiny" / "cases.json").read_text())["cases"][0]["prompt"]
PROMPTS = [PROMPT, PROMPT[:4], PROMPT[2:] + [7, 8, 9, 10, 11, 12, 13]]
SAMPLERS = ["llada", "dream", "threshold", "factor", "entropy_bounded"]


@pytest.mark.parametrize("family", ["llada-tiny", "dream-tiny"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_batch_invariance(family, cache, sampler):
    llm = LLM(str(PARITY / family))
    params = SamplingParams(sampler=sampler, max_tokens=20, block_length=8, threshold=0.1, cache=cache,
                            ignore_eos=True)
    alone = [llm.generate(prompt_token_ids=[p], sampling_params=params)[0] for p in PROMPTS]
    together = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert a.num_forward_passes == b.num_forward_passes
        assert len(a.token_ids) == 20


def test_forward_passes_reported_and_threshold_needs_fewer():
    llm = LLM(str(PARITY / "llada-tiny"))
    slow = llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(
        sampler="llada", max_tokens=32, block_length=8, ignore_eos=True))[0]
    fast = llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(
        sampler="threshold", threshold=0.05, max_tokens=32, block_length=8, ignore_eos=True))[0]
    assert slow.num_forward_passes == 32
    assert 4 <= fast.num_forward_passes < 32


def test_failing_request_in_a_batch_fails_alone(monkeypatch):
    llm = LLM(str(PARITY / "dream-tiny"))
    engine = llm.engine
    original = engine.runner._random_for

    def random_for(seq):
        if seq.params.seed == 13:
            raise RuntimeError("injected failure")
        return original(seq)

    params = SamplingParams(sampler="llada", max_tokens=8, block_length=8, ignore_eos=True)
    solo = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].token_ids
    monkeypatch.setattr(engine.runner, "_random_for", random_for)
    good = engine.add_request(PROMPT, params)
    bad = engine.add_request(PROMPT, params.replace(seed=13))
    final = run_to_end(engine)
    assert final[bad.request_id].finish_reason == "error" and "injected" in final[bad.request_id].error
    assert final[good.request_id].error is None and final[good.request_id].output.token_ids == solo


def test_failing_request_fails_alone(monkeypatch):
    llm = LLM(str(PARITY / "llada-tiny"))
    bad_seed = 13
    original = llm.engine.runner._random_for

    def random_for(seq):
        if seq.params.seed == bad_seed:
            raise RuntimeError("injected failure")
        return original(seq)

    monkeypatch.setattr(llm.engine.runner, "_random_for", random_for)
    params = SamplingParams(sampler="llada", max_tokens=8, block_length=8, ignore_eos=True)
    good = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0]
    with pytest.raises(EngineError, match="injected failure"):
        llm.generate(prompt_token_ids=[PROMPT], sampling_params=params.replace(seed=bad_seed))
    again = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0]
    assert again.token_ids == good.token_ids
