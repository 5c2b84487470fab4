"""On-the-fly quantization of a full-precision checkpoint (``quantization="int8" | "int4" | "fp8"``),
and where quantized weights go in a model.

Each layer class names the parameters it lets be quantized (``quantized_params``: the linear layers'
``weight``, the stacked experts' tensors); everything else (embeddings, the LM head, routers, norms)
stays as published, as in GPTQ/AWQ/FP8 releases, which leave the head and router in 16 bits.
"""

from __future__ import annotations

import torch
from torch import nn

from dlm_backend.engine.quant.experts import QuantizedExperts
from dlm_backend.engine.quant.fp8_weight import FP8, FP8_MAX, FP8Weight
from dlm_backend.engine.quant.int_weight import INT4_GROUPS, IntWeight
from dlm_backend.engine.quant.weight import QuantizedWeight
from dlm_backend.errors import DLMError

#: The on-the-fly methods, and what each one is (for messages and docs/quantization.md).
METHODS = {
    "int8": "weight-only int8, symmetric, one scale per output channel",
    "int4": "weight-only int4, asymmetric, a scale and zero per 128 input columns",
    "fp8": "fp8 e4m3 weights, one scale per output channel, each token's activations quantized to fp8",
}
INT4_GROUP = 128        # torchao's and GPTQ's default: 1.2% more memory than no groups at K = 4096, far less error
#: What an untied LM head gets under each method (None: it stays in float). Its error lands on every
#: logit, so the integer methods keep it at int8 per channel (llama.cpp's Q4_K_M keeps it at 6 bits);
#: quantized, it stops being a third of a CPU block pass (a [32, 1024] x [1024, 32000] float32 head
#: took 16 of 48 ms with int8 layers at d_model 1024). FP8 emulation would make it slower on CPU.
HEAD_METHODS = {"int8": "int8", "int4": "int8", "fp8": None}


def check_quantization(method: str | None) -> None:
    """A DLMError for a quantization method this engine does not apply (None: full precision)."""
    if method is not None and method not in METHODS:
        raise DLMError(f"quantization {method!r} is not a method this engine applies; use one of "
                       f"{', '.join(METHODS)} (or none for the checkpoint's own precision).")


def quantize_weight(w: torch.Tensor, method: str) -> QuantizedWeight:
    """A float ``[N, K]`` weight quantized by ``method`` (canonical form, not yet prepared)."""
    w = w.float()
    N, K = w.shape
    if method == "int8":
        scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)             # [N, 1]
        return IntWeight((w / scale).round().clamp(-127, 127).to(torch.int8), scale, None, 8)
    if method == "int4":
        g = next((g for g in sorted(INT4_GROUPS, reverse=True) if g <= INT4_GROUP and K % g == 0), K)
        h = w.view(N, K // g, g)
        lo, hi = h.amin(dim=-1), h.amax(dim=-1)                                         # [N, G]
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        q = ((h - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8).view(N, K)
        return IntWeight(q, scale, lo, 4)
    if method == "fp8":
        scale = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-12)          # [N, 1]
        return FP8Weight((w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale, None, "token")
    check_quantization(method)
    raise AssertionError(method)


def quantize_stack(w: torch.Tensor, method: str) -> QuantizedExperts:
    """Stacked expert weights ``[E, N, K]`` quantized expert by expert."""
    return QuantizedExperts([quantize_weight(w[e], method) for e in range(w.shape[0])])


def is_head(module: nn.Module) -> bool:
    """Whether a layer is an LM head (``quantized_role = "head"``), quantized by :data:`HEAD_METHODS`."""
    return getattr(type(module), "quantized_role", None) == "head"


def quantizable(model: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """Every parameter name a quantized weight may replace -> (its module, the attribute)."""
    out = {}
    for prefix, module in model.named_modules():
        for param in getattr(type(module), "quantized_params", ()):
            out[f"{prefix}.{param}" if prefix else param] = (module, param)
    return out


def install(module: nn.Module, param: str, value: QuantizedWeight | QuantizedExperts) -> None:
    """Put a quantized weight (or expert stack) where ``module.param`` was; a module that keeps its
    weight in another form once quantized (split halves) is told through ``on_quantized``."""
    module._parameters.pop(param, None)
    setattr(module, param, value)
    hook = getattr(module, "on_quantized", None)
    if hook is not None:
        hook(param)


def quantize_model(model: nn.Module, method: str, device, dtype: torch.dtype) -> nn.Module:
    """Quantize a model already in memory (benchmarks, tests): every parameter :func:`quantizable`
    names, laid out for ``device``; the loader does the same tensor by tensor as it reads them."""
    check_quantization(method)
    for module, attr in quantizable(model).values():
        how = HEAD_METHODS[method] if is_head(module) else method
        if how is not None:
            w = getattr(module, attr).detach()
            install(module, attr, (quantize_weight if w.dim() == 2 else quantize_stack)(w, how))
    for m in model.modules():
        if isinstance(m, QuantizedWeight):
            m.prepare(device, dtype)
    return model


def quantized_summary(model: nn.Module) -> tuple[dict[str, int], int]:
    """({kind: weights of that kind}, bytes the quantized weights take) for the start-up report."""
    kinds: dict[str, int] = {}
    nbytes = 0
    for m in model.modules():
        if isinstance(m, QuantizedWeight) and not isinstance(m, QuantizedExperts):
            kinds[m.kind] = kinds.get(m.kind, 0) + 1
            nbytes += m.nbytes
    return kinds, nbytes
