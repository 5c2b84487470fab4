"""Fused greedy unmasking (token and its probability) vs the LM head's torch path (GEMM to [N, V]
logits, fp32 softmax, argmax) at LLaDA-8B's head: V=126464, D=4096, bf16. GB/s counts the weight
read once."""

from __future__ import annotations

import torch
from _bench import ms, require_cuda, table


def main() -> None:
    require_cuda("bench_unmask")
    from dlm_backend.engine.kernels.unmask import unmask_stats
    from dlm_backend.engine.layers.head import greedy_confidence

    V, D = 126464, 4096
    w = torch.randn(V, D, device="cuda", dtype=torch.bfloat16) / D ** 0.5
    rows = []
    for N in (8, 32, 256, 1024):
        h = torch.randn(N, D, device="cuda", dtype=torch.bfloat16)
        flops = 2 * N * V * D

        t_tri = ms(lambda: unmask_stats(h, w, exclude_id=126336))
        t_ref = ms(lambda: greedy_confidence(h, w, exclude_id=126336))
        rows.append([N, t_tri, w.nbytes / t_tri / 1e6, flops / t_tri / 1e9, t_ref, w.nbytes / t_ref / 1e6,
                     t_ref / t_tri])
    table("unmask stats (bf16, V=126464, D=4096)", ["rows", "triton ms", "GB/s", "TFLOP/s", "torch ms", "GB/s",
                                                    "speedup"], rows)


if __name__ == "__main__":
    main()
