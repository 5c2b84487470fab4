"""Tiny FP8 (and int8) checkpoints in the layouts published tools write, made from the parity fixtures
with this file's own quantizer (scale ``amax / 448`` per tensor, row or block; e4m3 by the
round-to-nearest cast), and the float weight each stored one stands for.

* compressed-tensors, as llm-compressor saves it (compressed-tensors' ``QuantizationScheme`` presets
  FP8_DYNAMIC, FP8_BLOCK and W8A16; its ``compressors/naive_quantized``): ``<prefix>.weight``
  float8_e4m3fn (int8), ``<prefix>.weight_scale`` ``[1]`` / ``[N, 1]`` / ``[N, K / g]`` / blocks,
  ``<prefix>.input_scale`` ``[1]`` for static activations; ``ignore`` modules stay float.
* block FP8, as transformers' FineGrainedFP8 (docs/source/en/quantization/finegrained_fp8.md) and
  the DeepSeek-V3 / Qwen3-FP8 releases: ``<prefix>.weight`` float8_e4m3fn, ``<prefix>.weight_scale_inv``
  float32 ``[ceil(N / bn), ceil(K / bk)]`` (``[]`` per tensor, with ``activation_scale`` when static);
  ``modules_to_not_convert`` stay float.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FP8 = torch.float8_e4m3fn
FLOAT = ("norm", "embed", "wte", "word_embeddings", "router.scale", "layer_scalar")   # never quantized


def fp8_quantize(w: torch.Tensor, per) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q [N, K] e4m3, scale)``; ``per`` "tensor" (scale ``[]``), "channel" (``[N, 1]``) or a block
    ``(bn, bk)`` (``[ceil(N / bn), ceil(K / bk)]``, edge blocks partial), one block at a time."""
    w = w.float()
    N, K = w.shape
    bn, bk = (N, K) if per == "tensor" else (1, K) if per == "channel" else per
    scale = torch.empty(-(-N // bn), -(-K // bk))
    q = torch.empty(N, K, dtype=FP8)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            block = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            scale[i, j] = block.abs().amax().clamp(min=1e-12) / 448
            q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (block / scale[i, j]).clamp(-448, 448).to(FP8)
    return q, scale.reshape(()) if per == "tensor" else scale


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor, per) -> torch.Tensor:
    """The float32 weight ``q`` and ``scale`` stand for, block by block."""
    N, K = q.shape
    bn, bk = (N, K) if per == "tensor" else (1, K) if per == "channel" else per
    scale = scale.reshape(-(-N // bn), -(-K // bk))
    out = torch.empty(N, K)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].float() * scale[i, j]
    return out


def int8_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel as compressed-tensors computes it: ``scale = amax / 127.5``
    (its range is [-128, 127]), ``q = round(w / scale)`` clamped."""
    scale = (w.float().abs().amax(dim=1, keepdim=True) / 127.5).clamp(min=1e-12)        # [N, 1]
    return (w.float() / scale).round().clamp(-128, 127).to(torch.int8), scale


def linear(name: str, t: torch.Tensor) -> bool:
    """Whether a fixture tensor is a linear layer's weight (what the tools quantize), or a stack of
    experts' ones (``experts.gate_up_proj [E, N, K]``)."""
    stacked = t.dim() == 3 and ".experts." in name
    return stacked or t.dim() == 2 and name.endswith(".weight") and not any(f in name for f in FLOAT)


def ct_matches(module: str, pattern: str) -> bool:
    return re.match(pattern[3:], module) is not None if pattern.startswith("re:") else module == pattern


def write(src: Path, dest: Path, quant: dict, store, **config) -> dict[str, torch.Tensor]:
    """``src`` copied to ``dest`` with each tensor ``store(name, t)`` quantizes replaced by what it
    returns (``(stored tensors, float weight)`` or None: kept) and ``quantization_config`` = ``quant``;
    returns {weight name: the float weight it stands for}."""
    shutil.copytree(src, dest)
    tensors, out, expected = load_file(str(src / "model.safetensors")), {}, {}
    for name, t in tensors.items():
        got = store(name, t) if linear(name, t) else None
        if got is None:
            out[name] = t
        else:
            out.update(got[0])
            expected[name] = got[1]
    save_file(out, str(dest / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**cfg, **config, "quantization_config": quant}, indent=1))
    return expected


def ct_args(typ: str, strategy: str, dynamic: bool, **extra) -> dict:
    """QuantizationArgs as llm-compressor serializes them."""
    return {"num_bits": 8, "type": typ, "symmetric": True, "strategy": strategy, "dynamic": dynamic,
            "group_size": None, "block_structure": None, "actorder": None, "observer": None if dynamic else "minmax",
            "observer_kwargs": {}, **extra}


def compressed_tensors(src: Path, dest: Path, weights="channel", activations: str | None = "token",
                       ignore=("lm_head",), input_scales: dict | None = None, fmt="float-quantized",
                       **config) -> dict[str, torch.Tensor]:
    """A compressed-tensors checkpoint: ``weights`` "tensor" | "channel" | ("group", g) | (bn, bk) FP8,
    or "int8" (W8A16); ``activations`` "token" | "group" | "static" | None."""
    if weights == "int8":
        w_args = ct_args("int", "channel", False)
    elif isinstance(weights, tuple) and weights[0] == "group":
        w_args = ct_args("float", "group", False, group_size=weights[1])
    elif isinstance(weights, tuple):
        w_args = ct_args("float", "block", False, block_structure=list(weights))
    else:
        w_args = ct_args("float", weights, False)
    a_args = None if activations is None else (
        ct_args("float", "tensor", False) if activations == "static" else
        ct_args("float", "group", True, group_size=weights[-1]) if activations == "group" else
        ct_args("float", "token", True))
    quant = {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": w_args, "input_activations": a_args,
                                           "output_activations": None, "format": fmt}},
             "ignore": list(ignore), "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
             "global_compression_ratio": None, "version": "0.20.0"}

    def store(name, t):
        prefix = name.removesuffix(".weight")
        if t.dim() == 3 or any(ct_matches(prefix, p) for p in ignore):     # llm-compressor quantizes Linear modules
            return None
        if weights == "int8":
            q, scale = int8_quantize(t)
            return {name: q, f"{prefix}.weight_scale": scale}, q.float() * scale
        per = (1, weights[1]) if isinstance(weights, tuple) and weights[0] == "group" else weights
        q, scale = fp8_quantize(t, per)
        stored = {name: q, f"{prefix}.weight_scale": scale.reshape(1) if per == "tensor" else scale}
        if activations == "static":
            stored[f"{prefix}.input_scale"] = torch.tensor([input_scales[prefix]])
        return stored, fp8_dequantize(q, scale, per)

    return write(src, dest, quant, store, **config)


def block_fp8(src: Path, dest: Path, block=(16, 16), activation="dynamic", not_convert=("lm_head",),
              input_scales: dict | None = None, names=("weight_scale_inv", "activation_scale"),
              **config) -> dict[str, torch.Tensor]:
    """A FineGrainedFP8 checkpoint with ``weight_block_size`` ``block`` (None: per tensor); ``names``
    ("weight_scale", "input_scale") writes the per-tensor layout of AutoFP8's releases instead."""
    quant = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": activation,
             "modules_to_not_convert": list(not_convert)}
    if block is not None:
        quant["weight_block_size"] = list(block)

    def store(name, t):
        prefix = name.removesuffix(".weight")
        if any(prefix == p or prefix.endswith("." + p) for p in not_convert):
            return None
        if t.dim() == 3:                # transformers-v5 stacked experts: name_scale_inv [E, ., .]
            qs = [fp8_quantize(e, block) for e in t]
            q, scale = torch.stack([q for q, _ in qs]), torch.stack([s for _, s in qs])
            return {name: q, f"{name}_scale_inv": scale}, torch.stack([fp8_dequantize(*x, block) for x in qs])
        q, scale = fp8_quantize(t, block or "tensor")
        stored = {name: q, f"{prefix}.{names[0]}": scale}
        if activation == "static":
            stored[f"{prefix}.{names[1]}"] = torch.tensor(input_scales[prefix])
        return stored, fp8_dequantize(q, scale, block or "tensor")

    return write(src, dest, quant, store, **config)


def float_copy(src: Path, dest: Path, weights: dict[str, torch.Tensor]) -> Path:
    """``src`` copied to ``dest`` with ``weights`` (float) in place of its own: the model a quantized
    checkpoint stands for, for an emulated reference."""
    shutil.copytree(src, dest)
    tensors = load_file(str(src / "model.safetensors"))
    save_file({**tensors, **weights}, str(dest / "model.safetensors"))
    return dest


def input_scales(model, ids: torch.Tensor) -> dict[str, float]:
    """Static activation scales calibrated as llm-compressor's min-max observer does: each linear
    layer's input ``amax / 448`` over a forward of ``ids`` (one token sequence)."""
    from tests.helpers import forward

    seen: dict[str, float] = {}
    hooks = [m.register_forward_pre_hook(lambda m, args, n=n: seen.__setitem__(
                 n, max(seen.get(n, 0.0), args[0].abs().max().item() / 448)))
             for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    try:
        with torch.no_grad():
            forward(model, ids)
    finally:
        for h in hooks:
            h.remove()
    return seen


def loaded(model, name: str):
    """What the loaded model holds for checkpoint tensor ``name`` (an expert's: its entry in the stack)."""
    into = model.stacked_name(name)
    if into is not None:
        owner, _, attr = into[0].rpartition(".")
        return getattr(model.get_submodule(owner), attr)[into[1]]
    owner, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(owner), attr)


def qdq(x: torch.Tensor, g: int | None) -> torch.Tensor:
    """``x`` rounded through e4m3 as a dynamic checkpoint says, written out apart from FP8Weight: each
    token's (each of its ``g``-column groups') ``amax / 448`` scale (llm-compressor's token scheme,
    DeepSeek's act_quant)."""
    h = x.float() if g is None else x.float().unflatten(-1, (-1, g))
    s = (h.abs().amax(-1, keepdim=True) / 448).clamp(min=1e-12)
    q = (h / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
    return (q if g is None else q.flatten(-2)).to(x.dtype)


def minmax(w: torch.Tensor, args):
    """Per-strategy min/max of ``w`` (what llm-compressor's min-max observer feeds calculate_qparams)."""
    N, K = w.shape
    if args.strategy == "tensor":
        return w.min(), w.max()
    if args.strategy == "channel":
        return w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    bn, bk = args.block_structure
    b = torch.nn.functional.pad(w, (0, -K % bk, 0, -N % bn)).unflatten(0, (-1, bn)).unflatten(-1, (-1, bk))
    return b.amin((1, 3)), b.amax((1, 3))


def edit(folder, tensors=None, drop=(), **quant):
    """Change a written checkpoint: tensors replaced or dropped, quantization_config keys set."""
    if tensors or drop:
        t = load_file(str(folder / "model.safetensors"))
        save_file({k: v for k, v in {**t, **(tensors or {})}.items() if k not in drop}, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"].update(quant)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
