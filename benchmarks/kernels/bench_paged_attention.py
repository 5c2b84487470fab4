"""Paged attention kernel vs torch SDPA at LLaDA2-mini and LLaDA-8B head shapes (bf16, page 32).

Rows:
- denoise: a block-diffusion step, 32 query rows per sequence (one block of 32) at the end of kv_len
  keys, block-causal; Hq=16, Hkv=4, D=128 (LLaDA2-mini). The block is the last one, so it sees every
  key and SDPA needs no mask.
- dual-cache: a full-attention step of one 32-row block over the whole cached sequence, Hq=Hkv=32
  (LLaDA-8B with the dual cache).
- prefill: every position of a 2048-token prompt queries block-causally (Hq=16, Hkv=4); the kernel
  skips the key tiles past each query tile's block, SDPA takes a [q, L] boolean mask.

The baseline is SDPA on K/V already gathered from the pages into contiguous [B, H, L, D]; the gather
is excluded from its time, which favours torch. Its time is the faster of GQA heads expanded and
``enable_gqa=True``. TFLOP/s counts the two matmuls over visible (query, key) pairs: 4 * pairs * H * D.
"err" is the max |triton - sdpa|.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _bench import ms, require_cuda, table

D, PAGE, BLOCK = 128, 32, 32


def _pool(B, L, hkv, gen):
    """A pool of B sequences x L keys in pages laid out in shuffled physical order."""
    n = L // PAGE
    k_cache = torch.randn(B * n, PAGE, hkv, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(B * n, device="cuda", generator=gen).to(torch.int32).view(B, n)
    return k_cache, v_cache, table


def _contiguous(cache, table):
    """[P, S, Hkv, D] through [B, n] pages -> [B, Hkv, L, D] (the baseline's untimed gather)."""
    B, n = table.shape
    return cache[table.long()].reshape(B, n * PAGE, *cache.shape[2:]).transpose(1, 2).contiguous()


def _sdpa_ms(qb, kb, vb, mask):
    """Faster of SDPA with the KV heads expanded and SDPA with enable_gqa (and that output)."""
    rep = qb.shape[1] // kb.shape[1]
    ke, ve = kb.repeat_interleave(rep, 1), vb.repeat_interleave(rep, 1)
    out = F.scaled_dot_product_attention(qb, ke, ve, attn_mask=mask)
    best = ms(lambda: F.scaled_dot_product_attention(qb, ke, ve, attn_mask=mask))
    if rep > 1:
        try:
            best = min(best, ms(lambda: F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask,
                                                                        enable_gqa=True)))
        except RuntimeError:          # no backend of this torch takes GQA with these inputs
            pass
    return best, out


def _row(name, B, q, L, hq, hkv, block):
    from dlm_backend.engine.kernels.paged_attention import paged_attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    k_cache, v_cache, table = _pool(B, L, hkv, gen)
    qt = torch.randn(B * q, hq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    i32 = dict(device="cuda", dtype=torch.int32)
    cu = torch.arange(0, B * q + 1, q, **i32)
    q_start = torch.full((B,), L - q, **i32)                     # queries end at the last key
    kv_len = torch.full((B,), L, **i32)
    blocks = torch.full((B,), block, **i32)
    qpos = torch.arange(L - q, L, device="cuda")
    kpos = torch.arange(L, device="cuda")
    vis = (kpos[None, :] // block <= qpos[:, None] // block) if block else None    # [q, L]
    pairs = int(vis.sum()) if vis is not None else q * L
    mask = vis if vis is not None and not bool(vis.all()) else None
    qb = qt.view(B, q, hq, D).transpose(1, 2)                                   # [B, Hq, q, D]
    kb, vb = _contiguous(k_cache, table), _contiguous(v_cache, table)

    def run():
        return paged_attention(qt, k_cache, v_cache, cu, q_start, kv_len, table, blocks, q)

    t_tri = ms(run)
    t_sdpa, want = _sdpa_ms(qb, kb, vb, mask)
    err = (run().view(B, q, hq, D).transpose(1, 2).float() - want.float()).abs().max().item()
    flops = 4 * B * pairs * hq * D
    return [name, B, q, L, f"{hq}/{hkv}", t_tri, flops / t_tri / 1e9, t_sdpa, flops / t_sdpa / 1e9,
            t_sdpa / t_tri, f"{err:.1e}"]


def main() -> None:
    require_cuda("bench_paged_attention")
    rows = []
    for L in (512, 2048, 8192):
        for B in (1, 8, 32):
            rows.append(_row("denoise", B, BLOCK, L, 16, 4, BLOCK))
    for B in (1, 8, 32):
        rows.append(_row("dual-cache", B, BLOCK, 2048, 32, 32, 0))
    for B in (1, 4):
        rows.append(_row("prefill", B, 2048, 2048, 16, 4, BLOCK))
    table("paged attention (bf16, D=128, page 32, block 32; sdpa on pre-gathered K/V)",
          ["step", "batch", "q/seq", "keys", "Hq/Hkv", "triton ms", "TFLOP/s", "sdpa ms", "TFLOP/s",
           "speedup", "err"], rows)


if __name__ == "__main__":
    main()
