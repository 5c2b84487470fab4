"""GPTQ and AWQ checkpoints written for tests: a round-to-nearest quantizer and the published packed
layouts, written here from their documentation, apart from the engine's readers.

* GPTQ (AutoGPTQ / GPTQModel ``QuantLinear.pack``; vLLM's ``gptq`` reader): ``qweight`` int32
  ``[K * bits / 32, N]``, word ``r`` holds input rows ``r * (32 / bits) + j`` at bits ``bits * j``;
  ``qzeros`` int32 ``[G, N * bits / 32]`` the same along output columns, each zero stored minus one
  in the v1 layout (``zeros -= 1`` before packing), as is in ``gptq_v2``; ``scales`` fp16 ``[G, N]``;
  ``g_idx`` int32 ``[K]``, the group of each input column.
* AWQ GEMM (AutoAWQ ``WQLinear_GEMM.from_linear``; vLLM's ``awq`` reader): ``qweight`` int32
  ``[K, N / 8]``, nibble ``i`` of word ``c`` holds output column ``8c + ORDER[i]``; ``qzeros`` int32
  ``[G, N / 8]`` the same; ``scales`` fp16 ``[G, N]``.

Every reference weight is the test's own dequantization of the levels it packed, in float32.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)     # AutoAWQ's order_map: the output column each nibble holds


def rtn(w: torch.Tensor, bits: int, g_idx: torch.Tensor, groups: int, sym: bool, min_zero: int = 0):
    """Round-to-nearest of a float ``[N, K]`` weight, one scale and zero per (group, output column) as
    GPTQ's quantizer computes them: ``(q [K, N] levels, scales [G, N] fp16, zeros [G, N] int64)``."""
    maxq = 2**bits - 1
    wt = w.t().double()                                                   # [K, N]
    lo = torch.stack([wt[g_idx == g].amin(0) for g in range(groups)]).clamp(max=0)       # [G, N]
    hi = torch.stack([wt[g_idx == g].amax(0) for g in range(groups)]).clamp(min=0)
    if sym:
        hi = torch.maximum(-lo, hi)
        lo = -hi
    scales = ((hi - lo) / maxq).clamp(min=1e-6).half()                    # the stored scale
    s = scales.double()
    zeros = torch.full_like(s, (maxq + 1) // 2) if sym else (-lo / s).round().clamp(min_zero, maxq)
    zeros = zeros.long()
    q = (wt / s[g_idx] + zeros[g_idx]).round().clamp(0, maxq).long()      # [K, N]
    return q, scales, zeros


def dequantize(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """``W [N, K]`` in float32 from levels ``[K, N]``: ``(q - z[g_idx]) * s[g_idx]``."""
    return ((q - zeros[g_idx]).float() * scales.float()[g_idx]).t().contiguous()


def to_int32(words: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit words held in int64 -> int32 with the same bits."""
    words = words & 0xFFFFFFFF
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_rows(levels: torch.Tensor, bits: int) -> torch.Tensor:
    """``[R, C]`` levels -> int32 ``[R * bits / 32, C]``: ``32 / bits`` consecutive rows a word, first lowest."""
    per = 32 // bits
    out = torch.zeros(levels.shape[0] // per, levels.shape[1], dtype=torch.int64)
    for row in range(out.shape[0]):
        for j in range(per):
            out[row] |= (levels[row * per + j] & (2**bits - 1)) << (bits * j)
    return to_int32(out)


def pack_cols(levels: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """``[R, C]`` levels -> int32 ``[R, C * bits / 32]``: field ``i`` of word ``c`` holds column
    ``c * per + order[i]`` (``order`` defaults to 0, 1, 2, ..)."""
    per = 32 // bits
    order = order or range(per)
    out = torch.zeros(levels.shape[0], levels.shape[1] // per, dtype=torch.int64)
    for col in range(out.shape[1]):
        for i, j in enumerate(order):
            out[:, col] |= (levels[:, col * per + j] & (2**bits - 1)) << (bits * i)
    return to_int32(out)


def gptq_tensors(w: torch.Tensor, bits: int, group: int, sym: bool = False, v2: bool = False,
                 act_order: torch.Generator | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A float ``[N, K]`` weight as GPTQ's stored tensors (by suffix) and its dequantized reference.
    ``act_order``: draw a random column order, as ``desc_act`` does, and scatter the groups by it."""
    N, K = w.shape
    group = K if group == -1 else group
    g_idx = torch.arange(K) // group
    if act_order is not None:       # GPTQ quantizes columns in its order p; column p[i] joins group i // g
        order = torch.randperm(K, generator=act_order)
        g_idx = torch.empty(K, dtype=torch.long)
        g_idx[order] = torch.arange(K) // group
    # v1 stores zero - 1, so a zero of 0 would be written as -1 (AutoGPTQ's known limit): quantize with zeros >= 1.
    q, scales, zeros = rtn(w, bits, g_idx, K // group, sym, min_zero=0 if v2 else 1)
    stored = zeros if v2 else zeros - 1
    tensors = {"qweight": pack_rows(q, bits), "qzeros": pack_cols(stored, bits), "scales": scales,
               "g_idx": g_idx.to(torch.int32)}
    return tensors, dequantize(q, scales, zeros, g_idx)


def awq_tensors(w: torch.Tensor, group: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A float ``[N, K]`` weight as AutoAWQ GEMM's stored tensors (by suffix) and its dequantized reference."""
    N, K = w.shape
    group = K if group == -1 else group
    g_idx = torch.arange(K) // group
    q, scales, zeros = rtn(w, 4, g_idx, K // group, sym=False)
    tensors = {"qweight": pack_cols(q, 4, AWQ_ORDER), "qzeros": pack_cols(zeros, 4, AWQ_ORDER), "scales": scales}
    return tensors, dequantize(q, scales, zeros, g_idx)


def quantize_checkpoint(folder: Path, quant_config: dict, pack, names) -> dict[str, torch.Tensor]:
    """Replace each float ``<prefix>.weight`` in ``names`` of the checkpoint in ``folder`` by the
    tensors ``pack(name, w)`` returns, and declare ``quant_config`` in its config.json. Returns the
    reference dequantized weight by name."""
    path = folder / "model.safetensors"
    state = load_file(path)
    reference = {}
    for name in names:
        tensors, reference[name] = pack(name, state.pop(name))
        prefix = name.removesuffix(".weight")
        state.update({f"{prefix}.{suffix}": t.contiguous() for suffix, t in tensors.items()})
    save_file(state, path)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quant_config
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return reference


def write_float(folder: Path, weights: dict[str, torch.Tensor]) -> None:
    """Overwrite the named float tensors of the checkpoint in ``folder`` (a reference model)."""
    path = folder / "model.safetensors"
    state = load_file(path)
    state.update({k: v.contiguous() for k, v in weights.items()})
    save_file(state, path)
