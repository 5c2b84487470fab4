"""Fused unmasking statistics vs torch (LM head GEMM to [N, V] logits, softmax, argmax, top-2,
entropy) at LLaDA-8B's head: V=126464, D=4096, bf16. GB/s counts the weight read once."""

from __future__ import annotations

import torch
from _bench import ms, require_cuda, table


def main() -> None:
    require_cuda("bench_unmask")
    from dlm_backend.engine.kernels.unmask import unmask_stats

    V, D = 126464, 4096
    w = torch.randn(V, D, device="cuda", dtype=torch.bfloat16) / D ** 0.5
    rows = []
    for N in (8, 32, 256, 1024):
        h = torch.randn(N, D, device="cuda", dtype=torch.bfloat16)
        flops = 2 * N * V * D

        def torch_path():
            # What the engine's logits path does: bf16 [N, V] logits, then the statistics in fp32.
            return _torch_stats(torch.nn.functional.linear(h, w))

        t_tri = ms(lambda: unmask_stats(h, w, exclude_id=126336))
        t_ref = ms(torch_path)
        rows.append([N, t_tri, w.nbytes / t_tri / 1e6, flops / t_tri / 1e9, t_ref, w.nbytes / t_ref / 1e6,
                     t_ref / t_tri])
    table("unmask stats (bf16, V=126464, D=4096)", ["rows", "triton ms", "GB/s", "TFLOP/s", "torch ms", "GB/s",
                                                    "speedup"], rows)


def _torch_stats(logits: torch.Tensor):
    x = logits.float()
    logp = torch.log_softmax(x, -1)
    p = logp.exp()
    top = p.topk(2, -1).values
    return x.argmax(-1), top[:, 0], top[:, 0] - top[:, 1], -(p * logp).sum(-1)


if __name__ == "__main__":
    main()
