"""Fused SwiGLU kernel vs eager ``F.silu(gate) * up`` at LLaDA-8B's MLP width (12288)."""

from __future__ import annotations

import torch
from _bench import ms, require_cuda, table


def main() -> None:
    require_cuda("bench_swiglu")
    from dlm_backend.engine.kernels.swiglu import swiglu
    from dlm_backend.engine.layers.mlp import silu_mul

    rows = []
    for T in (32, 1024, 8192, 32768):
        g = torch.randn(T, 12288, device="cuda", dtype=torch.bfloat16)
        u = torch.randn_like(g)
        nbytes = 3 * g.nbytes
        t_tri, t_ref = ms(lambda: swiglu(g, u)), ms(lambda: silu_mul(g, u))
        rows.append([T, t_tri, nbytes / t_tri / 1e6, t_ref, nbytes / t_ref / 1e6, t_ref / t_tri])
    table("swiglu (bf16, I=12288)", ["tokens", "triton ms", "GB/s", "torch ms", "GB/s", "speedup"], rows)


if __name__ == "__main__":
    main()
