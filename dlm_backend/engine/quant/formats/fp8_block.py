"""FP8 checkpoints of ``quant_method: "fp8"``: the block-wise FP8 of DeepSeek-V3 and Qwen3-FP8
(transformers' FineGrainedFP8), and the per-tensor FP8 of AutoFP8-era releases.

config.json's ``quantization_config``: ``fmt: "e4m3"``, ``activation_scheme`` ``"dynamic"`` or
``"static"``, ``weight_block_size: [bn, bk]`` (``[128, 128]`` in every published one; absent: one
scale per tensor) and ``modules_to_not_convert`` (modules left in 16 bits, e.g. ``lm_head``). Each
quantized linear ``<prefix>`` stores ``<prefix>.weight`` in float8_e4m3fn ``[N, K]`` and
``<prefix>.weight_scale_inv`` float32 ``[ceil(N / bn), ceil(K / bk)]``: despite the name the
weight is ``W = weight * weight_scale_inv`` block by block (transformers' ``_dequantize_fp8_weight``).
Per-tensor checkpoints store a scale of shape ``[]`` or ``[1]`` (AutoFP8 calls it ``weight_scale``)
and, with static activations, ``input_scale`` (transformers: ``activation_scale``).

Activations follow the checkpoint: dynamic ones with blocks are rounded to e4m3 per token and per
``bk`` columns, each group by its own ``amax / 448`` (DeepSeek's ``act_quant``, transformers'
finegrained-fp8 kernel), dynamic ones without blocks per token, static ones by ``input_scale``.
transformers-v5 MoE experts stored stacked (``experts.gate_up_proj [E, N, K]`` with
``experts.gate_up_proj_scale_inv [E, ., .]``) become a stack of FP8 experts.
"""

from __future__ import annotations

import re

import torch

from dlm_backend.engine.quant.experts import QuantizedExperts
from dlm_backend.engine.quant.fp8_weight import FP8, FP8Weight
from dlm_backend.engine.quant.formats import QuantFormat
from dlm_backend.errors import CheckpointError

WHERE = "config.json quantization_config"
SCALES = ("_scale_inv", "_scale")           # block/per-tensor FineGrainedFP8, AutoFP8 per-tensor
INPUT_SCALES = ("input_scale", "activation_scale")


def fp8_weight(name: str, w: torch.Tensor, scale_name: str, scale: torch.Tensor, per, activation: str,
               input_scale: torch.Tensor | None = None, input_name: str = "input_scale") -> FP8Weight:
    """The FP8Weight of stored tensor ``name`` with scales ``scale_name``, or a CheckpointError naming
    whichever is malformed. ``per``: ``"tensor"``, ``"channel"`` or a block ``(bn, bk)``."""
    if w.dtype != FP8 or w.dim() != 2:
        raise CheckpointError(f"{name}: an FP8 checkpoint stores its weights as 2-D float8_e4m3fn, found "
                              f"{str(w.dtype).removeprefix('torch.')} {list(w.shape)}. The file does not match its "
                              "quantization_config: re-download the checkpoint.")
    N, K = w.shape
    if not scale.is_floating_point():
        raise CheckpointError(f"{scale_name}: scales must be floating point, found {scale.dtype}. Re-download "
                              "the checkpoint.")
    if per == "tensor":
        ok, want = scale.numel() == 1, "[] or [1] (one scale per tensor)"
    elif per == "channel":
        ok, want = tuple(scale.shape) in ((N, 1), (N,)), f"[{N}, 1] (one scale per output channel)"
        scale = scale.reshape(N, 1)
    else:
        rows, cols = -(-N // per[0]), -(-K // per[1])                    # ceil: edge blocks are partial
        ok, want = tuple(scale.shape) == (rows, cols), f"[{rows}, {cols}] (one per {per[0]}x{per[1]} block)"
    if not ok:
        raise CheckpointError(f"{scale_name}: shape {list(scale.shape)} does not fit the weight {name} {[N, K]}; "
                              f"it needs {want}. The file does not match its quantization_config: re-download "
                              "the checkpoint.")
    if input_scale is not None and input_scale.numel() != 1:
        raise CheckpointError(f"{input_name}: a static activation scale is one number, found shape "
                              f"{list(input_scale.shape)}. Re-download the checkpoint.")
    if activation == "static" and input_scale is None:
        raise CheckpointError(f"{name}: static activations need {input_name}, which the checkpoint lacks. "
                              "Re-download the checkpoint.")
    return FP8Weight(w, scale.float(), None if isinstance(per, str) else tuple(per), activation, input_scale)


def skipped(module: str, patterns: list[str]) -> bool:
    """Whether ``modules_to_not_convert`` keeps ``module`` in 16 bits: a pattern matching from the start
    up to a module boundary ("layers.1" takes "layers.1.mlp", not "layers.11"), as a regex, or a
    suffix ("mlp.gate" takes "model.layers.3.mlp.gate"), as transformers reads the list."""
    for p in patterns:
        try:
            if re.match(rf"(?:{p})(?:(?<=\.)|(?=\.|$))", module) or module.endswith(p):
                return True
        except re.error as exc:
            raise CheckpointError(f"{WHERE}.modules_to_not_convert: {p!r} is not a valid pattern ({exc}).") from None
    return False


class BlockFP8Format(QuantFormat):
    """``quant_method: "fp8"`` (see the module docstring)."""

    method = "fp8"

    def __init__(self, config: dict):
        super().__init__(config)
        fmt = config.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise CheckpointError(f"{WHERE}: fmt {fmt!r} is not read; this engine reads e4m3 FP8 weights only.")
        self.activation = str(config.get("activation_scheme", "dynamic")).lower()
        if self.activation not in ("dynamic", "static"):
            raise CheckpointError(f"{WHERE}: activation_scheme {self.activation!r} is neither 'dynamic' nor "
                                  "'static'. Fix config.json.")
        block = config.get("weight_block_size")
        if block is not None and (not isinstance(block, list | tuple) or len(block) != 2
                                  or not all(isinstance(b, int) and b > 0 for b in block)):
            raise CheckpointError(f"{WHERE}: weight_block_size {block!r} is not two positive integers [rows, "
                                  "columns] such as [128, 128]. Fix config.json.")
        self.block = None if block is None else (block[0], block[1])
        for key, allowed, what in (("scale_fmt", ("float", None), "power-of-two (UE8M0) activation scales"),
                                   ("expert_dtype", ("fp8", None), "FP4-packed experts")):
            if config.get(key) not in allowed:
                raise CheckpointError(f"{WHERE}: {key} {config[key]!r} asks for {what} (DeepSeek-V3.1/V4), which "
                                      "this engine does not emulate; use the model's bf16 release.")
        if config.get("modules_to_convert"):
            raise CheckpointError(f"{WHERE}: modules_to_convert ({config['modules_to_convert']}) quantizes "
                                  "embedding tables, which this engine does not read; use the model's bf16 release.")
        skip = config.get("modules_to_not_convert") or config.get("ignored_layers") or []
        if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
            raise CheckpointError(f"{WHERE}: modules_to_not_convert must be a list of module names.")
        self.skip = skip
        self.stored: dict[str, dict[str, str]] = {}     # weight -> {role: stored name}, for messages

    def groups(self, names: set[str]) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for name in sorted(names):
            suffix = next((s for s in SCALES if name.endswith(s)), None)
            weight = name[:-len(suffix)] if suffix else None
            if weight is None or weight not in names or (suffix == "_scale" and not weight.endswith(".weight")):
                continue                    # a layer's own "..._scale" parameter (a router's per_expert_scale)
            if weight in out:
                raise CheckpointError(f"{weight} has both a weight_scale and a weight_scale_inv; the checkpoint "
                                      "mixes two FP8 layouts. Re-download it.")
            linear = weight.endswith(".weight")     # else a stacked experts tensor, experts.gate_up_proj
            module = weight.removesuffix(".weight") if linear else weight.rpartition(".")[0]
            if skipped(module, self.skip):
                raise CheckpointError(f"{name}: {module} is in modules_to_not_convert (left in 16 bits), yet the "
                                      "checkpoint stores FP8 scales for it. config.json and the weights disagree: "
                                      "re-download the checkpoint.")
            roles = {"weight": weight, "scale": name}
            inputs = [f"{module}.{s}" if linear else f"{weight}_{s}" for s in INPUT_SCALES]
            found = next((n for n in inputs if n in names), None)
            if found is not None:
                roles["input_scale"] = found
            elif self.activation == "static":
                raise CheckpointError(f"{weight}: activation_scheme 'static' needs {inputs[0]} (or "
                                      f"{inputs[1]}), which the checkpoint lacks. Re-download it.")
            out[weight] = roles
        self.stored.update(out)
        return out

    def build(self, weight: str, tensors: dict[str, torch.Tensor]) -> FP8Weight | QuantizedExperts:
        w, scale, inp = tensors["weight"], tensors["scale"], tensors.get("input_scale")
        names = self.stored.get(weight, {})
        scale_name, inp_name = names.get("scale", f"{weight}_scale_inv"), names.get("input_scale", "input_scale")
        per = self.block or "tensor"
        act = "static" if self.activation == "static" else "group" if self.block else "token"
        inp = inp if act == "static" else None       # a dynamic checkpoint's calibration leftovers go unused
        if w.dim() != 3:
            return fp8_weight(weight, w, scale_name, scale, per, act, inp, inp_name)
        E = w.shape[0]                                                     # [E, N, K]: stacked experts
        if scale.dim() == 0 or scale.shape[0] != E or (inp is not None and inp.numel() not in (1, E)):
            raise CheckpointError(f"{scale_name}: shape {list(scale.shape)} does not give each of the {E} experts "
                                  f"of {weight} {list(w.shape)} its scales. Re-download the checkpoint.")
        if per == "tensor":
            scale = scale.reshape(E, -1)
        inp = None if inp is None else inp.reshape(-1).expand(E)
        return QuantizedExperts([fp8_weight(f"{weight}[{e}]", w[e], f"{scale_name}[{e}]", scale[e], per, act,
                                            None if inp is None else inp[e], f"{inp_name}[{e}]") for e in range(E)])
