"""Fused unmasking statistics against torch logits + softmax."""

import pytest
import torch
from kernel_utils import DEVICE, DTYPES

from dlm_backend.engine.kernels.unmask import gumbel_noise, unmask_stats, unmask_stats_ref

STAT_TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-3}


def _inputs(N, V, D, dtype, seed=0, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, D, generator=g).to(DEVICE, dtype)
    weight = (torch.randn(V, D, generator=g) * spread / D ** 0.5).to(DEVICE, dtype)
    return hidden, weight


def _scores(hidden, weight, temperature, seed, exclude):
    logits = hidden.float() @ weight.float().T
    if temperature > 0:
        logits = logits * (1.0 / temperature) + gumbel_noise(seed, *logits.shape, logits.device)
    if exclude >= 0:
        logits[:, exclude] = -torch.inf
    return logits


def _check(got, want, scores, tol):
    # Tokens must agree unless the reference's own top two scores are within rounding of each other.
    best = scores.max(1).values
    picked = scores.gather(1, got.token[:, None])[:, 0]
    same = got.token == want.token
    assert bool((same | (best - picked <= 1e-3)).all()), (got.token, want.token)
    rows = same
    for name in ("prob", "margin", "entropy"):
        torch.testing.assert_close(getattr(got, name)[rows], getattr(want, name)[rows], atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,V,D,split", [(5, 1000, 48, None), (19, 333, 32, 128), (1, 517, 16, 256)])
def test_greedy_stats(dtype, N, V, D, split):
    hidden, weight = _inputs(N, V, D, dtype)
    got = unmask_stats(hidden, weight, split_size=split)
    want = unmask_stats_ref(hidden, weight)
    assert got.token.dtype == torch.int64 and got.prob.shape == (N,)
    _check(got, want, _scores(hidden, weight, 0.0, 0, -1), STAT_TOL[dtype])
    # Greedy: the chosen token is the top-1, so prob - margin is the runner-up's probability.
    assert bool((got.margin >= 0).all() and (got.margin <= got.prob + 1e-6).all())


def test_peaked_and_flat_distributions():
    # A near one-hot row (entropy ~0, prob ~1) and an exactly flat one (entropy = log V, margin 0).
    V, D = 300, 16
    hidden = torch.zeros(2, D, device=DEVICE)
    hidden[0, 0] = 40.0
    weight = torch.zeros(V, D, device=DEVICE)
    weight[123, 0] = 1.0
    got = unmask_stats(hidden, weight, split_size=128)
    assert got.token.tolist() == [123, 0]                  # flat row: first index wins the tie
    assert got.prob[0] > 0.999 and got.entropy[0] < 1e-3
    torch.testing.assert_close(got.entropy[1], torch.log(torch.tensor(float(V), device=DEVICE)))
    assert float(got.margin[1]) == 0.0 and abs(float(got.prob[1]) - 1 / V) < 1e-7


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_excluded_id_is_never_chosen(dtype):
    hidden, weight = _inputs(7, 400, 32, dtype, seed=1)
    plain = unmask_stats_ref(hidden, weight)
    mask_id = int(plain.token[0])                          # row 0's favourite becomes the mask id
    got = unmask_stats(hidden, weight, exclude_id=mask_id, split_size=128)
    want = unmask_stats_ref(hidden, weight, exclude_id=mask_id)
    assert mask_id not in got.token.tolist() and got.token[0] != plain.token[0]
    _check(got, want, _scores(hidden, weight, 0.0, 0, mask_id), STAT_TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gumbel_sampling_matches_reference_noise(dtype):
    hidden, weight = _inputs(9, 700, 32, dtype, seed=2, spread=1.0)
    got = unmask_stats(hidden, weight, temperature=0.7, seed=1234, exclude_id=5, split_size=256)
    want = unmask_stats_ref(hidden, weight, temperature=0.7, seed=1234, exclude_id=5)
    _check(got, want, _scores(hidden, weight, 0.7, 1234, 5), STAT_TOL[dtype])
    again = unmask_stats(hidden, weight, temperature=0.7, seed=1234, exclude_id=5, split_size=128)
    assert torch.equal(again.token, got.token)             # the noise depends on (seed, row, col) only
    other = unmask_stats(hidden, weight, temperature=0.7, seed=99, exclude_id=5)
    greedy = unmask_stats(hidden, weight)
    assert not torch.equal(other.token, got.token) or not torch.equal(got.token, greedy.token)


def test_gumbel_noise_is_gumbel_distributed():
    noise = gumbel_noise(7, 64, 1000, DEVICE)
    assert torch.equal(noise, gumbel_noise(7, 64, 1000, DEVICE))
    assert not torch.equal(noise, gumbel_noise(8, 64, 1000, DEVICE))
    # Gumbel(0, 1): mean = Euler-Mascheroni 0.5772, variance pi^2 / 6 = 1.645.
    assert abs(float(noise.mean()) - 0.5772) < 0.02 and abs(float(noise.var()) - 1.645) < 0.05


@pytest.mark.gpu
def test_cuda_llada_vocab():
    hidden, weight = _inputs(64, 126464, 4096, torch.bfloat16, seed=3)
    got = unmask_stats(hidden, weight, exclude_id=126336)
    want = unmask_stats_ref(hidden, weight, exclude_id=126336)
    _check(got, want, _scores(hidden, weight, 0.0, 0, 126336), 2e-3)
