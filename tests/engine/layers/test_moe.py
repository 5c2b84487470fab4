"""The torch MoE path's combine (:func:`routed_experts`) against the per-expert formula it replaced.

The combine sorts the T*k assignments by expert once, runs each expert on its run, and gathers the
weighted terms back to [T, k, D] once; the formula below scatters each expert's terms with its own
``index_add_``. Each token adds its terms in ascending expert id in both, so they must agree bit for
bit (the parity fixtures against the published LLaDA2 ``generate`` are token-exact on that).
"""

import pytest
import torch
import torch.nn.functional as F

from dlm_backend.engine.layers.moe import ACTIVATIONS, routed_experts


def per_expert_index_add(x, topk_idx, topk_weight, gate, up, down, activation="silu"):
    """The old combine, plainly: for each expert, its tokens' MLP outputs times their weights,
    ``index_add_``-ed into a float32 sum; an id equal to E (another rank's expert) adds nothing."""
    act, E, k = ACTIVATIONS[activation], gate.shape[0], topk_idx.shape[1]
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in range(E):
        flat = torch.nonzero(topk_idx.reshape(-1) == e)[:, 0]                 # this expert's assignments
        if flat.numel() == 0:
            continue
        token, w = flat // k, topk_weight.reshape(-1)[flat]
        h = x[token]
        y = F.linear(act(F.linear(h, gate[e])) * F.linear(h, up[e]), down[e])
        out.index_add_(0, token, y.float() * w[:, None].float())
    return out.to(x.dtype)


def _inputs(T, D, I, E, k, dtype, seed, foreign=0):
    """Unit-scale x, 1/sqrt(fan_in) weights, k experts a token drawn with replacement (a row may
    repeat an expert); ``foreign`` more experts than the E returned, whose ids become E."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).to(dtype)
    gate = (torch.randn(E, I, D, generator=g) / D ** 0.5).to(dtype)
    up = (torch.randn(E, I, D, generator=g) / D ** 0.5).to(dtype)
    down = (torch.randn(E, D, I, generator=g) / I ** 0.5).to(dtype)
    idx = torch.randint(0, E + foreign, (T, k), generator=g).clamp_(max=E)
    weight = torch.rand(T, k, generator=g).softmax(1)
    return x, idx, weight, gate, up, down


# (T, D, I, E, k): one token; odd sizes everywhere; k=1; one expert; k > E (repeats forced); a
# LLaDA2-like top-8 of 16 at 61 tokens.
SHAPES = [(1, 8, 4, 3, 2), (37, 40, 24, 8, 3), (29, 13, 7, 5, 1), (20, 16, 8, 1, 1), (11, 24, 20, 3, 5),
          (61, 32, 16, 16, 8)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,D,I,E,k", SHAPES)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_matches_the_per_expert_formula_bit_for_bit(T, D, I, E, k, dtype, activation):
    args = _inputs(T, D, I, E, k, dtype, seed=T + k)
    got = routed_experts(*args, activation=activation)
    assert got.dtype == dtype and got.shape == (T, D) and got.is_contiguous()
    assert torch.equal(got, per_expert_index_add(*args, activation=activation))


def test_zero_routing_weights_add_nothing():
    x, idx, w, gate, up, down = _inputs(17, 32, 24, 6, 4, torch.float32, seed=1)
    w[:, 1:] = 0.0                                                        # only slot 0 counts
    w[3] = 0.0                                                            # token 3: nothing at all
    got = routed_experts(x, idx, w, gate, up, down)
    assert torch.equal(got, per_expert_index_add(x, idx, w, gate, up, down))
    assert torch.equal(got[3], torch.zeros(32))
    # Slot 0 alone: the experts' GEMMs see other row counts, so last bits only (a zero slot that
    # counted would be off by a whole expert output, ~0.1 here).
    torch.testing.assert_close(got, routed_experts(x, idx[:, :1], w[:, :1], gate, up, down), rtol=1e-6, atol=1e-6)
    assert torch.equal(routed_experts(x, idx, torch.zeros_like(w), gate, up, down), torch.zeros_like(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_ranks_partial_expert_set(dtype):
    """Under tensor parallelism (EP = TP) a rank holds experts [r E/2, (r+1) E/2) and sees the others'
    ids as E: it adds only its own terms, and the two ranks' partial sums make the whole."""
    T, D, I, E, k = 31, 24, 16, 8, 4
    x, idx, w, gate, up, down = _inputs(T, D, I, E, k, torch.float32, seed=2)
    halves = []
    for r in range(2):
        local = idx - r * E // 2
        local = local.masked_fill((local < 0) | (local >= E // 2), E // 2)
        assert (local == E // 2).any() and (local < E // 2).any()
        mine = slice(r * E // 2, (r + 1) * E // 2)
        args = (x.to(dtype), local, w, gate[mine].to(dtype), up[mine].to(dtype), down[mine].to(dtype))
        got = routed_experts(*args)
        assert torch.equal(got, per_expert_index_add(*args))
        halves.append(got.float())
    if dtype == torch.float32:                                            # the split moves fp32 sums' last bits
        torch.testing.assert_close(halves[0] + halves[1], routed_experts(x, idx, w, gate, up, down),
                                   rtol=1e-5, atol=1e-5)
    nobody = torch.full_like(idx, E)                                      # every expert elsewhere
    assert torch.equal(routed_experts(x, nobody, w, gate, up, down), torch.zeros_like(x))


def test_no_tokens():
    x, idx, w, gate, up, down = _inputs(3, 16, 8, 4, 2, torch.bfloat16, seed=3)
    out = routed_experts(x[:0], idx[:0], w[:0], gate, up, down)
    assert out.shape == (0, 16) and out.dtype == torch.bfloat16
