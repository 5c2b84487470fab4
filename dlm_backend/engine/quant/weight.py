"""A linear weight held quantized, standing in for the ``[N, K]`` parameter of a linear layer.

A :class:`QuantizedWeight` is a module (its tensors are buffers, so ``.to()`` and ``state_dict``
see them) that torch treats as a tensor-like in ``F.linear``: the model files keep calling
``F.linear(x, self.weight)`` (``nn.Linear.forward``, the row-parallel layer, the MoE experts) and
``__torch_function__`` runs the quantized product instead. Any other torch op on it is a TypeError
naming the op, never a silent dequantisation.

Until :meth:`~QuantizedWeight.prepare` a weight is in its canonical, unpacked form, which the loader
slices like a tensor for tensor parallelism (``w[rows]``, ``w[:, cols]``, ``torch.cat`` of row
ranges); ``prepare`` then lays it out for the kernel that runs it on its device.
"""

from __future__ import annotations

from abc import abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from dlm_backend.errors import CheckpointError


class QuantizedWeight(nn.Module):
    """``[N, K]`` weight of a linear layer, quantized; ``F.linear(x [.., K], w, b) -> [.., N]``."""

    #: what the weight is, for messages and the start-up report ("int4 g128", "fp8 per-channel", ...)
    kind: str = "quantized"

    @property
    @abstractmethod
    def shape(self) -> torch.Size:
        """The logical ``[N, K]`` shape: the float weight's this one replaces."""

    @abstractmethod
    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """``x [.., K] @ W^T -> [.., N]`` in ``x``'s dtype."""

    @abstractmethod
    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The ``[N, K]`` weight this one stands for, in ``dtype`` (tests, quality tables, fallbacks)."""

    @abstractmethod
    def rows(self, index: slice) -> QuantizedWeight:
        """Output rows ``index`` (column-parallel layers keep some), before :meth:`prepare`."""

    @abstractmethod
    def cols(self, index: slice) -> QuantizedWeight:
        """Input columns ``index`` (row-parallel layers keep some), before :meth:`prepare`."""

    @abstractmethod
    def prepare(self, device: torch.device | str, dtype: torch.dtype) -> QuantizedWeight:
        """This weight on ``device``, laid out for the kernel that runs it with ``dtype`` activations."""

    @classmethod
    @abstractmethod
    def concat_rows(cls, parts: list[QuantizedWeight]) -> QuantizedWeight:
        """The row ranges ``parts`` one under the other (a fused q/k/v keeps three)."""

    @property
    def nbytes(self) -> int:
        """Bytes the weight takes (its buffers)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    @property
    def ndim(self) -> int:
        return 2

    def __getitem__(self, index) -> QuantizedWeight:
        """``w[a:b]`` (rows) or ``w[:, a:b]`` (columns): the loader's tensor-parallel slicing."""
        if isinstance(index, slice):
            return self.rows(index)
        if isinstance(index, tuple) and len(index) == 2 and index[0] == slice(None) and isinstance(index[1], slice):
            return self.cols(index[1])
        raise TypeError(f"a quantized weight is sliced by rows or by columns only, not {index!r}")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            y = weight.linear(x)
            return y if bias is None else y + bias
        if func is torch.cat and (kwargs.get("dim", args[1] if len(args) > 1 else 0) == 0):
            return cls.concat_rows(list(args[0]))
        raise TypeError(f"torch.{getattr(func, '__name__', func)} does not run on a quantized weight; only "
                        "F.linear does (the layer holding it is not one the engine quantizes).")


def aligned(index: slice, size: int, unit: int, what: str) -> slice:
    """``index`` (within ``size``) in units of ``unit``, or a CheckpointError: a quantization group
    or block cannot be split between devices."""
    start, stop, _ = index.indices(size)
    if start % unit or (stop % unit and stop != size):
        raise CheckpointError(f"A {what} of {unit} does not divide this tensor-parallel split ({start}:{stop} of "
                              f"{size}); run this checkpoint with a tensor_parallel_size that splits whole "
                              f"{what}s, or on one device.")
    return slice(start // unit, -(-stop // unit))


def to_activation(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as a kernel's input: contiguous 2-D in ``dtype`` (the CPU packed kernels take bf16)."""
    return x.reshape(-1, x.shape[-1]).to(dtype).contiguous()
