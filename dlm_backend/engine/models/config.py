"""Reading a checkpoint's config.json with types and ranges checked before anything is built.

A config.json is input like any other: ``num_hidden_layers: 10000000`` built layers for hours,
``max_position_embeddings: 3e8`` asked for 38 GB, ``hidden_size: "256"`` or ``-256``, heads 0,
``rope_scaling: "linear"`` or ``eos_token_id: "0"`` raised raw TypeErrors deep inside torch, and
``rope_theta: 0`` loaded and then failed every request. Each family reads its fields through a
:class:`ConfigReader`, and each bad field is a CheckpointError naming it and its rule.
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
