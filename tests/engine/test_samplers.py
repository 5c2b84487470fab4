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
from dlm_backend.engine.samplers.random import TorchRandom
from dlm_backend.engine.samplers.threshold import threshold_select

TOKENS = TokenInfo(mask_id=5, eos_ids=(1,), eot_ids=(2,))


def _input(logits, params, step=0, state=None, seed=0):
    return StepInput(logits=logits, positions=list(range(len(logits))), step=step, block_state=state,
                     params=params, random=TorchRandom(torch.Generator().manual_seed(seed)), tokens=TOKENS)


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


# -- diffusiongemma (uniform noise) ------------------------------------------------------------


def test_diffusiongemma_temperature_is_the_references_float32_at_every_recorded_step():
    import json
    import struct

    from tests.helpers import FIXTURES

    from dlm_backend.engine.samplers.diffusiongemma import temperature

    fixture = json.loads((FIXTURES / "parity-block" / "diffusiongemma-tiny" / "cases.json").read_text())
    seen = 0
    for case in fixture["cases"]:
        kw = {**fixture["generation_config_defaults"], **case["generate_kwargs"]}
        for step in case["result"]["steps"]:
            t = temperature(kw["t_min"], kw["t_max"], step["cur_step"], kw["max_denoising_steps"])
            assert t.dtype == torch.float32
            assert struct.pack(">f", float(t)).hex() == step["temperature_f32_hex"], (case["name"], step["cur_step"])
            seen += 1
    assert seen > 100


def test_diffusiongemma_accepts_the_lowest_entropies_while_the_ones_before_sum_to_the_bound():
    from dlm_backend.engine.samplers.diffusiongemma import accepted_slots, entropy

    h = torch.tensor([0.5, 0.01, 0.3, 2.0])       # sorted 0.01, 0.3, 0.5, 2.0: sums before 0, 0.01, 0.31, 0.81
    assert accepted_slots(h, 0.4).tolist() == [True, True, True, False]
    assert accepted_slots(h, 0.0).tolist() == [False, True, False, False]       # the lowest always goes
    logits = torch.randn(5, 11) * 3
    logits[0, 3] = -torch.inf                                                    # a token that cannot be drawn
    want = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.equal(entropy(logits), want)


def _dg_state(sampler, params, length=4, vocab=8, seed=0):
    from dlm_backend.engine.samplers.random import TorchRandom

    random = TorchRandom(torch.Generator().manual_seed(seed))
    return sampler.begin_canvas(random, vocab, length, params), random


def test_diffusiongemma_draws_in_the_references_order_and_keeps_fixed_slots():
    from dlm_backend.engine.samplers import DiffusionGemmaSampler

    sampler, params = DiffusionGemmaSampler(), SamplingParams(sampler="diffusiongemma", max_denoising_steps=3)
    state, random = _dg_state(sampler, params, seed=4)
    ref = torch.Generator().manual_seed(4)
    assert state.canvas == torch.randint(0, 8, (4,), generator=ref).tolist()   # the canvas's first draw
    logits = torch.randn(4, 8)
    inp = StepInput(logits=logits, positions=[0, 1, 2, 3], step=0, block_state=state, params=params,
                    tokens=TokenInfo(mask_id=-1), current=[7, 7, 7, 7],
                    masked=[True, False, True, True], random=random)
    commit = sampler.step(inp)
    t = torch.tensor(0.4) + (0.8 - 0.4) * (torch.tensor(3, dtype=torch.int32) / 3)
    drawn = torch.multinomial(torch.softmax(logits / t, -1), 1, generator=ref)[:, 0]     # then one multinomial
    noise = torch.randint(0, 8, (4,), generator=ref)                                      # and one randint
    assert commit.token_ids[1] == 7                       # the template's slot keeps its token
    for i in (0, 2, 3):
        assert commit.token_ids[i] in (int(drawn[i]), int(noise[i]))
    assert torch.equal(commit.conditioning, logits / t) and state.step == 2 and not state.done


def test_diffusiongemma_stops_when_stable_for_the_threshold_and_confident():
    from dlm_backend.engine.samplers import DiffusionGemmaSampler

    sampler = DiffusionGemmaSampler()
    sure = torch.full((4, 8), -20.0)
    sure[:, 2] = 20.0                                     # one token per slot, entropy ~0
    for threshold, passes in ((0, 1), (1, 2), (2, 3)):
        params = SamplingParams(sampler="diffusiongemma", max_denoising_steps=10, stability_threshold=threshold)
        state, random = _dg_state(sampler, params)
        n = 0
        while not state.done:
            sampler.step(StepInput(logits=sure, positions=[0, 1, 2, 3], step=n, block_state=state, params=params,
                                   tokens=TokenInfo(mask_id=-1), current=state.canvas,
                                   masked=[True] * 4, random=random))
            n += 1
        assert n == passes and state.canvas == [2, 2, 2, 2]        # the argmax is what a canvas commits
    params = SamplingParams(sampler="diffusiongemma", max_denoising_steps=3, confidence_threshold=0.0)
    state, random = _dg_state(sampler, params)
    for n in range(3):                                     # never confident below 0: every step runs
        sampler.step(StepInput(logits=sure, positions=[0, 1, 2, 3], step=n, block_state=state, params=params,
                               tokens=TokenInfo(mask_id=-1), current=state.canvas,
                               masked=[True] * 4, random=random))
    assert state.done and state.step == 0


def test_diffusiongemma_refuses_a_schedule_that_does_not_fall():
    from dlm_backend.engine.samplers import DiffusionGemmaSampler
    from dlm_backend.errors import SamplingParamsError

    with pytest.raises(SamplingParamsError, match="t_max"):
        DiffusionGemmaSampler().validate(SamplingParams(sampler="diffusiongemma", t_min=0.9, t_max=0.8))


def test_a_seeded_request_on_cpu_draws_the_references_stream_call_for_call():
    """The fixture's rng_selftest: torch.manual_seed(s) then randint / multinomial draws; a request's
    generator seeded with s draws the same (which is why seeded one-prompt cases need no replay)."""
    import json
    import struct

    from tests.helpers import FIXTURES

    from dlm_backend.engine.samplers.random import TorchRandom

    fixture = json.loads((FIXTURES / "parity-block" / "diffusiongemma-tiny" / "cases.json").read_text())
    selftest = fixture["rng_selftest"]
    draws = TorchRandom(torch.Generator().manual_seed(selftest["seed"]))
    assert draws.randint(512, (16,)).tolist() == selftest["randint_0_512_x16"]
    probe = selftest["multinomial_probe"]
    probs = torch.tensor([[struct.unpack(">f", bytes.fromhex(h))[0] for h in row]
                          for row in probe["probs_float32_hex"]])
    assert TorchRandom(torch.Generator().manual_seed(selftest["seed"])).multinomial(probs).tolist() == probe["out"]


def test_step_input_has_one_source_of_randomness():
    import dataclasses

    assert "generator" not in {f.name for f in dataclasses.fields(StepInput)}
    assert "random" in {f.name for f in dataclasses.fields(StepInput)}


def test_every_draw_is_the_torch_call_a_reference_seeded_the_same_makes():
    ref, draws = torch.Generator().manual_seed(9), TorchRandom(torch.Generator().manual_seed(9))
    weights = torch.tensor([0.1, 0.5, 0.2, 0.2])
    assert torch.equal(draws.rand((3,), torch.float64), torch.rand(3, dtype=torch.float64, generator=ref))
    assert torch.equal(draws.sample(weights, 2), torch.multinomial(weights, 2, generator=ref))
    assert torch.equal(draws.multinomial(weights[None]), torch.multinomial(weights[None], 1, generator=ref)[:, 0])


def test_replay_hands_out_recorded_rand_and_sample_draws_and_names_a_divergence():
    from dlm_backend.engine.samplers.random import ReplayRandom
    from dlm_backend.errors import DLMError

    replay = ReplayRandom([{"op": "torch.rand", "out": [0.25, 0.75]}, {"op": "torch.multinomial", "out": [3, 1]},
                           {"op": "torch.rand", "out": [0.5]}])
    first = replay.rand((2,))
    assert first.tolist() == [0.25, 0.75] and first.dtype == torch.float32
    assert replay.sample(torch.ones(4), 2).tolist() == [3, 1]
    with pytest.raises(DLMError, match="asked for torch.randint x1, the recording has torch.rand x1"):
        replay.randint(4, (1,))


def test_dream_origin_reveals_with_the_requests_random():
    """Dream's ``origin`` rule draws a uniform per slot, then samples the revealed ones: both through
    ``StepInput.random``, so a replayed run reveals what the recording says."""
    from dlm_backend.engine.samplers.random import ReplayRandom

    params = SamplingParams(sampler="dream", alg="origin", steps=4, max_tokens=4)
    logits = _peaked([(0, 0.9), (1, 0.9), (2, 0.9), (3, 0.9)])
    state = DreamSampler().begin_block(4, 4, params)
    inp = _input(logits, params, state=state)
    inp.random = ReplayRandom([{"op": "torch.rand", "out": [0.9, 0.0, 0.9, 0.0]}])
    commit = DreamSampler().step(inp)
    assert commit.indices == [1, 3] and commit.token_ids == [1, 3]        # greedy: no further draw
