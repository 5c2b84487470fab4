"""Paged attention kernel against its torch reference: shuffled pages, full and block-causal
sequences in one launch, GQA, odd lengths, head dims that are not powers of two."""

import pytest
import torch
from tests.engine.kernels.kernel_utils import DEVICE, DTYPES, TOL

from dlm_backend.engine.kernels.paged_attention import paged_attention
from dlm_backend.engine.layers.paged_attention import paged_attention_ref, write_kv


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _case(q_lens, q_starts, kv_lens, blocks, hq, hkv, d, dtype, page=16, seed=0):
    """A pool filled with NaN, each sequence's keys written through a shuffled page table.

    Every slot the kernel must not read (other sequences' pages, spare pages, the tail of a last page
    past kv_len) holds NaN, so one stray read shows up as NaN in the output."""
    g = torch.Generator().manual_seed(seed)
    B = len(q_lens)
    n_pages = [-(-n // page) for n in kv_lens]
    total = sum(n_pages) + 3                                          # + spare pages, never owned
    phys = torch.randperm(total - 1, generator=g)
    table = torch.full((B, max(n_pages) + 2), total - 1, dtype=torch.int32)   # padding -> a NaN page
    k_cache = torch.full((total, page, hkv, d), float("nan"), device=DEVICE, dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    used = 0
    for b, n in enumerate(n_pages):
        table[b, :n] = phys[used:used + n]
        used += n
        pos = torch.arange(kv_lens[b])
        slots = (table[b, pos // page].long() * page + pos % page).to(DEVICE)
        write_kv(k_cache, v_cache, torch.randn(kv_lens[b], hkv, d, generator=g).to(DEVICE, dtype),
                 torch.randn(kv_lens[b], hkv, d, generator=g).to(DEVICE, dtype), slots)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(DEVICE, dtype)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    meta = (_i32(cu), _i32(q_starts), _i32(kv_lens), table.to(DEVICE), _i32(blocks))
    return q, k_cache, v_cache, meta


def _check(q, k_cache, v_cache, meta, max_q_len, dtype, scale=None):
    out = paged_attention(q, k_cache, v_cache, *meta, max_q_len, scale=scale)
    assert out.dtype == dtype and out.shape == q.shape and torch.isfinite(out).all()
    # Reference in fp32 from the same (rounded) inputs: the kernel accumulates in fp32 too.
    want = paged_attention_ref(q.float(), k_cache.float(), v_cache.float(), *meta, scale=scale)
    torch.testing.assert_close(out.float(), want, **TOL[dtype])
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,hq,hkv", [(16, 4, 2), (64, 2, 2), (40, 8, 1)])
def test_mixed_batch(dtype, d, hq, hkv):
    # One launch, four sequences: full attention and blocks of 4, 8, 32; q lengths 1, 5, 33, 70 (70 is
    # two query tiles); queries starting mid-page; kv_len never a multiple of the page (16).
    q_lens, q_starts = [1, 5, 33, 70], [40, 13, 20, 3]
    kv_lens, blocks = [41, 30, 61, 90], [0, 4, 8, 32]
    q, kc, vc, meta = _case(q_lens, q_starts, kv_lens, blocks, hq, hkv, d, dtype, seed=d + hq)
    _check(q, kc, vc, meta, max(q_lens), dtype)


@pytest.mark.parametrize("page", [16, 32, 64, 128, 8, 18, 48])
def test_page_sizes(page):
    # Powers of two >= 16: tiles of min(page, 64) keys, one per page (16, 32, 64) or two inside one
    # (128). Other sizes (the pool's pages for blocks of 8, 6, 24): tiles cross pages, per-key lookup.
    q_lens, q_starts, kv_lens, blocks = [7, 40], [150, 0], [157, 200], [32, 0]
    q, kc, vc, meta = _case(q_lens, q_starts, kv_lens, blocks, 2, 1, 32, torch.float32, page, seed=page)
    _check(q, kc, vc, meta, 40, torch.float32)


@pytest.mark.parametrize("block", [4, 8, 32])
def test_block_causal_prefill_with_scale(block):
    # A whole block-causal prefill (every position queries, 3 query tiles) with a non-default scale:
    # masked boundary tiles at every query tile, unmasked tiles below them.
    q, kc, vc, meta = _case([150], [0], [150], [block], 4, 2, 32, torch.float32, seed=block)
    _check(q, kc, vc, meta, 150, torch.float32, scale=0.3)


def test_keys_past_the_last_block_are_never_read():
    # Queries at 10..14 with blocks of 8 see keys 0..15 only; keys 16..kv_len are set to NaN in the
    # pool. Any read of them (even as 0 * v inside a masked tile) would make the output NaN.
    q, kc, vc, meta = _case([5], [10], [60], [8], 2, 2, 16, torch.float32, seed=7)
    want = paged_attention_ref(q, kc, vc, *meta)
    pages = meta[3][0, 1:4].long()                                    # logical pages 1..3: keys 16..59
    kc[pages], vc[pages] = float("nan"), float("nan")
    out = paged_attention(q, kc, vc, *meta, 5)
    torch.testing.assert_close(out, want, **TOL[torch.float32])


def test_batch_invariance_and_edges():
    # Changing sequence 1's keys leaves sequence 0's output bit-identical; an empty batch is a no-op;
    # kv_len 0 gives zeros rather than NaN.
    q, kc, vc, meta = _case([4, 4], [0, 0], [20, 20], [0, 8], 2, 2, 16, torch.float32, seed=4)
    a = paged_attention(q, kc, vc, *meta, 4)
    kc2 = kc.clone()
    kc2[meta[3][1, :2].long()] += 5
    b = paged_attention(q, kc2, vc, *meta, 4)
    assert torch.equal(a[:4], b[:4]) and not torch.equal(a[4:], b[4:])
    empty = paged_attention(q[:0], kc, vc, _i32([0]), _i32([]), _i32([]), meta[3][:0], _i32([]), 1)
    assert empty.shape == (0, 2, 16)
    zero = paged_attention(q[:4], kc, vc, _i32([0, 4]), _i32([0]), _i32([0]), meta[3][:1], _i32([0]), 4)
    assert torch.equal(zero, torch.zeros_like(zero))


def _decode_shapes(B, hq, hkv, blocks, seed):
    # Block-diffusion steps at serving shape: 32 rows per sequence ending at kv_len (so often starting
    # mid-block), kv_len 1000..2000, page 32.
    g = torch.Generator().manual_seed(seed)
    kv_lens = torch.randint(1000, 2001, (B,), generator=g).tolist()
    q_starts = [n - 32 for n in kv_lens]
    return _case([32] * B, q_starts, kv_lens, [blocks] * B, hq, hkv, 128, torch.bfloat16, 32, seed)


@pytest.mark.gpu
def test_cuda_bf16_llada2_mini_shape():
    q, kc, vc, meta = _decode_shapes(32, 16, 4, 32, seed=11)
    _check(q, kc, vc, meta, 32, torch.bfloat16)


@pytest.mark.gpu
def test_cuda_bf16_llada_8b_full_attention():
    q, kc, vc, meta = _decode_shapes(8, 32, 32, 0, seed=12)
    _check(q, kc, vc, meta, 32, torch.bfloat16)
