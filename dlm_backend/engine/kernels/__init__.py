"""Triton kernels (one module each: the kernel and its launcher; the torch reference is the layer's)
and the switch that decides, once per engine, whether the layers run them.

The engine's ``kernels`` setting (``$DLM_KERNELS``, read when its configuration is made) picks:
``auto`` (default) runs the kernels on CUDA devices when Triton imports and the torch code
everywhere else; ``torch`` always runs the torch code; ``triton`` always runs the kernels, which on
a CPU tensor needs Triton's interpreter (``TRITON_INTERPRET=1``, slow, for tests). The kernels are
forward-only. Nothing here imports Triton until a kernel is actually wanted, so CPU installs
without it work unchanged.
"""

from __future__ import annotations

import functools
import os

import torch

from dlm_backend.errors import DLMError

MODES = ("auto", "triton", "torch")


@functools.cache
def triton_available() -> bool:
    """Whether ``import triton`` works here."""
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False
    return True


@functools.cache
def interpreting() -> bool:
    """Whether Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1``).

    Read from the environment once, on first use: Triton itself decides it when a kernel is defined,
    so a later change would not switch the kernels over anyway, and the launchers ask per launch."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_kernels(mode: str, device: torch.device | str) -> bool:
    """Whether an engine on ``device`` runs the Triton kernels, for a ``DLM_KERNELS`` mode.

    Decided once, when the engine is built; the layers then read the answer from the forward context.
    Raises DLMError for an unknown mode or when ``triton`` cannot be honoured (no Triton, or a CPU
    device without the interpreter), instead of silently running something else.
    """
    if mode not in MODES:
        raise DLMError(f"DLM_KERNELS={mode!r} is not a kernel mode; set it to one of {', '.join(MODES)} "
                       "(or unset it for 'auto').")
    if mode == "torch":
        return False
    is_cuda = torch.device(device).type == "cuda"
    if mode == "auto":
        return is_cuda and triton_available()
    if not triton_available():
        raise DLMError("DLM_KERNELS=triton but Triton is not importable; install it with "
                       "`pip install -e .[triton]`, or set DLM_KERNELS=auto to use the torch path.")
    if not is_cuda and not interpreting():
        raise DLMError("DLM_KERNELS=triton on a CPU device needs Triton's interpreter: set TRITON_INTERPRET=1 "
                       "before starting Python (slow; meant for tests), or set DLM_KERNELS=auto.")
    return True


__all__ = ["MODES", "interpreting", "resolve_kernels", "triton_available"]
