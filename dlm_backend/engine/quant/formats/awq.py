"""AWQ checkpoints (AutoAWQ's GEMM layout, as transformers and vLLM read it): ``quant_method: "awq"``.

Each quantized linear ``<prefix>`` stores, for its ``[N, K]`` weight with 4-bit levels in groups of
``g`` input columns (``G = K / g``; ``group_size: -1`` is one group over K):

* ``<prefix>.qweight`` int32 ``[K, N / 8]``: levels packed along the OUTPUT dim, eight to a word in
  AWQ's interleaved order: nibble ``i`` (bits ``4i .. 4i+3``) of word ``c`` holds output column
  ``8c + [0, 2, 4, 6, 1, 3, 5, 7][i]`` (``WQLinear_GEMM.from_linear``'s ``order_map``), so output
  column ``8c + j`` sits in nibble ``[0, 4, 1, 5, 2, 6, 3, 7][j]``;
* ``<prefix>.qzeros`` int32 ``[G, N / 8]``: zero points, packed the same way;
* ``<prefix>.scales`` fp16 ``[G, N]``.

``W^T[k, n] = (q[k, n] - z[k // g, n]) * s[k // g, n]``, which is
:class:`~dlm_backend.engine.quant.int_weight.IntWeight` with ``offset = -z * s`` (exact in float32).
Only the GEMM version has this layout: GEMV packs along the input dim, Marlin and ExLlama repack for
their kernels, and the llm-awq backend interleaves for its own; those are refused by name.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.quant.formats import QuantFormat
from dlm_backend.engine.quant.formats.gptq import check_shape, quantized_groups, unpack_words
from dlm_backend.engine.quant.int_weight import IntWeight
from dlm_backend.errors import CheckpointError

#: nibble that holds output column j of each group of eight (the inverse of AutoAWQ's [0, 2, 4, 6, 1, 3, 5, 7])
NIBBLE_OF = (0, 4, 1, 5, 2, 6, 3, 7)
STORED = ("qweight", "qzeros", "scales")
GEMM = "qweight [K, N/8] and qzeros [K/g, N/8] packed along the output dim, scales [K/g, N]"


class AWQFormat(QuantFormat):
    """AutoAWQ GEMM, 4-bit with zero points (see the module docstring)."""

    method = "awq"

    def __init__(self, config: dict):
        super().__init__(config)
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise CheckpointError(f"AWQ version {version!r} lays the weights out for its own kernel; this engine "
                                  f"reads AutoAWQ's GEMM layout (version: gemm: {GEMM}). Use the model's AWQ GEMM "
                                  "release.")
        backend = str(config.get("backend", "autoawq")).lower()
        if backend != "autoawq":
            raise CheckpointError(f"AWQ backend {backend!r} packs its weights in another order than AutoAWQ's; this "
                                  "engine reads AutoAWQ GEMM checkpoints (backend: autoawq).")
        self.bits = int(config.get("bits", config.get("w_bit", 4)))
        if self.bits != 4:
            raise CheckpointError(f"AWQ {self.bits}-bit weights are not read by this engine; AutoAWQ's GEMM layout "
                                  "is 4-bit. Use the model's 4-bit AWQ release.")
        if not config.get("zero_point", True):
            raise CheckpointError("AWQ zero_point false (symmetric AWQ) is not the GEMM layout this engine reads "
                                  f"({GEMM}, with zero points). Use the model's AWQ GEMM release.")
        self.group_size = int(config.get("group_size", config.get("q_group_size", 128)))

    def groups(self, names: set[str]) -> dict[str, dict[str, str]]:
        return quantized_groups(names, "AWQ", STORED)

    def build(self, weight: str, tensors: dict[str, torch.Tensor]) -> IntWeight:
        qweight, qzeros, scales = (tensors[r] for r in STORED)
        if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
            raise CheckpointError(f"{weight}: AWQ qweight/qzeros are {qweight.dtype}/{qzeros.dtype}; the GEMM layout "
                                  "packs levels in int32 words. Re-download the checkpoint.")
        K, N = qweight.shape[0], scales.shape[1]
        group = K if self.group_size == -1 else self.group_size
        if K % group or N % 8:
            raise CheckpointError(f"{weight}: a [{N}, {K}] weight is not whole groups of {group} input columns and "
                                  "words of 8 output columns, as AWQ's GEMM layout stores it. Re-download the "
                                  "checkpoint.")
        G = K // group
        layout = f"AWQ GEMM 4-bit g{group} of a [{N}, {K}] weight"
        check_shape(weight, "qweight", qweight, (K, N // 8), layout)
        check_shape(weight, "qzeros", qzeros, (G, N // 8), layout)
        check_shape(weight, "scales", scales, (G, N), layout)
        # stored index of output column n: its word's first nibble, plus the nibble AWQ put it in
        index = (torch.arange(0, N, 8, device=qweight.device)[:, None]
                 + torch.tensor(NIBBLE_OF, device=qweight.device)).flatten()      # [N]
        q = unpack_words(qweight, 4)[:, index].t().contiguous()                 # [N, K]
        zeros = unpack_words(qzeros, 4)[:, index].float()                       # [G, N]
        s = scales.float()                                                       # [G, N]
        return IntWeight(q, s.t().contiguous(), (-zeros * s).t().contiguous(), 4)
