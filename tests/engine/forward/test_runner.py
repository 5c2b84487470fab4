"""The runner (engine/forward/runner.py): the cache windows see what a full pass sees, seeded draws, guidance,
and NaN logits failing only the request that caused them."""

import json

import pytest
import torch
from tests.helpers import PARITY, run_to_end

from dlm_backend import LLM, SamplingParams
from dlm_backend.parity.forward import PagedRun

PROMPT = json.loads((PARITY / "llada-tiny" / "cases.json").read_text())["cases"][0]["prompt"]
SAMPLERS = ["llada", "dream", "threshold", "factor", "entropy_bounded"]


@pytest.mark.parametrize("family", ["llada-tiny", "dream-tiny"])
def test_cached_window_on_unchanged_canvas_equals_full_pass(family):
    """The cache plumbing is exact: with nothing changed since the block-start pass, the prefix and
    dual windows see the same keys as a full pass and produce the same hidden states."""
    model = LLM(str(PARITY / family)).engine.runner.model
    a = model.args
    canvas = torch.tensor(PROMPT + [a.mask_token_id] * 16)
    L, bs, be = len(canvas), len(PROMPT) + 8, len(PROMPT) + 16
    run = PagedRun(model, L)
    with torch.inference_mode():
        full = run.hidden(canvas, 0, L)
        for start, end in [(bs, L), (bs - 1, be)]:      # prefix window, shifted dual window
            part = run.hidden(canvas[start:end], start, L)
            # A plumbing error moves logits by 0.1 or more; a window of other length can take another
            # float32 matmul kernel (a fresh clone on 2 threads saw 3.8e-5 on one of 576 logits).
            torch.testing.assert_close(part, full[start:end], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_seed_fixes_sampled_output(sampler):
    llm = LLM(str(PARITY / "llada-tiny"))
    params = SamplingParams(sampler=sampler, max_tokens=16, block_length=8, temperature=1.0, seed=7,
                            ignore_eos=True, alg="origin" if sampler == "dream" else "maskgit_plus")
    a = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].token_ids
    b = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].token_ids
    others = [llm.generate(prompt_token_ids=[PROMPT], sampling_params=params.replace(seed=s))[0].token_ids
              for s in (8, 9, 10)]
    assert a == b
    assert any(o != a for o in others)


def test_classifier_free_guidance_changes_output():
    llm = LLM(str(PARITY / "llada-tiny"))
    params = SamplingParams(sampler="llada", max_tokens=16, block_length=8, cache="none", ignore_eos=True)
    plain = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0]
    guided = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params.replace(cfg_scale=2.0))[0]
    assert len(guided.token_ids) == 16 and guided.token_ids != plain.token_ids


def test_nan_logits_fail_only_the_request_that_caused_them(monkeypatch):
    llm = LLM(str(PARITY / "dream-tiny"))
    engine, model = llm.engine, llm.engine.runner.model
    poison = 299                                     # a token only the bad prompt carries
    original = model.forward

    def forward(input_ids, positions):
        hidden = original(input_ids, positions)
        return hidden.masked_fill((input_ids == poison)[:, None].any(0, keepdim=True), float("nan"))

    params = SamplingParams(sampler="threshold", cache="dual", max_tokens=8, block_length=8, ignore_eos=True)
    solo = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].token_ids
    monkeypatch.setattr(model, "forward", forward)
    good = engine.add_request(PROMPT, params)
    bad = engine.add_request(PROMPT[:2] + [poison] + PROMPT[2:], params)
    final = run_to_end(engine)
    assert final[bad.request_id].finish_reason == "error" and "NaN" in final[bad.request_id].error
    assert final[good.request_id].error is None and final[good.request_id].output.token_ids == solo
