"""FP8 (e4m3) weights with float32 scales, and the activation quantization their checkpoint declares.

Scales come per tensor (``[]``), per output channel (``[N, 1]``) or per block (``[ceil(N / bn),
ceil(K / bk)]``, ``weight_block_size``; the block-wise FP8 of DeepSeek-V3-era checkpoints stores the
scale's inverse name, ``weight_scale_inv``, but multiplies by it just the same).

The activations are part of the format: FP8-dynamic checkpoints quantize each token's activations
to e4m3 at run time (``token``), block-wise ones each token's groups of ``bk`` columns (``group``),
static ones by the checkpoint's ``input_scale`` (``static``). Applying that quantization is what
makes the outputs agree with the forward of the tool that wrote the checkpoint (llm-compressor,
the DeepSeek reference), not merely with the float model. On a GPU with FP8 tensor cores (compute
capability 8.9+: Ada, Hopper) per-tensor and per-channel weights run as ``torch._scaled_mm`` with
per-token scales; elsewhere (CPU, Ampere, block scales) the same quantize-dequantize is emulated:
the activations are rounded through e4m3 and the weight dequantized for a float matmul.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlm_backend.engine.quant.weight import QuantizedWeight, aligned
from dlm_backend.errors import CheckpointError

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max               # 448
ACTIVATIONS = ("none", "token", "group", "static")


def fake_quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` rounded through e4m3 at ``scale`` (broadcast), back in float32."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * scale


def dynamic_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-row (last dim) e4m3 scale ``amax / 448``, as llm-compressor's dynamic token scheme."""
    return (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)


class FP8Weight(QuantizedWeight):
    """An e4m3 ``[N, K]`` weight, its scales and its activation scheme (see the module docstring)."""

    def __init__(self, w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None,
                 activation: str = "token", input_scale: torch.Tensor | None = None):
        super().__init__()
        N, K = w.shape
        scale = scale.float().reshape(-1, 1) if scale.dim() < 2 and scale.numel() == N and N > 1 else scale.float()
        if block is not None:
            want = (-(-N // block[0]), -(-K // block[1]))
            if tuple(scale.shape) != want:
                raise CheckpointError(f"FP8 weight {[N, K]} with blocks {list(block)} needs scales {list(want)}, "
                                      f"found {list(scale.shape)}. Re-download the checkpoint.")
        elif scale.numel() not in (1, N):
            raise CheckpointError(f"FP8 weight {[N, K]}: {scale.numel()} scales are neither one per tensor nor one "
                                  "per output channel. Re-download the checkpoint.")
        if activation not in ACTIVATIONS or (activation == "static" and input_scale is None):
            raise CheckpointError(f"FP8 activation scheme {activation!r} is not one of {', '.join(ACTIVATIONS)} "
                                  "(a static one needs input_scale).")
        self.block, self.activation, self.exec = block, activation, "canonical"
        self.register_buffer("w", w if w.dtype == FP8 else w.to(FP8))
        self.register_buffer("scale", scale.reshape(()) if scale.numel() == 1 and block is None else scale)
        self.register_buffer("input_scale", None if input_scale is None else input_scale.float().reshape(()))
        how = f"block {block[0]}x{block[1]}" if block else "per-tensor" if self.scale.dim() == 0 else "per-channel"
        self.kind = f"fp8 {how}" + ("" if activation == "none" else f", {activation} activations")

    @property
    def shape(self) -> torch.Size:
        return self.w.shape

    def _weight_scale(self) -> torch.Tensor:
        """Scales broadcast to ``[N, K]`` (or a scalar / ``[N, 1]``)."""
        if self.block is None:
            return self.scale
        N, K = self.shape
        return self.scale.repeat_interleave(self.block[0], 0)[:N].repeat_interleave(self.block[1], 1)[:, :K]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.w.float() * self._weight_scale()).to(dtype)

    def rows(self, index: slice) -> FP8Weight:
        scale = self.scale
        if self.block is not None:
            scale = scale[aligned(index, self.shape[0], self.block[0], "FP8 scale block")]
        elif scale.dim() == 2:
            scale = scale[index]
        return FP8Weight(self.w[index], scale, self.block, self.activation, self.input_scale)

    def cols(self, index: slice) -> FP8Weight:
        scale = self.scale
        if self.block is not None:
            scale = scale[:, aligned(index, self.shape[1], self.block[1], "FP8 scale block")]
        return FP8Weight(self.w[:, index], scale, self.block, self.activation, self.input_scale)

    @classmethod
    def concat_rows(cls, parts: list[FP8Weight]) -> FP8Weight:
        first = parts[0]
        if first.block is None and first.scale.dim() == 0:          # per-tensor scales of fused parts differ
            w = torch.cat([p.w for p in parts])
            scale = torch.cat([p.scale.expand(p.shape[0]).reshape(-1, 1) for p in parts])
            return FP8Weight(w, scale, None, first.activation, first.input_scale)
        return FP8Weight(torch.cat([p.w for p in parts]), torch.cat([p.scale for p in parts]), first.block,
                         first.activation, first.input_scale)

    def prepare(self, device, dtype: torch.dtype) -> FP8Weight:
        device = torch.device(device)
        self.to(device)
        self.w = self.w.contiguous()                       # a column slice (tensor parallelism) is strided
        N, K = self.shape
        # Row-wise scaled _scaled_mm writes bf16 only ("Only bf16 high precision output types are
        # supported for row-wise scaling" before cuBLAS 12.9); fp16/fp32 activations are emulated.
        fast = (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9) and dtype == torch.bfloat16
                and self.block is None and self.activation in ("token", "static") and N % 16 == 0 and K % 16 == 0)
        self.exec = "scaled_mm" if fast else "emulate"
        return self

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """The activations as the checkpoint's scheme rounds them (float32)."""
        if self.activation == "none":
            return x.float()
        if self.activation == "static":
            return fake_quantize(x, self.input_scale)
        if self.activation == "token":
            return fake_quantize(x, dynamic_scale(x))
        g = self.block[1] if self.block else x.shape[-1]
        K = x.shape[-1]
        pad = -K % g
        h = F.pad(x.float(), (0, pad)).unflatten(-1, (-1, g))               # [.., K / g, g]
        return fake_quantize(h, dynamic_scale(h)).flatten(-2)[..., :K]

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        if self.exec == "scaled_mm":
            return self._scaled_mm(x)
        return F.linear(self.quantize_input(x).to(x.dtype), self.dequantize(x.dtype))

    def _scaled_mm(self, x: torch.Tensor) -> torch.Tensor:
        lead, K = x.shape[:-1], x.shape[-1]
        h = x.reshape(-1, K)
        M = h.shape[0]
        pad = -M % 16                                                       # the FP8 GEMM's row multiple
        h = F.pad(h, (0, 0, 0, pad))
        sa = self.input_scale.expand(h.shape[0], 1) if self.activation == "static" else dynamic_scale(h)
        hq = (h.float() / sa).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        sb = self.scale.float().reshape(1, -1).expand(1, self.shape[0]).contiguous()
        y = torch._scaled_mm(hq, self.w.t(), scale_a=sa.contiguous(), scale_b=sb, out_dtype=x.dtype)
        return y[:M].view(*lead, self.shape[0])
