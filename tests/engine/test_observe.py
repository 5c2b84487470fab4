"""Per-token logprobs and canvas frames: what a diffusion pass shows beyond its commits, gathered
only when asked, at the pass that commits each token."""

import math

import pytest
import torch
from tests.helpers import FIXTURES, PARITY

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.forward.observe import logprobs_of


@pytest.fixture(scope="module")
def llada():
    return LLM(str(PARITY / "llada-tiny"), dtype="float32")


@pytest.fixture(scope="module")
def sdar():
    return LLM(str(FIXTURES / "parity-block" / "sdar-tiny"), dtype="float32")


def test_logprobs_of_gathers_the_committed_rows_only():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    got = logprobs_of(logits, [0, 2], [1, 2], top=2)
    want = torch.log_softmax(logits, -1)
    assert [g.token_id for g in got] == [1, 2]
    assert math.isclose(got[0].logprob, float(want[0, 1]), rel_tol=1e-6)
    assert [t for t, _ in got[1].top] == [2, 0] and math.isclose(got[1].top[0][1], float(want[2, 2]), rel_tol=1e-6)


@pytest.mark.parametrize("fixture", ["llada", "sdar"])
def test_every_token_gets_its_logprob_and_nothing_changes(fixture, request):
    llm = request.getfixturevalue(fixture)
    prompt = [[5, 9, 13, 21, 34, 55]]
    plain = llm.generate(prompt_token_ids=prompt, sampling_params=SamplingParams(max_tokens=12, ignore_eos=True))[0]
    out = llm.generate(prompt_token_ids=prompt, sampling_params=SamplingParams(max_tokens=12, ignore_eos=True,
                                                                                logprobs=3))[0]
    assert out.token_ids == plain.token_ids and plain.logprobs is None
    assert [lp.token_id for lp in out.logprobs] == out.token_ids
    for lp in out.logprobs:
        assert lp.logprob <= 0 and len(lp.top) == 3
        assert lp.top[0][1] >= lp.logprob - 1e-6                 # the top one is at least the chosen one


def test_greedy_logprob_is_the_top_one_at_its_pass(llada):
    """The greedy token is its pass's argmax, so its logprob is that pass's best."""
    out = llada.generate(prompt_token_ids=[[5, 9, 13, 21]], sampling_params=SamplingParams(
        sampler="llada", max_tokens=8, block_length=8, steps=8, ignore_eos=True, logprobs=1))[0]
    for lp in out.logprobs:
        assert lp.top[0][0] == lp.token_id and math.isclose(lp.top[0][1], lp.logprob, rel_tol=1e-6)


def test_streamed_logprobs_line_up_with_the_streamed_tokens(sdar):
    chunks = list(sdar.stream(prompt_token_ids=[5, 9, 13, 21], sampling_params=SamplingParams(
        max_tokens=12, ignore_eos=True, logprobs=0)))
    ids = [t for c in chunks for t in c.delta_token_ids]
    lps = [lp for c in chunks for lp in (c.delta_logprobs or [])]
    assert [lp.token_id for lp in lps] == ids == chunks[-1].output.token_ids
    assert all(lp.top == [] for lp in lps)


def test_canvas_frames_show_every_pass_in_order(sdar):
    params = SamplingParams(max_tokens=12, ignore_eos=True, stream_canvas=True)
    chunks = list(sdar.stream(prompt_token_ids=[5, 9, 13, 21], sampling_params=params))
    frames = [f for c in chunks for f in c.canvas]
    out = chunks[-1].output
    assert [f.pass_index for f in frames] == list(range(1, out.num_forward_passes + 1))
    committed = {}
    for f in frames:
        assert f.committed and all(f.token_ids[i - f.start] is not None for i in f.committed)
        for j, (tok, draft) in enumerate(zip(f.token_ids, f.draft_ids)):
            assert (tok is None) != (draft is None)              # a slot is committed or drafted
        for i in f.committed:
            assert i not in committed
            committed[i] = f.token_ids[i - f.start]
    assert [committed[i] for i in range(len(out.token_ids))] == out.token_ids
    plain = list(sdar.stream(prompt_token_ids=[5, 9, 13, 21], sampling_params=SamplingParams(
        max_tokens=12, ignore_eos=True)))
    assert all(not c.canvas for c in plain)                        # nobody who does not ask sees frames
