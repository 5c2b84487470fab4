"""Pre-quantized checkpoint formats, by config.json's ``quantization_config.quant_method``.

A format groups a layer's stored tensors (GPTQ's ``qweight``/``qzeros``/``scales``/``g_idx``, an
FP8 ``weight`` and its ``weight_scale``) into one :class:`~dlm_backend.engine.quant.weight.QuantizedWeight`
standing under the layer's ``weight`` name, so the loader checks and places it like any tensor.
The table maps each method to its implementation, imported only when a checkpoint names it.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod

import torch

from dlm_backend.engine.quant.weight import QuantizedWeight
from dlm_backend.errors import CheckpointError

#: quant_method -> "module:class" of the formats this engine reads.
FORMATS = {
    "gptq": "dlm_backend.engine.quant.formats.gptq:GPTQFormat",
    "awq": "dlm_backend.engine.quant.formats.awq:AWQFormat",
    "compressed-tensors": "dlm_backend.engine.quant.formats.compressed_tensors:CompressedTensorsFormat",
    "fp8": "dlm_backend.engine.quant.formats.fp8_block:BlockFP8Format",
}
#: quant_method values published checkpoints carry that this engine does not read, and what they are.
UNREAD = {"bitsandbytes": "bitsandbytes 4/8-bit", "mlx": "MLX quantized weights", "modelopt": "ModelOpt FP8/NVFP4",
          "hqq": "HQQ weights", "eetq": "EETQ int8", "exl2": "ExLlamaV2 weights", "aqlm": "AQLM codebooks",
          "torchao": "torchao-serialized tensors", "bitnet": "BitNet ternary weights", "mxfp4": "MXFP4 weights"}


class QuantFormat(ABC):
    """How one quantized checkpoint format stores a layer's weight.

    Built from config.json's ``quantization_config`` (a setting the engine cannot honour is a
    CheckpointError naming it); :meth:`groups` says which stored tensors make up which weight,
    :meth:`build` makes the weight from them once all are read."""

    method: str

    def __init__(self, config: dict):
        self.config = config

    @abstractmethod
    def groups(self, names: set[str]) -> dict[str, dict[str, str]]:
        """``{"model.layers.0.mlp.up_proj.weight": {"qweight": "model.layers.0.mlp.up_proj.qweight", ...}}``
        for every quantized weight among the checkpoint's tensor ``names``; tensors in no group load as
        they are (norms, embeddings, the layers the checkpoint left in 16 bits)."""

    @abstractmethod
    def build(self, weight: str, tensors: dict[str, torch.Tensor]) -> QuantizedWeight:
        """The weight named ``weight`` from its stored tensors (by role, as :meth:`groups` named them),
        in canonical form; malformed tensors are a CheckpointError naming them."""


def checkpoint_format(config: dict, where: str = "config.json") -> QuantFormat | None:
    """The format of a checkpoint whose config.json is ``config`` (None: full precision)."""
    quant = config.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict) or not isinstance(quant.get("quant_method"), str):
        raise CheckpointError(f"{where}: quantization_config must be an object with a quant_method string "
                              "(as transformers writes it). Re-download the checkpoint.")
    method = quant["quant_method"].lower()
    if method not in FORMATS:
        what = UNREAD.get(method, "a quantization format")
        raise CheckpointError(f"{where}: the weights are quantized as {method!r} ({what}), which this engine does "
                              f"not read. It reads {', '.join(FORMATS)} checkpoints and GGUF files; use one of "
                              "those releases, or the model's bf16/fp16 one.")
    module, cls = FORMATS[method].split(":")
    return getattr(importlib.import_module(module), cls)(quant)
