"""Fused residual-add + RMSNorm kernel vs the eager torch ops (add, then the fp32 norm), D=4096."""

from __future__ import annotations

import torch
from _bench import ms, require_cuda, table


def main() -> None:
    require_cuda("bench_rmsnorm")
    from dlm_backend.engine.kernels.rmsnorm import rmsnorm
    from dlm_backend.engine.layers.norm import rms_norm

    rows, D = [], 4096
    for T in (32, 1024, 8192, 32768):
        x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
        r, w = torch.randn_like(x), torch.randn(D, device="cuda", dtype=torch.bfloat16)
        nbytes = 4 * x.nbytes + w.nbytes                    # read x, r; write normed, sum
        t_tri = ms(lambda: rmsnorm(x, r, w, 1e-5))
        t_ref = ms(lambda: rms_norm(x, r, w, 1e-5))
        rows.append([T, t_tri, nbytes / t_tri / 1e6, t_ref, nbytes / t_ref / 1e6, t_ref / t_tri])
    table("rmsnorm + residual (bf16, D=4096)", ["tokens", "triton ms", "GB/s", "torch ms", "GB/s", "speedup"], rows)


if __name__ == "__main__":
    main()
