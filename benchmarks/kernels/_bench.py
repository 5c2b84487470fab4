"""Shared bits of the kernel benchmarks: CUDA check, timing, table output."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))     # run from a plain repo copy


def require_cuda(name: str) -> None:
    """Exit with a clear message when there is no GPU (the kernels are Triton/CUDA only)."""
    if not torch.cuda.is_available():
        sys.exit(f"{name}: needs a CUDA GPU with Triton; on CPU the kernels are checked (not timed) by "
                 "`TRITON_INTERPRET=1 pytest tests/engine/kernels`.")
    try:
        import triton  # noqa: F401
    except ImportError:
        sys.exit(f"{name}: Triton is not importable; install it with `pip install -e .[triton]`.")


def ms(fn) -> float:
    """Median milliseconds per call (Triton's do_bench: warm-up, L2 flush, CUDA events)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def table(title: str, headers: list[str], rows: list[list]) -> None:
    """Print a fixed-width table."""
    cells = [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    sys.stdout.flush()
