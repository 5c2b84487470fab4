"""Device, dtypes and tolerances shared by the kernel tests."""

import torch

from dlm_backend.engine.layers.attention import sdpa

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's interpreter runs bf16 through numpy emulation; it works (triton 3.x), so bf16 is
# tested on CPU as well as on GPU.
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# fp32 products run IEEE (not TF32) in the kernels, so fp32 gets a tight tolerance.
TOL = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.float16: {"atol": 2e-3, "rtol": 2e-3},
       torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


def ranged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                     k_start: torch.Tensor, k_len: torch.Tensor) -> torch.Tensor:
    """:func:`sdpa` in the flash kernel's layout (its reference): packed queries ``q [T, Hq, D]`` with
    row offsets ``cu_q [B+1]``; sequence b attends over ``k[b, :, k_start[b]:k_start[b] + k_len[b]]``."""
    out = torch.empty_like(q)
    cu, ks, kl = cu_q.tolist(), k_start.tolist(), k_len.tolist()
    for b in range(len(kl)):
        keys = slice(ks[b], ks[b] + kl[b])
        o = sdpa(q[cu[b]:cu[b + 1]].transpose(0, 1)[None], k[b, :, keys][None], v[b, :, keys][None])
        out[cu[b]:cu[b + 1]] = o[0].transpose(0, 1)
    return out
