"""Building blocks shared by every model family."""

from dlm_backend.engine.layers.attention import AttentionContext, Segment, attention, attention_context
from dlm_backend.engine.layers.mlp import swiglu
from dlm_backend.engine.layers.norm import RMSNorm
from dlm_backend.engine.layers.rotary import RotaryTable, apply_rotary, rotate_qk

__all__ = [
    "AttentionContext", "Segment", "attention", "attention_context", "swiglu", "RMSNorm",
    "RotaryTable", "apply_rotary", "rotate_qk",
]
