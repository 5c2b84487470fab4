"""GPTQ checkpoints (AutoGPTQ, GPTQModel, transformers/optimum): ``quant_method: "gptq"``.

Each quantized linear ``<prefix>`` stores, for its ``[N, K]`` weight with ``bits``-bit levels in
groups of ``g`` input columns (``G = K / g`` groups; ``group_size: -1`` is one group over K):

* ``<prefix>.qweight`` int32 ``[K * bits / 32, N]``: levels packed along the input dim, word ``r``
  holding input rows ``r * 32 / bits ..`` lowest bits first (``QuantLinear.pack``);
* ``<prefix>.qzeros`` int32 ``[G, N * bits / 32]``: zero points packed the same way along the output dim;
* ``<prefix>.scales`` fp16 ``[G, N]``;
* ``<prefix>.g_idx`` int32 ``[K]`` (optional): the group of each input column; with act-order
  (``desc_act``) GPTQ quantized the columns in its own order, so groups are scattered over K.

``W^T[k, n] = scales[g_idx[k], n] * (q[k, n] - (z[g_idx[k], n] + 1))``: the v1 layout stores each
zero minus one (``checkpoint_format: "gptq"``, the default); GPTQModel's ``gptq_v2`` stores it as is.
That maps exactly onto :class:`~dlm_backend.engine.quant.int_weight.IntWeight` (``offset = -z * s``;
levels, zeros <= 256 and fp16 scales multiply exactly in float32). Scattered groups become a ``perm``:
the columns sorted by group, so each group is contiguous again.
"""

from __future__ import annotations

import re

import torch

from dlm_backend.engine.quant.formats import QuantFormat
from dlm_backend.engine.quant.int_weight import IntWeight
from dlm_backend.errors import CheckpointError

BITS = (4, 8)                       # 8 or 4 levels to an int32 word; 2-bit and 3-bit GPTQ are not read
LAYOUTS = {"gptq": 1, "gptq_v2": 0}  # checkpoint_format -> what the stored zeros lack
STORED = ("qweight", "qzeros", "scales")


def unpack_words(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words ``[.., W]`` -> uint8 levels ``[.., W * 32 / bits]``, each word's lowest bits first."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
    levels = (words.to(torch.int32)[..., None] >> shifts) & (2**bits - 1)     # arithmetic shift, then masked
    return levels.flatten(-2).to(torch.uint8)


def quantized_groups(names: set[str], method: str, needed: tuple[str, ...],
                     optional: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """``<prefix>.weight`` -> its stored tensors by role, for each prefix holding a ``qweight`` or a
    ``qzeros``; a CheckpointError listing every one of ``needed`` that a quantized weight lacks."""
    prefixes = {n.rsplit(".", 1)[0] for n in names if n.endswith((".qweight", ".qzeros"))}
    groups, missing = {}, []
    for prefix in sorted(prefixes):
        roles = {r: f"{prefix}.{r}" for r in (*needed, *optional) if f"{prefix}.{r}" in names}
        missing += [f"{prefix}.{r}" for r in needed if r not in roles]
        groups[f"{prefix}.weight"] = roles
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise CheckpointError(f"{method} checkpoint is missing tensors of its quantized weights: {shown} "
                              f"(each quantized layer stores {', '.join(needed)}). The checkpoint is incomplete: "
                              "re-download it.")
    return groups


def check_shape(weight: str, role: str, tensor: torch.Tensor, want: tuple[int, ...], layout: str) -> None:
    if tuple(tensor.shape) != want:
        raise CheckpointError(f"{weight}: {role} has shape {list(tensor.shape)} where {layout} needs {list(want)}. "
                              "The config.json and weights disagree: re-download the checkpoint.")


class GPTQFormat(QuantFormat):
    """GPTQ v1 / v2 at 4 or 8 bits, with or without act-order (see the module docstring)."""

    method = "gptq"

    def __init__(self, config: dict):
        super().__init__(config)
        self.bits = _bits(config.get("bits", 4), "config.json")
        self.group_size = int(config.get("group_size", 128))
        self.desc_act = bool(config.get("desc_act", False))
        fmt = "marlin" if config.get("is_marlin_format") else str(config.get("checkpoint_format", "gptq")).lower()
        if fmt not in LAYOUTS:
            raise CheckpointError(f"GPTQ checkpoint_format {fmt!r} lays the weights out for its own kernel; this "
                                  "engine reads the gptq and gptq_v2 layouts (qweight, qzeros, scales). Use the "
                                  "model's plain GPTQ release.")
        self.zero_shift = LAYOUTS[fmt]
        pack = str(config.get("pack_dtype", "int32")).removeprefix("torch.")
        if pack != "int32":
            raise CheckpointError(f"GPTQ pack_dtype {pack!r}: this engine reads levels packed in int32 words (the "
                                  "AutoGPTQ / GPTQModel default). Use a release packed in int32.")
        # GPTQModel's per-module overrides: {"+:regex" or "regex": {"bits": 8, ...}, "-:regex": {} (left in float)}
        self.dynamic = []
        for pattern, override in (config.get("dynamic") or {}).items():
            try:
                regex = re.compile(pattern.removeprefix("+:").removeprefix("-:"))
            except re.error as exc:
                raise CheckpointError(f"GPTQ dynamic pattern {pattern!r} is not a regular expression ({exc}); fix "
                                      "quantization_config.dynamic in config.json.") from None
            if isinstance(override, dict) and "bits" in override and not pattern.startswith("-:"):
                _bits(override["bits"], f"dynamic[{pattern!r}]")       # refused at once, not at the layer
            self.dynamic.append((pattern, regex, override))

    def _settings(self, prefix: str) -> tuple[int, int]:
        """(bits, group_size) of the layer ``prefix``: the first ``dynamic`` pattern it matches, else the config's."""
        for pattern, regex, override in self.dynamic:
            if regex.match(prefix):
                if pattern.startswith("-:") or not isinstance(override, dict):
                    break
                return (_bits(override.get("bits", self.bits), f"dynamic[{pattern!r}]"),
                        int(override.get("group_size", self.group_size)))
        return self.bits, self.group_size

    def groups(self, names: set[str]) -> dict[str, dict[str, str]]:
        return quantized_groups(names, "GPTQ", STORED, optional=("g_idx",))

    def build(self, weight: str, tensors: dict[str, torch.Tensor]) -> IntWeight:
        prefix = weight.removesuffix(".weight")
        bits, group = self._settings(prefix)
        qweight, qzeros, scales = (tensors[r] for r in STORED)
        if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
            raise CheckpointError(f"{weight}: GPTQ qweight/qzeros are {qweight.dtype}/{qzeros.dtype}; the layout "
                                  "packs levels in int32 words. Re-download the checkpoint.")
        per = 32 // bits                                    # levels per word: 8 at 4 bits, 4 at 8 bits
        N, K = scales.shape[1], qweight.shape[0] * per
        group = K if group == -1 else group
        if K % group:
            raise CheckpointError(f"{weight}: {K} input columns are not whole groups of {group}; this engine reads "
                                  "GPTQ weights whose group_size divides K.")
        G = K // group
        if N % per:
            raise CheckpointError(f"{weight}: {N} output columns do not fill whole int32 words of qzeros "
                                  f"({per} per word). Re-download the checkpoint.")
        layout = f"GPTQ {bits}-bit g{group} of a [{N}, {K}] weight"
        check_shape(weight, "qweight", qweight, (K // per, N), layout)
        check_shape(weight, "qzeros", qzeros, (G, N // per), layout)
        check_shape(weight, "scales", scales, (G, N), layout)
        q = unpack_words(qweight.t(), bits)                                      # [N, K]
        zeros = unpack_words(qzeros, bits).float() + self.zero_shift             # [G, N]
        s = scales.float()                                                       # [G, N]
        offset = (-zeros * s).t().contiguous()                                   # [N, G]
        perm = self._perm(weight, tensors.get("g_idx"), K, G, group)
        if perm is not None:
            q = q[:, perm]                                  # stored column j is input column perm[j]
        return IntWeight(q.contiguous(), s.t().contiguous(), offset, bits, perm)

    def _perm(self, weight: str, g_idx: torch.Tensor | None, K: int, G: int, group: int) -> torch.Tensor | None:
        """The input columns sorted by group (stable), or None when ``g_idx`` is the plain ``k // group``."""
        if g_idx is None:
            if self.desc_act and G > 1:
                raise CheckpointError(f"{weight}: desc_act is set but the checkpoint has no g_idx, the group of "
                                      "each input column. Re-download the checkpoint.")
            return None
        g_idx = g_idx.long()
        if tuple(g_idx.shape) != (K,):
            raise CheckpointError(f"{weight}: g_idx has shape {list(g_idx.shape)}; one group index per input "
                                  f"column needs [{K}]. Re-download the checkpoint.")
        if torch.equal(g_idx, torch.arange(K, device=g_idx.device) // group):
            return None
        if g_idx.min() < 0 or g_idx.max() >= G or (torch.bincount(g_idx, minlength=G) != group).any():
            raise CheckpointError(f"{weight}: g_idx does not put exactly {group} input columns in each of its {G} "
                                  "groups, as GPTQ's act-order writes it. Re-download the checkpoint.")
        return torch.argsort(g_idx, stable=True)


def _bits(value, where: str) -> int:
    bits = int(value)
    if bits not in BITS:
        raise CheckpointError(f"{where}: GPTQ {bits}-bit weights are not read by this engine; it reads 4-bit and "
                              "8-bit GPTQ (8 or 4 levels to an int32 word). Use the model's 4-bit or 8-bit GPTQ "
                              "release.")
    return bits
