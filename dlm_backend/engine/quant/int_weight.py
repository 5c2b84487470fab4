"""Integer weights with a float scale (and offset) per group of input columns: the one form every
integer format reaches (GPTQ, AWQ, GGUF's Q4_0/Q8_0/K-quants, on-the-fly int8/int4).

``W[n, k] = q[n, k] * scale[n, k // g] + offset[n, k // g]``, ``q`` unsigned levels ``0 .. 2^bits - 1``
(or signed int8 with no offset: symmetric int8). GPTQ's act-order (``desc_act``) stores columns in
its own order: ``perm[j]`` is the input column stored at ``j``, so groups stay contiguous and the
product reads ``x[:, perm]``.

``prepare`` picks the kernel, measured on CPU at [32, 2048] x [2048, 2048] (2 cores, AVX-512 BF16):
float32 ``F.linear`` 2.5 ms; PyTorch's packed kernels take bf16 activations (with float32 ones they
ran 45 ms and 98 ms):

* ``int4pack``: 4-bit levels, group 32/64/128/256, N % 16 == 0 -> ``_weight_int4pack_mm_for_cpu``
  (0.79 ms) or, on CUDA, tinygemm's ``_weight_int4pack_mm``. Its zero point is ``(q - 8) * s + z``,
  so ``z = offset + 8 * scale``: exact.
* ``int8pack``: symmetric per-channel int8, K % 16 == 0 (the kernel reads garbage at K = 40) ->
  ``_weight_int8pack_mm`` (0.77 ms); on CUDA ``(x @ q^T) * scale``.
* ``int4x2``: wider levels (group-wise int8 such as GGUF's Q8_0 and GPTQ 8-bit, 5-bit K-quants) in
  the int4 kernel's groups, as two 4-bit halves: two int4 products, exact.
* ``dense``: anything else (GGUF's Q6_K groups of 16, odd shapes): the weight rebuilt once at load
  in the activations' dtype (bf16 on CPU, whose bf16 matmul took 0.63 ms at that shape): a bf16
  weight's memory and speed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlm_backend.engine.quant.weight import QuantizedWeight, aligned, to_activation
from dlm_backend.errors import CheckpointError

INT4_GROUPS = (32, 64, 128, 256)        # the group sizes tinygemm's int4 kernels take


class IntWeight(QuantizedWeight):
    """Group-wise integer weight (see the module docstring for the formula and the kernels)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None, bits: int,
                 perm: torch.Tensor | None = None):
        super().__init__()
        N, K = q.shape
        G = scale.shape[1]
        if scale.shape[0] != N or K % G or (offset is not None and offset.shape != scale.shape):
            raise CheckpointError(f"quantized weight of shape {[N, K]} with scales {list(scale.shape)}: the "
                                  "scales do not divide the weight into whole groups. Re-download the checkpoint.")
        self.bits, self.group, self.exec = bits, K // G, "canonical"
        self.register_buffer("q", q)                                            # [N, K] uint8 / int8
        self.register_buffer("scale", scale.float())                            # [N, G]
        self.register_buffer("offset", None if offset is None else offset.float())
        self.register_buffer("perm", perm)                                      # [K] or None
        self._shape = torch.Size((N, K))
        self.kind = f"int{bits} g{self.group}" if G > 1 else f"int{bits} per-channel"

    @property
    def shape(self) -> torch.Size:
        return self._shape

    # --- canonical form ---------------------------------------------------------------------------
    def _stored(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in stored column order, ``[N, K]`` in ``dtype``."""
        N, K = self.shape
        G = K // self.group
        w = self.q.to(dtype).view(N, G, self.group) * self.scale.to(dtype)[..., None]
        if self.offset is not None:
            w = w + self.offset.to(dtype)[..., None]
        return w.view(N, K)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.exec != "canonical":
            raise TypeError("dequantize() reads the canonical form; call it before prepare()")
        w = self._stored(dtype)
        if self.perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.perm] = w
        return out

    def rows(self, index: slice) -> IntWeight:
        off = None if self.offset is None else self.offset[index]
        return IntWeight(self.q[index], self.scale[index], off, self.bits, self.perm)

    def cols(self, index: slice) -> IntWeight:
        if self.perm is not None:
            raise CheckpointError("An act-order GPTQ weight (desc_act) cannot be split by input columns between "
                                  "devices; run it with tensor_parallel_size=1.")
        # One group over every column (per-channel scales) keeps its scale whatever the split.
        groups = slice(None) if self.group == self.shape[1] else aligned(index, self.shape[1], self.group,
                                                                          "quantization group")
        off = None if self.offset is None else self.offset[:, groups]
        return IntWeight(self.q[:, index], self.scale[:, groups], off, self.bits)

    @classmethod
    def concat_rows(cls, parts: list[IntWeight]) -> IntWeight:
        first = parts[0]
        off = None if first.offset is None else torch.cat([p.offset for p in parts])
        return IntWeight(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]), off, first.bits,
                         first.perm)

    # --- execution --------------------------------------------------------------------------------
    def prepare(self, device, dtype: torch.dtype) -> IntWeight:
        device = torch.device(device)
        self.to(device)
        for name, t in list(self._buffers.items()):       # a column slice (tensor parallelism) is strided
            if t is not None:
                self._buffers[name] = t.contiguous()
        N, K = self.shape
        signed = self.q.dtype == torch.int8
        act = torch.bfloat16 if device.type == "cpu" else dtype
        int4_shape = self.group in INT4_GROUPS and N % 16 == 0 and act == torch.bfloat16
        offset = self.offset if self.offset is not None else torch.zeros_like(self.scale)
        if self.bits <= 4 and not signed and int4_shape:
            self.q, self.scale = _int4(self.q.to(torch.int32), self.scale, offset, device)
            self.offset, self.exec = None, "int4pack"
        elif self.bits == 8 and signed and self.group == K and self.offset is None and K % 16 == 0:
            self.scale = self.scale[:, 0].to(act).contiguous()                  # [N], the kernel's dtype
            self.exec = "int8pack"
        elif self.bits <= 8 and int4_shape:
            # Wider levels as two 4-bit halves, u = 16 hi + lo: W = lo s + 16 s (hi - h0) + (16 s h0 + o), two
            # int4 products and exact. h0, the middle of hi's range, keeps the kernel's zero points (kept in
            # bf16) small: for symmetric int8 they are 8 s and 0, where folding the offset into the low half
            # made one -120 s and cost 9% of the logits. Group-wise int8 (GGUF's Q8_0, GPTQ 8-bit) and 5-bit
            # K-quants then run at about twice the int4 kernel's cost (1.6 ms at [32, 2048] x [2048, 2048])
            # where rebuilding the weight for each product cost about 8 ms; memory stays a byte a weight.
            u = self.q.to(torch.int32) + (128 if signed else 0)                 # signed int8 -> 0 .. 255
            scale, offset = self.scale, offset - 128 * self.scale if signed else offset
            h0 = 1 << (self.bits - 5)                                           # hi runs 0 .. 2^(bits-4) - 1
            self.register_buffer("q_hi", None)
            self.register_buffer("scale_hi", None)
            self.q_hi, self.scale_hi = _int4((u >> 4) + 8 - h0, 16 * scale, 16 * h0 * scale + offset - 128 * scale,
                                             device)
            self.q, self.scale = _int4(u & 15, scale, torch.zeros_like(offset), device)
            self.offset, self.exec = None, "int4x2"
        else:
            # No kernel takes these groups (GGUF's Q6_K has 16 columns a scale) or shapes: the weight is
            # rebuilt once, in the kernels' activation dtype. Rebuilding it for each product instead
            # kept its memory but took 43% of a Q4_K_M pass for the 8 of 56 weights Q4_K_M keeps at Q6_K.
            self.register_buffer("dense", self._stored(act).contiguous())       # [N, K], stored column order
            self.q = self.scale = self.offset = None
            self.exec = "dense"
        self.act_dtype = act
        return self

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        if self.exec in ("int4pack", "int4x2"):
            h = to_activation(x, self.act_dtype)
            y = _int4_mm(h, self.q, self.group, self.scale)
            if self.exec == "int4x2":
                y = y.float() + _int4_mm(h, self.q_hi, self.group, self.scale_hi).float()
        elif self.exec == "int8pack" and x.device.type == "cpu":
            y = torch._weight_int8pack_mm(to_activation(x, self.act_dtype), self.q, self.scale)
        elif self.exec == "int8pack":
            y = F.linear(x.reshape(-1, x.shape[-1]), self.q.to(x.dtype)) * self.scale.to(x.dtype)
        else:
            y = F.linear(to_activation(x, self.act_dtype), self.dense)
        return y.to(x.dtype).view(*lead, self.shape[0])


def _int4(levels: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, device: torch.device):
    """(packed weight, scales and zeros ``[G, N, 2]``) of ``W = levels * scale + offset`` (levels 0 .. 15,
    int32 ``[N, K]``) for tinygemm's int4 kernel, whose dequantization is ``(q - 8) * s + z``."""
    zeros = offset + 8 * scale
    sz = torch.stack([scale, zeros], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)    # [G, N, 2]
    if device.type == "cpu":
        return torch._convert_weight_to_int4pack_for_cpu(levels, 1), sz
    u8 = ((levels[:, ::2] << 4) | levels[:, 1::2]).to(torch.uint8)                            # [N, K / 2]
    inner = next(t for t in (8, 4, 2) if (levels.shape[1] // 16) % t == 0)
    return torch._convert_weight_to_int4pack(u8, inner), sz


def _int4_mm(h: torch.Tensor, packed: torch.Tensor, group: int, sz: torch.Tensor) -> torch.Tensor:
    if h.is_cuda:
        return torch._weight_int4pack_mm(h, packed, group, sz)
    return torch._weight_int4pack_mm_for_cpu(h, packed, group, sz)
