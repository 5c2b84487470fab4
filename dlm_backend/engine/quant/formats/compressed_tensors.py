"""compressed-tensors checkpoints (``quant_method: "compressed-tensors"``), as llm-compressor writes
them: RedHatAI's ``*-FP8-dynamic`` and ``*-FP8-block`` releases, and unpacked int8 weights.

``quantization_config.config_groups`` holds schemes: ``weights`` and ``input_activations`` for the
modules its ``targets`` select (a class name, ``"Linear"``; a module name; ``"re:<regex>"`` matched
from the start of the name), and ``ignore`` lists the modules left in 16 bits in the same syntax.
A module several targets select takes the first of: exact names, regexes (each in sorted order),
class names, as compressed_tensors' ``apply_quantization_config``; the engine sees tensor names, not
module classes, so a class target takes every layer that stores scales (in published configs it is
``"Linear"``, the only class with a ``weight_scale``). Each quantized linear ``<prefix>``
stores ``<prefix>.weight`` with ``<prefix>.weight_scale`` (and ``weight_zero_point`` when
asymmetric, ``input_scale`` for static activations); ``W = weight * weight_scale``, ``(q - zero_point)
* scale`` for integers (compressed_tensors.quantization.lifecycle.forward). Scales are ``[1]`` per
tensor, ``[N, 1]`` per channel, ``[N, ceil(K / g)]`` per group, ``[ceil(N / bn), ceil(K / bk)]`` per block.

Read: ``float-quantized`` (e4m3 weights), ``int-quantized`` and ``naive-quantized`` (the same two
tensors, by the same compressor). FP8 activations are quantized as the checkpoint says: dynamic
``token`` (each token's ``amax / 448``, FP8-dynamic), dynamic ``group`` (per token and ``bk``
columns, FP8-block), static ``tensor`` (``input_scale``). Integer weights run weight-only
(W8A16) as :class:`~dlm_backend.engine.quant.int_weight.IntWeight`; int8 activations (W8A8) are not
emulated and are refused, as are the packed 4-bit and FP4 formats.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import torch

from dlm_backend.engine.quant.formats import QuantFormat
from dlm_backend.engine.quant.formats.fp8_block import fp8_weight
from dlm_backend.engine.quant.int_weight import IntWeight
from dlm_backend.engine.quant.weight import QuantizedWeight
from dlm_backend.errors import CheckpointError

WHERE = "config.json quantization_config"
READ = ("float-quantized", "int-quantized", "naive-quantized")
#: formats llm-compressor writes that this engine does not read, and what their tensors are
UNREAD = {"pack-quantized": "4/8-bit integers packed into int32 weight_packed",
          "nvfp4-pack-quantized": "NVFP4 weights packed with a global scale",
          "mxfp4-pack-quantized": "MXFP4 weights", "mxfp6-pack-quantized": "MXFP6 weights",
          "mxfp8-quantized": "MXFP8 weights with e8m0 group scales", "marlin-24": "2:4-sparse Marlin weights",
          "sparse-24-bitmask": "2:4-sparse weights", "sparse-bitmask": "sparse weights",
          "dense": "unquantized weights", "fakequant": "weights kept in float beside their scales"}
_BAD = "The file does not match its quantization_config: re-download the checkpoint."


class Scheme(NamedTuple):
    """One config group as the engine runs it."""

    group: str
    type: str                           # "float" (e4m3) or "int" (int8)
    per: object                         # "tensor", "channel", ("group", g) or a block (bn, bk)
    symmetric: bool
    activation: str                     # FP8Weight's: "none", "token", "group" or "static"


def _strategy(args: dict) -> str:
    """compressed-tensors' strategy, inferred from group_size when absent (QuantizationArgs)."""
    if args.get("strategy"):
        return str(args["strategy"]).lower()
    g = args.get("group_size")
    return "tensor" if g is None else "channel" if g == -1 else "group"


def _refuse(group: str, what: str) -> CheckpointError:
    return CheckpointError(f"{WHERE}.config_groups.{group}: {what}; this engine does not run that. It reads FP8 "
                           "weights (per tensor, channel, group or block) with dynamic per-token or per-group, or "
                           "static per-tensor FP8 activations, and weight-only int8; use such a release or the "
                           "model's bf16 one.")


def parse_scheme(group: str, g: dict, fmt: str) -> Scheme:
    """The scheme of config group ``group`` (a CheckpointError for one the engine cannot honour)."""
    if fmt not in READ:
        raise CheckpointError(f"{WHERE}: compressed-tensors format {fmt!r} ({UNREAD.get(fmt, 'unknown')}) is not "
                              f"read by this engine; it reads {', '.join(READ)} (FP8 and 8-bit integer weights). "
                              "Use the model's FP8-dynamic, W8A16 or bf16 release.")
    if g.get("output_activations"):
        raise _refuse(group, "output_activations quantizes layer outputs")
    if not isinstance(g.get("weights"), dict):
        raise _refuse(group, "it quantizes activations only, not weights")
    typ, per, symmetric = _weights(group, g["weights"])
    return Scheme(group, typ, per, symmetric, _activations(group, g.get("input_activations"), typ, per))


def _weights(group: str, w: dict) -> tuple[str, object, bool]:
    """(type, scale layout, symmetric) of a group's weights."""
    typ, bits, strategy = str(w.get("type", "int")).lower(), w.get("num_bits", 8), _strategy(w)
    symmetric = bool(w.get("symmetric", True))
    if bits != 8 or typ not in ("float", "int"):
        raise _refuse(group, f"its weights are {bits}-bit {typ}")
    if w.get("dynamic"):
        raise _refuse(group, "its weight scales are computed at run time (dynamic)")
    if typ == "float" and not symmetric:
        raise _refuse(group, "its FP8 weights are asymmetric")
    sizes = {"block": w.get("block_structure") or [None], "group": [w.get("group_size")]}.get(strategy, [])
    if not all(isinstance(n, int) and n > 0 for n in sizes) or strategy == "block" and (typ == "int" or len(sizes) != 2):
        raise _refuse(group, f"{typ} weights in {strategy}s of {sizes}")
    if strategy == "block":
        return typ, (sizes[0], sizes[1]), symmetric
    if strategy == "group":
        return typ, ("group", sizes[0]), symmetric
    if strategy not in ("tensor", "channel"):
        raise _refuse(group, f"weight strategy {strategy!r}")
    return typ, strategy, symmetric


def _activations(group: str, a: dict | None, typ: str, per) -> str:
    """FP8Weight's activation scheme for a group's ``input_activations`` (None: weight-only)."""
    if a is None:
        return "none"
    if typ == "int":
        raise _refuse(group, "its activations are int8 (W8A8-INT8), quantized at run time")
    act, dynamic = _strategy(a), a.get("dynamic")
    if str(a.get("type", "int")).lower() != "float" or a.get("num_bits", 8) != 8 or not a.get("symmetric", True):
        raise _refuse(group, "its activations are not symmetric 8-bit float")
    if dynamic is False and act == "tensor":
        return "static"
    if dynamic is not True or act not in ("token", "group"):
        raise _refuse(group, f"{'dynamic' if dynamic else 'static'} {act} activations")
    if act == "group" and (isinstance(per, str) or per[1] != a.get("group_size")):
        raise _refuse(group, f"activation groups of {a.get('group_size')} columns over {per} weight scales (the "
                             "engine takes them as wide as the weight's scale blocks)")
    return act


def matches(name: str, pattern: str) -> bool:
    """compressed-tensors' name match: ``re:`` patterns from the start of the name, others exactly."""
    if not pattern.startswith("re:"):
        return pattern == name
    try:
        return re.match(pattern[3:], name) is not None
    except re.error as exc:
        raise CheckpointError(f"{WHERE}: {pattern!r} is not a valid regex ({exc}).") from None


def is_class(target: str) -> bool:
    """A target naming a module class ("Linear"), which every quantized linear layer is."""
    return not target.startswith("re:") and "." not in target and target[:1].isupper()


class CompressedTensorsFormat(QuantFormat):
    """``quant_method: "compressed-tensors"`` (see the module docstring)."""

    method = "compressed-tensors"

    def __init__(self, config: dict):
        super().__init__(config)
        for key, what in (("kv_cache_scheme", "an FP8 KV cache (k_scale / v_scale)"),
                          ("transform_config", "rotated weights (SpinQuant / QuIP transforms)")):
            if config.get(key):
                raise CheckpointError(f"{WHERE}: {key} asks for {what}, which this engine does not apply; use a "
                                      "release without it, or the model's bf16 one.")
        sparsity = config.get("sparsity_config") or {}
        if sparsity.get("format") not in (None, "dense"):
            raise CheckpointError(f"{WHERE}: sparsity_config format {sparsity['format']!r} stores sparse weights, "
                                  "which this engine does not read; use the model's dense release.")
        groups, fmt = config.get("config_groups"), config.get("format", "float-quantized")
        if not isinstance(groups, dict) or not groups:
            raise CheckpointError(f"{WHERE}: config_groups is missing or empty; re-download the checkpoint.")
        self.ignore = list(config.get("ignore") or [])
        self.targets: dict[str, Scheme] = {}            # target -> scheme; a later group's takes a target over
        for name, g in groups.items():
            own = g.get("format") if fmt == "mixed-precision" else fmt
            scheme = parse_scheme(name, g, own or "float-quantized")
            for t in g.get("targets") or []:
                self.targets[t] = scheme
        self.schemes: dict[str, Scheme] = {}

    def scheme_for(self, module: str) -> Scheme | None:
        names = sorted((t for t in self.targets if not is_class(t)), key=lambda t: (t.startswith("re:"), t))
        hit = next((t for t in names if matches(module, t)), None)
        hit = hit or next((t for t in self.targets if is_class(t)), None)
        return None if hit is None else self.targets[hit]

    def groups(self, names: set[str]) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for name in sorted(n for n in names if n.endswith(".weight_scale")):
            prefix = name.removesuffix(".weight_scale")
            weight = f"{prefix}.weight"
            if weight not in names:
                raise CheckpointError(f"{name} has no {weight} beside it. {_BAD}")
            if any(matches(prefix, p) for p in self.ignore):
                raise CheckpointError(f"{name}: {prefix} is in quantization_config.ignore (left in 16 bits), yet the "
                                      f"checkpoint stores its scales. {_BAD}")
            scheme = self.scheme_for(prefix)
            if scheme is None:
                raise CheckpointError(f"{name}: no config_groups target selects {prefix}. {_BAD}")
            roles = {"weight": weight, "weight_scale": name}
            for role in ("weight_zero_point", "input_scale"):
                if f"{prefix}.{role}" in names:
                    roles[role] = f"{prefix}.{role}"
            need = [r for r, needed in (("weight_zero_point", not scheme.symmetric),
                                        ("input_scale", scheme.activation == "static")) if needed and r not in roles]
            if need:
                raise CheckpointError(f"{prefix}: config group {scheme.group} needs {prefix}.{need[0]}, which the "
                                      f"checkpoint lacks. {_BAD}")
            out[weight] = roles
            self.schemes[weight] = scheme
        return out

    def build(self, weight: str, tensors: dict[str, torch.Tensor]) -> QuantizedWeight:
        scheme = self.schemes.get(weight) or self.scheme_for(weight.removesuffix(".weight"))
        prefix = weight.removesuffix(".weight")
        w, scale = tensors["weight"], tensors["weight_scale"]
        if scheme.type == "int":
            return self._int(prefix, scheme, w, scale, tensors.get("weight_zero_point"))
        g = _group(scheme.per)
        per = scheme.per if g is None else (1, g)                      # a group: a block one row high
        inp = tensors.get("input_scale") if scheme.activation == "static" else None
        return fp8_weight(weight, w, f"{prefix}.weight_scale", scale, per, scheme.activation, inp,
                          f"{prefix}.input_scale")

    @staticmethod
    def _int(prefix: str, scheme: Scheme, q: torch.Tensor, scale: torch.Tensor,
             zero: torch.Tensor | None) -> IntWeight:
        """Integer weights: ``W = (q - zero_point) * scale``, as IntWeight's ``q * scale + offset``."""
        if q.dtype != torch.int8 or q.dim() != 2:
            raise CheckpointError(f"{prefix}.weight: int-quantized weights are 2-D int8, found {q.dtype} "
                                  f"{list(q.shape)}. {_BAD}")
        N, K = q.shape
        g = _group(scheme.per)
        G = 1 if g is None else K // g                                   # scales per row
        if scheme.per == "tensor":
            ok, want = scale.numel() == 1, [1]
        elif scheme.per == "channel":
            ok, want = tuple(scale.shape) in ((N, 1), (N,)), [N, 1]
        else:
            ok, want = K % g == 0 and tuple(scale.shape) == (N, G), [N, G]
        if not ok:
            raise CheckpointError(f"{prefix}.weight_scale: shape {list(scale.shape)} does not fit the "
                                  f"{scheme.per} scales of {prefix}.weight {[N, K]}; it needs {want}. {_BAD}")
        offset = None
        if not scheme.symmetric:
            if zero is None or zero.numel() != scale.numel():
                raise CheckpointError(f"{prefix}.weight_zero_point: missing or not one per weight scale. {_BAD}")
            offset = -zero.float().reshape(-1, G).expand(N, G) * scale.float().reshape(-1, G)     # [N, G]
        return IntWeight(q, scale.float().reshape(-1, G).expand(N, G).contiguous(), offset, 8)


def _group(per) -> int | None:
    """The group width of a ("group", g) scheme, else None."""
    return per[1] if isinstance(per, tuple) and per[0] == "group" else None
