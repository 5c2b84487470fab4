"""Uniform-noise requests (engine/requests/uniform_sequence.py) on diffusiongemma-tiny (canvases of 16): encoder passes
write the prompt and each finished canvas, decoder passes denoise, a canvas is committed whole."""

import pytest
from tests.helpers import FIXTURES

from dlm_backend import LLM, SamplingParams
from dlm_backend.errors import SamplingParamsError

DGEMMA = FIXTURES / "parity-block" / "diffusiongemma-tiny"
PROMPT = [383, 287, 421, 158, 456, 240, 448, 373, 284, 56, 461]
L = 16


@pytest.fixture(scope="module")
def llm():
    with LLM(str(DGEMMA), dtype="float32") as llm:
        yield llm


def _params(**kw):
    return SamplingParams(**{"sampler": "diffusiongemma", "max_denoising_steps": 4, "seed": 3, "ignore_eos": True,
                             **kw})


def test_the_family_decodes_with_its_sampler_and_the_checkpoints_defaults(llm):
    p = llm.sampling_params()
    assert (p.sampler, p.t_min, p.t_max, p.gamma, p.max_denoising_steps) == ("diffusiongemma", 0.4, 0.8, 0.1, 48)
    assert llm.engine.tokens.mask_id == -1 and set(llm.engine.tokens.eos_ids) == {1, 106}


def test_canvases_are_encoded_once_final_and_the_output_is_cut_at_max_tokens(llm):
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=_params(max_tokens=20,
                                                                            confidence_threshold=0.0))[0]
    # two canvases (32 slots) for 20 tokens: 4 decoder passes each; the prompt and the first canvas
    # are encoded, the last canvas is not (nothing reads it)
    assert len(out.token_ids) == 20 and out.finish_reason == "length"
    assert out.num_forward_passes == 8 and out.num_cache_passes == 2


def test_a_seed_gives_the_same_text_and_another_seed_another(llm):
    a, b = (llm.generate(prompt_token_ids=[PROMPT], sampling_params=_params(max_tokens=32))[0] for _ in range(2))
    c = llm.generate(prompt_token_ids=[PROMPT], sampling_params=_params(max_tokens=32, seed=4))[0]
    assert a.token_ids == b.token_ids != c.token_ids


def test_streaming_emits_a_canvas_at_a_time(llm):
    seq = llm.engine.add_request(PROMPT, _params(max_tokens=48, confidence_threshold=0.0))
    sizes = []
    while llm.engine.has_unfinished:
        for chunk in llm.engine.step():
            if chunk.request_id == seq.request_id and chunk.delta_token_ids:
                sizes.append(len(chunk.delta_token_ids))
    assert sizes == [L, L, L]


def test_a_stop_token_ends_the_output_at_its_first_place_in_a_committed_canvas(llm):
    free = llm.generate(prompt_token_ids=[PROMPT], sampling_params=_params(max_tokens=32))[0].token_ids
    stop = free[20]
    first = free.index(stop)
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=_params(max_tokens=32, stop_token_ids=[stop]))[0]
    assert out.token_ids == free[:first] and out.finish_reason == "stop" and out.stop_reason == stop


def test_a_response_template_keeps_its_tokens_and_a_canvas_it_fixes_is_not_denoised(llm):
    template = list(range(100, 100 + L)) + [7, None, None, 9] + [None] * 12
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=_params(max_tokens=32, confidence_threshold=0.0),
                       response_template=template)[0]
    assert out.token_ids[:L] == template[:L] and out.token_ids[L] == 7 and out.token_ids[L + 3] == 9
    # the fixed canvas is not denoised: one encoder pass writes it with the prompt
    assert out.num_forward_passes == 4 and out.num_cache_passes == 1


def test_only_a_uniform_noise_sampler_decodes_it_and_it_decodes_nothing_else(llm):
    with pytest.raises(SamplingParamsError, match="diffusiongemma"):
        llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(sampler="threshold", max_tokens=8))
    with LLM(str(FIXTURES / "parity-block" / "sdar-tiny"), dtype="float32") as sdar:
        with pytest.raises(SamplingParamsError, match="uniform"):
            sdar.generate(prompt_token_ids=[[5, 6]], sampling_params=_params(max_tokens=8))
