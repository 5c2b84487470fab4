"""Building blocks shared by every model family."""

from dlm_backend.engine.layers.attention import (DecoderRows, ForwardContext, PackedAttention, Segment, attention,
                                                 forward_context, triton_enabled)
from dlm_backend.engine.layers.mlp import swiglu
from dlm_backend.engine.layers.norm import RMSNorm
from dlm_backend.engine.layers.rotary import RotaryTable, apply_rotary, rotate_qk

__all__ = [
    "DecoderRows", "ForwardContext", "PackedAttention", "Segment", "attention", "forward_context", "triton_enabled",
    "swiglu", "RMSNorm", "RotaryTable", "apply_rotary", "rotate_qk",
]
