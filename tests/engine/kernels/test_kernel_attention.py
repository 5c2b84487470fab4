"""Flash attention kernel against SDPA math: varlen queries, per-sequence key ranges, GQA."""

import pytest
import torch
from tests.engine.kernels.kernel_utils import DEVICE, DTYPES, TOL, ranged_attention

from dlm_backend.engine.kernels.attention import attention


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _case(q_lens, L, hq, hkv, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    T, B = sum(q_lens), len(q_lens)
    q = torch.randn(T, hq, d, generator=g).to(DEVICE, dtype)
    k = torch.randn(B, hkv, L, d, generator=g).to(DEVICE, dtype)
    v = torch.randn(B, hkv, L, d, generator=g).to(DEVICE, dtype)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    return q, k, v, _i32(cu)


def _ref32(q, k, v, cu, ks, kl, m):
    # Reference in fp32 from the same (rounded) inputs: the kernel accumulates in fp32 too.
    return ranged_attention(q.float(), k.float(), v.float(), cu, ks, kl)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,hq,hkv", [(16, 4, 2), (64, 2, 2), (32, 6, 2)])
def test_varlen_cache_ranges(dtype, d, hq, hkv):
    # Odd lengths everywhere: 1-row sequence, key ranges not multiples of the key tile, left padding.
    q_lens, L = [5, 17, 1], 37
    q, k, v, cu = _case(q_lens, L, hq, hkv, d, dtype)
    ks, kl = _i32([0, 3, 28]), _i32([37, 20, 9])
    out = attention(q, k, v, cu, ks, kl, max(q_lens))
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), _ref32(q, k, v, cu, ks, kl, max(q_lens)), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_dim_128_long_keys(dtype):
    # LLaDA-8B's head dim, more than one query tile (70 rows) and several key tiles (131 keys).
    q, k, v, cu = _case([70], 131, 2, 1, 128, dtype, seed=1)
    ks, kl = _i32([0]), _i32([131])
    out = attention(q, k, v, cu, ks, kl, 70)
    torch.testing.assert_close(out.float(), _ref32(q, k, v, cu, ks, kl, 70), **TOL[dtype])


def test_packed_new_keys_with_zero_batch_stride():
    # No cache: every sequence attends over its own new keys inside the packed [T, Hkv, D] tensor,
    # viewed as one batch shared by all (stride 0) with k_start = the sequence's first row.
    q_lens = [3, 11, 6]
    q, _, _, cu = _case(q_lens, 1, 4, 2, 16, torch.float32, seed=2)
    g = torch.Generator().manual_seed(3)
    kp = torch.randn(sum(q_lens), 2, 16, generator=g).to(DEVICE)      # [T, Hkv, D]
    vp = torch.randn(sum(q_lens), 2, 16, generator=g).to(DEVICE)
    kv = [t.transpose(0, 1)[None].expand(3, -1, -1, -1) for t in (kp, vp)]  # [3, Hkv, T, D]
    out = attention(q, kv[0], kv[1], cu, cu[:-1].contiguous(), _i32(q_lens), max(q_lens))
    for b in range(3):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        kb = kp[rows].transpose(0, 1).repeat_interleave(2, 0)
        vb = vp[rows].transpose(0, 1).repeat_interleave(2, 0)
        want = torch.nn.functional.scaled_dot_product_attention(
            q[rows].transpose(0, 1)[None], kb[None], vb[None])[0].transpose(0, 1)
        torch.testing.assert_close(out[rows], want, **TOL[torch.float32])


def test_rows_do_not_see_other_sequences():
    # Changing sequence 1's keys must leave sequence 0's output bit-identical (batch invariance).
    q, k, v, cu = _case([4, 4], 9, 2, 2, 16, torch.float32, seed=4)
    ks, kl = _i32([0, 0]), _i32([9, 9])
    a = attention(q, k, v, cu, ks, kl, 4)
    k2 = k.clone()
    k2[1] += 5
    b = attention(q, k2, v, cu, ks, kl, 4)
    assert torch.equal(a[:4], b[:4]) and not torch.equal(a[4:], b[4:])


@pytest.mark.gpu
def test_cuda_bf16_llada_shape():
    q, k, v, cu = _case([32] * 8, 544, 32, 32, 128, torch.bfloat16, seed=6)
    ks, kl = _i32([0] * 8), _i32([544, 500, 300, 544, 33, 100, 544, 200])
    out = attention(q, k, v, cu, ks, kl, 32)
    torch.testing.assert_close(out.float(), _ref32(q, k, v, cu, ks, kl, 32), **TOL[torch.bfloat16])
