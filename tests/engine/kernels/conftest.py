"""Kernel tests run on CUDA when present, else through Triton's interpreter on CPU.

TRITON_INTERPRET must be set before triton is imported (``triton.jit`` reads it when a kernel is
defined), so it is set here, at collection, before any kernel module is imported.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton  # noqa: F401
except ImportError:  # CPU installs without the [triton] extra: only the script checks can run
    collect_ignore_glob = ["test_kernel_*.py", "test_gpu_parity.py"]
