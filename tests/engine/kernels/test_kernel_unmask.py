"""Fused greedy unmasking (token and its probability) against the LM head's torch reference."""

import pytest
import torch
from tests.engine.kernels.kernel_utils import DEVICE, DTYPES

from dlm_backend.engine.kernels.unmask import unmask_stats
from dlm_backend.engine.layers.head import greedy_confidence

# The reference rounds the logits to the model dtype (as the layer's torch path does); the kernel keeps
# them in fp32: a bf16 logit of ~3 is off by up to 0.008, a probability by up to ~1%.
PROB_TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def _inputs(N, V, D, dtype, seed=0, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, D, generator=g).to(DEVICE, dtype)
    weight = (torch.randn(V, D, generator=g) * spread / D ** 0.5).to(DEVICE, dtype)
    return hidden, weight


def _check(got, want, hidden, weight, exclude, tol):
    # Tokens must agree unless the reference's own top two logits are within rounding of each other.
    token, prob = got
    logits = hidden.float() @ weight.float().T
    if exclude >= 0:
        logits[:, exclude] = -torch.inf
    best = logits.max(1).values
    same = token == want.token
    assert bool((same | (best - logits.gather(1, token[:, None])[:, 0] <= 1e-3)).all()), (token, want.token)
    torch.testing.assert_close(prob[same], want.prob[same], atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,V,D,split", [(5, 1000, 48, None), (19, 333, 32, 128), (1, 517, 16, 256)])
def test_greedy_stats(dtype, N, V, D, split):
    hidden, weight = _inputs(N, V, D, dtype)
    got = unmask_stats(hidden, weight, split_size=split)
    assert got[0].dtype == torch.int64 and got[1].shape == (N,) and got[1].dtype == torch.float32
    _check(got, greedy_confidence(hidden, weight), hidden, weight, -1, PROB_TOL[dtype])


def test_peaked_and_flat_distributions():
    # A near one-hot row (prob ~1) and an exactly flat one (prob 1/V, the first index wins the tie).
    V, D = 300, 16
    hidden = torch.zeros(2, D, device=DEVICE)
    hidden[0, 0] = 40.0
    weight = torch.zeros(V, D, device=DEVICE)
    weight[123, 0] = 1.0
    token, prob = unmask_stats(hidden, weight, split_size=128)
    assert token.tolist() == [123, 0]
    assert prob[0] > 0.999 and abs(float(prob[1]) - 1 / V) < 1e-7


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_excluded_id_is_never_chosen(dtype):
    hidden, weight = _inputs(7, 400, 32, dtype, seed=1)
    plain = greedy_confidence(hidden, weight)
    mask_id = int(plain.token[0])                          # row 0's favourite becomes the mask id
    got = unmask_stats(hidden, weight, exclude_id=mask_id, split_size=128)
    want = greedy_confidence(hidden, weight, exclude_id=mask_id)
    assert mask_id not in got[0].tolist() and got[0][0] != plain.token[0]
    _check(got, want, hidden, weight, mask_id, PROB_TOL[dtype])


@pytest.mark.gpu
def test_cuda_llada_vocab():
    hidden, weight = _inputs(64, 126464, 4096, torch.bfloat16, seed=3)
    got = unmask_stats(hidden, weight, exclude_id=126336)
    _check(got, greedy_confidence(hidden, weight, exclude_id=126336), hidden, weight, 126336,
           PROB_TOL[torch.bfloat16])
