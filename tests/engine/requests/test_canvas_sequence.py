"""Full-sequence requests (engine/requests/canvas_sequence.py, LLaDA and Dream): blocks left to right over one canvas,
the cache windows, early stop at EOS, response templates."""

import json
import shutil

import pytest
from tests.helpers import PARITY

from dlm_backend import LLM, SamplingParams

PROMPT = json.loads((PARITY / "llada-tiny" / "cases.json").read_text())["cases"][0]["prompt"]
SAMPLERS = ["llada", "dream", "threshold", "factor", "entropy_bounded"]


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_reduces_tokens_per_pass_not_passes(cache):
    llm = LLM(str(PARITY / "llada-tiny"))
    seq = llm.engine.add_request(PROMPT, SamplingParams(sampler="llada", max_tokens=24, block_length=8,
                                                        cache=cache, ignore_eos=True))
    fed = []
    while llm.engine.has_unfinished:
        step = seq.plan(0)
        start, end = step.start, step.end
        fed.append(end - start)
        llm.engine.step()
    assert len(fed) == 24
    assert fed[0] == len(PROMPT) + 24 and min(fed) < fed[0]
    if cache == "dual":
        assert min(fed) == 8


def test_eos_stops_early_and_cuts_output(tmp_path):
    base = LLM(str(PARITY / "llada-tiny"))
    params = SamplingParams(sampler="llada", max_tokens=32, block_length=8, ignore_eos=True)
    full = base.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].token_ids
    eos = full[5]                      # pretend a token the model writes early is EOS
    ckpt = tmp_path / "eos"
    shutil.copytree(PARITY / "llada-tiny", ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["eos_token_id"] = eos
    (ckpt / "config.json").write_text(json.dumps(config))
    (ckpt / "generation_config.json").unlink()
    out = LLM(str(ckpt)).generate(prompt_token_ids=[PROMPT], sampling_params=params.replace(ignore_eos=False))[0]
    assert out.finish_reason == "stop" and out.stop_reason == eos
    assert out.token_ids == full[:full.index(eos)]
    assert out.num_forward_passes <= 8          # only the first block was denoised


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_max_tokens_not_multiple_of_block(sampler):
    llm = LLM(str(PARITY / "dream-tiny"))
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(
        sampler=sampler, max_tokens=13, block_length=5, steps=7, ignore_eos=True))[0]
    assert len(out.token_ids) == 13 and out.finish_reason == "length"
    assert 300 not in out.token_ids           # no mask left behind


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("sampler", ["llada", "threshold"])
def test_response_template_fixes_tokens_and_fills_slots(sampler, cache):
    llm = LLM(str(PARITY / "dream-tiny"))
    template = [5, None, None, 6, 7, None, None, None, 8] + [None] * 8 + [9] * 8 + [None] * 3
    params = SamplingParams(sampler=sampler, max_tokens=32, block_length=8, cache=cache, ignore_eos=True)
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params, response_template=template)[0]
    assert len(out.token_ids) == 32 and 300 not in out.token_ids
    assert all(tok == fixed for tok, fixed in zip(out.token_ids, template) if fixed is not None)
    free = sum(t is None for t in template) + 32 - len(template)
    assert out.num_forward_passes <= free
    if sampler == "llada":
        assert out.num_forward_passes == free          # one token per pass, fixed slots skipped


def test_a_stop_token_in_a_template_slot_does_not_cut_off_the_skeleton():
    """EOS committed into a JSON value's spare slot used to finish the request there, dropping the
    later slots and the closing braces; after the template a stop token ends it as usual."""
    from dlm_backend.engine.samplers.base import TokenInfo
    from dlm_backend.engine.samplers.llada import LLaDASampler
    from dlm_backend.engine.requests.canvas_sequence import CanvasSequence
    from dlm_backend.engine.samplers.base import Commit

    mask, eos, fixed = 9, 2, 5
    params = SamplingParams(sampler="llada", max_tokens=6, block_length=6)
    seq = CanvasSequence([1, 1], params, LLaDASampler(), TokenInfo(mask, (eos,)), response_template=[None, None, fixed])

    def commit(positions, tokens):
        step = seq.plan(0)
        seq.apply(step, Commit([step.candidates.index(p) for p in positions], tokens))
    commit([2, 3], [7, eos])                     # the value and a pad in its slots
    assert not seq.is_finished and seq.prefix_end == 5
    commit([5, 6], [eos, 7])                     # after the template: a stop
    assert seq.is_finished and seq.finish_reason == "stop" and seq.output_end == 5
