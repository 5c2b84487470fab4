"""Fused MoE kernel vs the torch reference at LLaDA2-mini's routed experts (D=2048, I=512, 256 experts,
top-8, bf16).

Bandwidth counts what the layer must move at least: the gate, up and down weights of every expert the
batch touches (3 x 512 x 2048 x 2 B = 6.3 MB each) plus x and the output. At T=1 that is 8 experts,
50 MB, ~10 us at an H200's 4.8 TB/s; from T~256 nearly all 256 experts are touched (1.6 GB) and the
weight read stays the floor until the GEMMs turn compute-bound.
"""

from __future__ import annotations

import torch
from _bench import ms, require_cuda, table

D, I, E, TOP_K = 2048, 512, 256, 8


def main() -> None:
    require_cuda("bench_moe")
    from dlm_backend.engine.kernels.moe import fused_moe
    from dlm_backend.engine.layers.moe import routed_experts

    torch.manual_seed(0)
    dt, dev = torch.bfloat16, "cuda"
    gate = (torch.randn(E, I, D, device=dev) / D ** 0.5).to(dt)          # [E, I, D]
    up = (torch.randn(E, I, D, device=dev) / D ** 0.5).to(dt)
    down = (torch.randn(E, D, I, device=dev) / I ** 0.5).to(dt)           # [E, D, I]
    rows = []
    for T in (1, 32, 256, 1024):
        x = torch.randn(T, D, device=dev, dtype=dt)
        weight, idx = torch.randn(T, E, device=dev).topk(TOP_K, dim=1)    # a softmax top-k router
        weight = weight.softmax(1)
        args = (x, idx, weight, gate, up, down)
        err = (fused_moe(*args).float() - routed_experts(*args).float()).abs().max().item()
        touched = torch.unique(idx).numel()
        nbytes = touched * 3 * I * D * dt.itemsize + 2 * x.nbytes
        t_fused, t_ref = ms(lambda: fused_moe(*args)), ms(lambda: routed_experts(*args))
        rows.append([T, touched, t_fused, nbytes / t_fused / 1e6, t_ref, t_ref / t_fused, err])
    table(f"fused MoE (bf16, D={D}, I={I}, E={E}, top-{TOP_K})",
          ["tokens", "experts", "fused ms", "GB/s", "torch ms", "speedup", "max |err|"], rows)


if __name__ == "__main__":
    main()
