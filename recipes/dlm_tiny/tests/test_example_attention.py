"""Per-example bucketed attention for packed training rows against the block-diagonal mask it replaces."""

import pytest
import torch
import torch.nn.functional as F

from dlm_tiny.example_attention import BUCKETS, MATH_UP_TO, ExampleAttention


def _rows(lengths_per_row: list[list[int]], L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``ex`` and ``pos`` ``[B, L]`` for rows packed with examples of these lengths (the rest is tail)."""
    ex = torch.full((len(lengths_per_row), L), -1)
    pos = torch.zeros_like(ex)
    e = 0
    for r, lengths in enumerate(lengths_per_row):
        at = 0
        for n in lengths:
            ex[r, at:at + n], pos[r, at:at + n] = e, torch.arange(n)
            e, at = e + 1, at + n
    return ex, pos


def _dense(q, k, v, ex, pos, causal):
    """The block-diagonal reference: every query over its whole row, other examples masked out."""
    B, L = ex.shape
    causal_tok = causal[ex.clamp_min(0)] & (ex >= 0)
    attend = (ex[:, :, None] == ex[:, None, :]) & (~causal_tok[:, :, None] | (pos[:, None, :] <= pos[:, :, None]))
    qb, kb, vb = (t.view(B, L, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    kb, vb = kb.repeat_interleave(rep, 1), vb.repeat_interleave(rep, 1)
    o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=attend[:, None])
    return o.transpose(1, 2).reshape(q.shape)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_bucketed_attention_matches_the_block_diagonal_mask(dtype, tol):
    # odd lengths on both sides of MATH_UP_TO, a one-token example, a row tail, GQA (4 query heads, 2 kv)
    ex, pos = _rows([[7, 40, 1, 33, 150, 9], [MATH_UP_TO + 1, 3], [300]], L=300)
    E = int(ex.max()) + 1
    causal = torch.arange(E) % 2 == 1
    gen = torch.Generator().manual_seed(0)
    T = ex.numel()
    q, k, v = (torch.randn(T, h, 8, generator=gen).to(dtype).requires_grad_() for h in (4, 2, 2))
    used = (ex >= 0).reshape(-1)
    out = ExampleAttention(ex, causal).attend(q, k, v, layer=0)
    ref = _dense(q, k, v, ex, pos, causal)
    torch.testing.assert_close(out[used], ref[used], atol=tol, rtol=tol)
    assert not out[~used].any()                                               # the tail reads nothing
    upstream = torch.randn(out.shape, generator=gen).to(dtype) * used[:, None, None]
    got = torch.autograd.grad((out * upstream).sum(), (q, k, v))
    want = torch.autograd.grad((ref * upstream).sum(), (q, k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tol * 4, rtol=tol * 4)


def test_buckets_cover_each_example_once_and_refuse_what_does_not_fit():
    ex, _ = _rows([[20, 30, 64, 65, 300]], L=512)
    attn = ExampleAttention(ex, torch.zeros(5, dtype=torch.bool))
    sizes = [index.shape[1] for index, _, _ in attn.groups]
    assert sizes == [32, 64, 96, 384]                       # 20 and 30 share the 32 bucket
    covered = torch.cat([index[valid] for index, valid, _ in attn.groups])
    assert sorted(covered.tolist()) == (ex.reshape(-1) >= 0).nonzero().flatten().tolist()
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        ExampleAttention(torch.zeros(1, BUCKETS[-1] + 1, dtype=torch.long), torch.zeros(1, dtype=torch.bool))


def test_an_example_split_across_a_row_is_refused():
    ex = torch.tensor([[0, 0, 1, 1, 0, -1]])                # example 0 is not contiguous
    with pytest.raises(ValueError, match="must be contiguous"):
        ExampleAttention(ex, torch.zeros(2, dtype=torch.bool))
