"""Reading a checkpoint's config.json with types and ranges checked before anything is built.

A config.json is input like any other: ``num_hidden_layers: 10000000`` built layers for hours,
``max_position_embeddings: 3e8`` asked for 38 GB, ``hidden_size: "256"`` or ``-256``, heads 0,
``rope_scaling: "linear"`` or ``eos_token_id: "0"`` raised raw TypeErrors deep inside torch, and
``rope_theta: 0`` (or ``1e-300``) loaded and then failed every request with NaN logits. Each family
reads its fields through a :class:`ConfigReader`, and each bad field is a CheckpointError naming it
and its rule; the float fields also keep to :data:`FLOAT_RANGES`, whatever range a family asks.
"""

from __future__ import annotations

import math

from dlm_backend.errors import CheckpointError

MAX_LAYERS = 1024
MAX_WIDTH = 1 << 17             # hidden sizes, head dims, MLP widths
MAX_HEADS = 1024
MAX_VOCAB = 1 << 22
MAX_POSITIONS = 1 << 19         # 512K: the rotary table holds every position (512 MB at head_dim 128)
_MISSING = object()
#: name -> (low, high, low excluded): ranges that give a finite, meaningful model.
FLOAT_RANGES = {
    # RoPE turns pair i by position * theta^(-2i/d) in float32: a base of 1 or less turns every pair at
    # least once per token (1e-30 turned by 1e29 rad: noise), and 1e-300 is 0 there, so the table was
    # inf and every logit NaN, in float32 too. Real bases are 1e4 to 1e8.
    "rope_theta": (1.0, 1e12, True),
    # RMSNorm divides by sqrt(mean(x^2) + eps) in float32: an eps under 1e-12 (1e-300 is 0 there) is
    # inf on an all-zero row, such as a zeroed pad embedding. Real ones: 1e-5, 1e-6 (BERT's 1e-12).
    "rms_norm_eps": (1e-12, 1.0, False),
    # The fraction of each head that rotates: int(head_dim * factor) dims, at least 2 (checked there).
    "partial_rotary_factor": (0.0, 1.0, True),
    # Scales the routed experts' sum: 1e-300 silenced them and 1e4 overflows float16 (65,504) at an
    # expert output of 7. Real ones: 1.0 (most), 2.5 (DeepSeek-V3, Ling), 2.83 (Kimi K2), 16 (DeepSeek-V2).
    "routed_scaling_factor": (0.01, 100.0, False),
}


class ConfigReader:
    """Typed, ranged getters over one config.json (``where`` names it in errors)."""

    def __init__(self, config: dict, where: str = "config.json"):
        self.config, self.where = config, where

    def _error(self, name: str, rule: str, value) -> CheckpointError:
        return CheckpointError(f"{self.where}: {name} must be {rule}, got {value!r:.60}. Fix the file or "
                               "re-download the checkpoint.")

    def int(self, *names: str, default=_MISSING, low: int = 1, high: int = MAX_WIDTH) -> int:
        """The first of ``names`` present (aliases: ``"n_layers", "num_hidden_layers"``), or ``default``."""
        name, value = self._first(names, default)
        if value is None and default is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise self._error(name, f"an integer in [{low}, {high}]", value)
        return value

    def float(self, name: str, default=_MISSING, low: float = 0.0, high: float = 1e12, low_open: bool = True) -> float:
        """``name`` as a number in ``(low, high]`` (``[low, high]`` if not ``low_open``), narrowed to
        its :data:`FLOAT_RANGES` entry."""
        if name in FLOAT_RANGES:
            f_low, f_high, f_open = FLOAT_RANGES[name]
            if f_low > low or (f_low == low and f_open):
                low, low_open = f_low, f_open
            high = min(high, f_high)
        _, value = self._first((name,), default)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
            value > low if low_open else value >= low) and value <= high
        if not ok:
            raise self._error(name, f"a number in {'(' if low_open else '['}{low:g}, {high:g}]", value)
        return float(value)

    def bool(self, name: str, default: bool = False) -> bool:
        _, value = self._first((name,), default)
        if not isinstance(value, bool):
            raise self._error(name, "true or false", value)
        return value

    def token_ids(self, name: str, vocab: int) -> tuple[int, ...]:
        """A token id entry (an int, a list of ints or null) as a tuple, each inside the vocabulary."""
        value = self.config.get(name)
        ids = [] if value is None else (value if isinstance(value, list) else [value])
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids):
            raise self._error(name, f"a token id in [0, {vocab}) or a list of them", value)
        return tuple(ids)

    def token_id(self, name: str, vocab: int) -> int | None:
        ids = self.token_ids(name, vocab)
        return ids[0] if ids else None

    def rope_scaling(self) -> None:
        """Plain RoPE only: a ``rope_scaling`` other than null or the default type is refused."""
        scaling = self.config.get("rope_scaling")
        if scaling is None:
            return
        if not isinstance(scaling, dict):
            raise self._error("rope_scaling", "null or an object", scaling)
        if (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
            # Loading it anyway gave the same tokens as without it: refused, not silently ignored.
            raise CheckpointError(f"{self.where} asks for rope_scaling {scaling}; this engine implements plain "
                                  "RoPE only. Remove rope_scaling and keep prompts within max_position_embeddings.")

    def heads(self, hidden: int, heads: int, kv_heads: int) -> None:
        if hidden % heads:
            raise self._error("hidden_size", f"a multiple of the {heads} attention heads", hidden)
        if heads % kv_heads:
            raise self._error("num_key_value_heads", f"a divisor of the {heads} attention heads", kv_heads)

    def _first(self, names, default):
        for name in names:
            if name in self.config and self.config[name] is not None:
                return name, self.config[name]
        if default is _MISSING:
            raise CheckpointError(f"{self.where} lacks {names[-1]!r}, which this architecture needs. Re-download "
                                  "the checkpoint or add the field.")
        return names[-1], default
