"""Selection rules of every sampler, checked on hand-made inputs."""

import pytest
import torch

from dlm_backend import SamplingParams
from dlm_backend.engine.samplers import (DreamSampler, EntropyBoundedSampler, FactorSampler, LLaDASampler,
                                         StepInput, ThresholdSampler, TokenInfo)
from dlm_backend.engine.samplers.base import top_k_indices
from dlm_backend.engine.samplers.entropy_bounded import entropy_bounded_count
from dlm_backend.engine.samplers.factor import factor_count
from dlm_backend.engine.samplers.llada import transfer_schedule
from dlm_backend.engine.samplers.threshold import threshold_select

TOKENS = TokenInfo(mask_id=5, eos_ids=(1,), eot_ids=(2,))


def _input(logits, params, step=0, state=None, seed=0):
    return StepInput(logits=logits, positions=list(range(len(logits))), step=step, block_state=state,
                     params=params, generator=torch.Generator().manual_seed(seed), tokens=TOKENS)


def _peaked(rows):
    """Logits whose softmax puts probability p on token t, per (t, p) row, over 8 tokens."""
    out = torch.full((len(rows), 8), -30.0)
    for i, (tok, p) in enumerate(rows):
        rest = (1 - p) / 7
        out[i] = torch.log(torch.full((8,), rest))
        out[i, tok] = torch.log(torch.tensor(p))
    return out


def test_transfer_schedule_matches_reference_arithmetic():
    assert transfer_schedule(10, 4) == [3, 3, 2, 2]
    assert transfer_schedule(32, 32) == [1] * 32
    assert transfer_schedule(3, 5) == [1, 1, 1, 0, 0]
    assert sum(transfer_schedule(37, 6)) == 37


def test_llada_commits_scheduled_count_by_confidence():
    logits = _peaked([(3, 0.5), (4, 0.9), (6, 0.7), (7, 0.2)])
    commit = LLaDASampler().step(_input(logits, SamplingParams(sampler="llada"), step=0, state=[2, 2]))
    assert commit.indices == [1, 2] and commit.token_ids == [4, 6]


def test_llada_never_predicts_the_mask_token():
    logits = _peaked([(5, 0.99), (3, 0.6)])          # row 0's best token is the mask id
    commit = LLaDASampler().step(_input(logits, SamplingParams(sampler="llada"), state=[2]))
    assert 5 not in commit.token_ids


def test_llada_confidence_eos_eot_inf_ranks_eos_last_at_temperature_zero():
    logits = _peaked([(1, 0.95), (3, 0.6)])          # EOS is the most confident prediction
    params = SamplingParams(sampler="llada", confidence_eos_eot_inf=True)
    commit = LLaDASampler().step(_input(logits, params, state=[1]))
    assert commit.indices == [1]
    plain = LLaDASampler().step(_input(logits, SamplingParams(sampler="llada"), state=[1]))
    assert plain.indices == [0] and plain.token_ids == [1]


def test_llada_logits_eos_inf_forbids_eos():
    logits = _peaked([(1, 0.95)])
    commit = LLaDASampler().step(_input(logits, SamplingParams(sampler="llada", logits_eos_inf=True), state=[1]))
    assert commit.token_ids != [1]


def test_threshold_rule_commits_confident_plus_top1():
    assert threshold_select(torch.tensor([0.2, 0.95, 0.91, 0.5]), 0.9) == [1, 2]
    assert threshold_select(torch.tensor([0.2, 0.3, 0.1]), 0.9) == [1]


def test_threshold_sampler_uses_float64_probabilities():
    logits = _peaked([(3, 0.95), (4, 0.5), (6, 0.92)])
    commit = ThresholdSampler().step(_input(logits, SamplingParams(threshold=0.9)))
    assert commit.indices == [0, 2] and commit.token_ids == [3, 6]


def test_factor_count_follows_paper_bound():
    # n is accepted while (n + 1) * (1 - c_n) < f
    assert factor_count([0.99, 0.98, 0.97, 0.5], factor=1.0) == 3
    assert factor_count([0.4, 0.3], factor=1.0) == 1
    assert factor_count([0.9, 0.8, 0.7, 0.6], factor=2.0) == 3


def test_factor_sampler_commits_more_with_larger_factor():
    logits = _peaked([(3, 0.9), (4, 0.8), (6, 0.7), (7, 0.6)])
    few = FactorSampler().step(_input(logits, SamplingParams(sampler="factor", factor=0.5)))
    many = FactorSampler().step(_input(logits, SamplingParams(sampler="factor", factor=3.0)))
    assert len(few.indices) < len(many.indices)


def test_entropy_bounded_count():
    assert entropy_bounded_count([0.01, 0.02, 0.5, 0.6], gamma=0.1) == 3
    assert entropy_bounded_count([0.5, 0.6], gamma=0.1) == 1
    assert entropy_bounded_count([0.0, 0.0, 0.0], gamma=0.0) == 3


def test_entropy_bounded_sampler_picks_lowest_entropy_first():
    logits = _peaked([(3, 0.3), (4, 0.999), (6, 0.6)])
    commit = EntropyBoundedSampler().step(_input(logits, SamplingParams(sampler="entropy_bounded", gamma=0.005)))
    assert commit.indices == [1] and commit.token_ids == [4]


def test_dream_schedule_reveals_zero_first_then_one_then_two_last():
    sampler, n, params = DreamSampler(), 32, SamplingParams(sampler="dream", max_tokens=32, steps=32)
    ts = sampler.begin_block(n, 32, params)
    counts, remaining = [], n
    for i in range(32):
        logits = torch.randn(remaining, 8)
        commit = sampler.step(_input(logits, params, step=i, state=ts))
        counts.append(len(commit.indices))
        remaining -= len(commit.indices)
    assert counts[0] == 0 and counts[-1] == 2 and set(counts[1:-1]) == {1} and remaining == 0


def test_dream_origin_reveals_everything_by_last_step():
    sampler, params = DreamSampler(), SamplingParams(sampler="dream", alg="origin", max_tokens=4, steps=2)
    ts = sampler.begin_block(4, 2, params)
    commit = sampler.step(_input(torch.randn(4, 8), params, step=1, state=ts))
    assert commit.indices == [0, 1, 2, 3]


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_dream_confidence_kinds_prefer_peaked_rows(alg):
    sampler = DreamSampler()
    params = SamplingParams(sampler="dream", alg=alg, max_tokens=3, steps=3)
    ts = sampler.begin_block(3, 3, params)
    logits = _peaked([(3, 0.3), (4, 0.97), (6, 0.5)])
    commit = sampler.step(_input(logits, params, step=2, state=ts))   # last step: all three, ranked
    assert commit.indices[0] == 1


def test_top_k_ties_go_to_lower_position():
    assert top_k_indices(torch.tensor([0.5, 0.7, 0.7, 0.1, 0.7]), 2) == [1, 2]


def test_sampled_tokens_are_reproducible_for_a_seed():
    logits = torch.randn(6, 50)
    params = SamplingParams(temperature=1.0)
    a = ThresholdSampler().step(_input(logits, params, seed=3))
    b = ThresholdSampler().step(_input(logits, params, seed=3))
    c = [ThresholdSampler().step(_input(logits, params, seed=s)).token_ids for s in range(4, 12)]
    assert a == b
    assert any(tokens != a.token_ids for tokens in c)


def test_dream_sampling_survives_a_top_k_that_keeps_only_the_mask():
    # Row 0's most likely token is the mask id; top_k=1 keeps nothing else, so the sampled
    # distribution would be empty. The row must still fill, with its best real token (3).
    logits = _peaked([(5, 0.9), (4, 0.8)])
    logits[0, 3] = logits[0, 5] - 1
    params = SamplingParams(sampler="dream", temperature=0.7, top_k=1, max_tokens=2, steps=1)
    sampler = DreamSampler()
    commit = sampler.step(_input(logits, params, step=0, state=sampler.begin_block(2, 1, params)))
    assert sorted(zip(commit.indices, commit.token_ids)) == [(0, 3), (1, 4)]


@pytest.mark.parametrize("max_tokens,block,steps", [(64, 32, 64), (64, 32, 16), (10, 4, 3), (10, 4, 7), (37, 8, 20)])
def test_block_steps_add_up_to_steps(max_tokens, block, steps):
    params = SamplingParams(sampler="llada", max_tokens=max_tokens, block_length=block, steps=steps)
    spans = [(s, min(s + block, max_tokens)) for s in range(0, max_tokens, block)]
    per_block = [LLaDASampler().steps_for_block(params, s, e) for s, e in spans]
    assert sum(per_block) == steps and min(per_block) >= 1
    if max_tokens % block == 0 and steps % len(spans) == 0:     # the reference's steps // num_blocks
        assert per_block == [steps // len(spans)] * len(spans)
