"""What every model family provides to the runner."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dlm_backend.engine.layers import RotaryTable


@dataclass(frozen=True)
class ModelArgs:
    """Shape and token facts the runner needs, read from the checkpoint's config.json."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_positions: int
    rope_theta: float
    norm_eps: float
    mask_token_id: int
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def token_ids(value) -> tuple[int, ...]:
    """A config's token id entry (int, list or null) as a tuple."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


class DiffusionLM(nn.Module):
    """Base of native model implementations.

    ``forward(input_ids [T], positions [T]) -> hidden [T, D]`` over the packed batch described by the
    attention context; ``compute_logits(hidden [N, D]) -> [N, V]`` applies the final norm and head to
    just the rows a sampler needs (126k-wide logits for every canvas position would dominate a pass).
    Each family also provides ``from_config(config_json: dict)``.
    ``logits_shift = 1`` means the prediction for position i is read from the output at i - 1 (Dream).
    """

    logits_shift: int = 0
    rope_full_precision: bool = True

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.rotary: RotaryTable | None = None

    def setup(self, device: torch.device | str) -> None:
        """Build non-parameter state (the RoPE table) on the target device after weights load."""
        self.rotary = RotaryTable(self.args.head_dim, self.args.rope_theta, self.args.max_positions, device)
