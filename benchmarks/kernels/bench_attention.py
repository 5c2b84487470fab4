"""Flash attention kernel vs torch SDPA (batched, GQA expanded) at LLaDA-8B head shapes.

Dual-cache block steps (32 queries per sequence over the whole cache) and block-start refreshes
(every position queries every position). TFLOP/s counts the two matmuls: 4 * B * H * q * L * D.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _bench import ms, require_cuda, table

H, HKV, D, L = 32, 32, 128, 768


def main() -> None:
    require_cuda("bench_attention")
    from dlm_backend.engine.kernels.attention import attention

    rows = []
    for B, q in [(1, 32), (8, 32), (32, 32), (1, L), (8, L)]:
        g = torch.Generator(device="cuda").manual_seed(0)
        qt = torch.randn(B * q, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn_like(k)
        cu = torch.arange(0, B * q + 1, q, device="cuda", dtype=torch.int32)
        ks = torch.zeros(B, device="cuda", dtype=torch.int32)
        kl = torch.full((B,), L, device="cuda", dtype=torch.int32)
        qb = qt.view(B, q, H, D).transpose(1, 2)                                 # [B, H, q, D]
        kb, vb = k.repeat_interleave(H // HKV, 1), v.repeat_interleave(H // HKV, 1)
        t_tri = ms(lambda: attention(qt, k, v, cu, ks, kl, q))
        t_sdpa = ms(lambda: F.scaled_dot_product_attention(qb, kb, vb))
        flops = 4 * B * H * q * L * D
        rows.append([B, q, L, t_tri, flops / t_tri / 1e9, t_sdpa, flops / t_sdpa / 1e9, t_sdpa / t_tri])
    table("attention (bf16, H=32, D=128)", ["batch", "q/seq", "keys", "triton ms", "TFLOP/s",
                                            "sdpa ms", "TFLOP/s", "speedup"], rows)


if __name__ == "__main__":
    main()
