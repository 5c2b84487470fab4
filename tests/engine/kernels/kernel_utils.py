"""Device, dtypes and tolerances shared by the kernel tests."""

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's interpreter runs bf16 through numpy emulation; it works (triton 3.x), so bf16 is
# tested on CPU as well as on GPU.
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# fp32 products run IEEE (not TF32) in the kernels, so fp32 gets a tight tolerance.
TOL = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.float16: {"atol": 2e-3, "rtol": 2e-3},
       torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}
