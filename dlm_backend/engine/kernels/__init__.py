"""Triton kernels, each beside a pure-torch reference with the same signature, and the switch
that decides which one the layers run.

``DLM_KERNELS`` picks: ``auto`` (default) runs the kernels on CUDA devices when Triton imports and
the torch code everywhere else; ``torch`` always runs the torch code; ``triton`` always runs the
kernels, which on a CPU tensor needs Triton's interpreter (``TRITON_INTERPRET=1``, slow, for
tests). The kernels are forward-only, so a pass that records autograd runs the torch code whatever
the mode (:func:`use_kernels`). Nothing here imports Triton until a kernel is actually wanted, so CPU installs without it
work unchanged.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch

from dlm_backend.errors import DLMError

MODES = ("auto", "triton", "torch")


class UnmaskStats(NamedTuple):
    """Per-row unmasking statistics (kernels/unmask.py, DiffusionLM.compute_unmask_stats)."""

    token: torch.Tensor      # [N] int64 chosen token
    prob: torch.Tensor       # [N] fp32 softmax probability of that token
    margin: torch.Tensor     # [N] fp32 top-1 minus top-2 probability
    entropy: torch.Tensor    # [N] fp32 entropy of the softmax (nats)


def kernels_mode() -> str:
    """The ``DLM_KERNELS`` setting (``auto`` when unset)."""
    mode = os.environ.get("DLM_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise DLMError(f"DLM_KERNELS={mode!r} is not a kernel mode; set it to one of {', '.join(MODES)} "
                       "(or unset it for 'auto').")
    return mode


@functools.cache
def triton_available() -> bool:
    """Whether ``import triton`` works here."""
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(device: torch.device | str) -> bool:
    """Whether tensors on ``device`` should go through the Triton kernels.

    Raises DLMError when ``DLM_KERNELS=triton`` cannot be honoured (no Triton, or a CPU device
    without the interpreter), instead of silently running something else.
    """
    mode = kernels_mode()
    if mode == "torch":
        return False
    is_cuda = torch.device(device).type == "cuda"
    if mode == "auto":
        return is_cuda and triton_available()
    if not triton_available():
        raise DLMError("DLM_KERNELS=triton but Triton is not importable; install it with "
                       "`pip install -e .[triton]`, or set DLM_KERNELS=auto to use the torch path.")
    if not is_cuda and not _interpreting():
        raise DLMError("DLM_KERNELS=triton on a CPU device needs Triton's interpreter: set TRITON_INTERPRET=1 "
                       "before starting Python (slow; meant for tests), or set DLM_KERNELS=auto.")
    return True


def use_kernels(t: torch.Tensor) -> bool:
    """Whether a layer should run its Triton kernel on ``t``: :func:`use_triton` for its device, and
    no autograd recording (the kernels are forward-only; training runs the torch code)."""
    return not torch.is_grad_enabled() and use_triton(t.device)


__all__ = ["MODES", "UnmaskStats", "use_kernels", "kernels_mode", "triton_available", "use_triton"]
