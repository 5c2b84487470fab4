"""What every model family provides to the engine: the contract a plugin family implements.

A family is a :class:`DiffusionLM` subclass, registered by its ``architectures`` string through the
``register_models`` hook. It is built from config.json (:meth:`~DiffusionLM.args_from_config`,
:meth:`~DiffusionLM.from_config`), runs one packed forward (:meth:`~DiffusionLM.forward`), hands
the engine its final norm and LM head (:meth:`~DiffusionLM.head`), and names how its requests are
decoded pass by pass (:attr:`~DiffusionLM.schedule`, a schedule registered through
``register_schedules``). A family whose passes feed something back into the next one (DiffusionGemma's
self-conditioning) also implements :meth:`~DiffusionLM.conditioning_input`.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dlm_backend.engine.layers import RMSNorm, RotaryTable
from dlm_backend.engine.layers.head import UnmaskStats, greedy_from_logits, unmask_stats, vocab_parallel_stats
from dlm_backend.engine.parallel.group import build_group


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
    mask_token_id: int | None            # None: the tokenizer's mask token (LLaDA2 keeps it out of config.json)
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    tie_word_embeddings: bool = False
    explicit_head_dim: int | None = None  # config.json's head_dim where it is not hidden_size / heads
    rotary_dim: int | None = None         # partial rotary: the leading dims of a head that rotate
    block_size: int | None = None         # block-diffusion families: the block; None: full-sequence
    #: per layer (Hkv, head_dim) where layers differ (DiffusionGemma); None: every layer the same
    layer_kv: tuple[tuple[int, int], ...] | None = None

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @property
    def kv_shapes(self) -> tuple[tuple[int, int], ...]:
        """Each layer's (Hkv, head_dim): what the KV pool holds per position."""
        return self.layer_kv or ((self.num_kv_heads, self.head_dim),) * self.num_layers


class DiffusionLM(nn.Module, metaclass=ABCMeta):
    """Base of native model implementations (the abstract members are what a family must implement).

    ``forward(input_ids [T], positions [T]) -> hidden [T, D]`` over the packed batch described by the
    attention context; ``head() -> (final norm, LM head weight [V, D])``, from which
    ``compute_logits(hidden [N, D]) -> [N, V]`` applies the final norm and head to just the rows a
    sampler needs (126k-wide logits for every canvas position would dominate a pass), and
    ``compute_unmask_stats`` skips the logits altogether.
    ``logits_shift = 1`` means the prediction for position i is read from the output at i - 1 (Dream).
    """

    logits_shift: int = 0
    #: the family's reference decoding set-up (knob table names), under a checkpoint's own
    #: ``dlm_sampling``: what a request gets when it names nothing
    sampling_defaults: ClassVar[dict] = {}
    #: how a canvas starts: "mask" (every slot the mask token) or "uniform" (random tokens,
    #: DiffusionGemma: engine/requests/uniform_sequence.py decodes it, with a sampler of the same noise)
    noise: ClassVar[str] = "mask"
    #: checkpoint tensors the family does not use (DiffusionGemma's vision tower: text only)
    ignored_prefixes: ClassVar[tuple[str, ...]] = ()
    #: whether the family is built from the parallel layers (layers/parallel.py), so it can split over ranks.
    #: False by default: a plugin family of plain nn.Linear layers would load whole on every rank while
    #: its KV pool took one rank's heads, so it is refused under tensor parallelism until it says so.
    tensor_parallel: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def args_from_config(cls, config: dict) -> ModelArgs:
        """Shapes and token ids from config.json's contents (the loader adds ``generation_config.json``
        as ``config["_generation_config"]``). Called before anything is built; a field out of range is
        a CheckpointError naming it (``config_reader.ConfigReader`` checks them), a missing one too."""

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict) -> DiffusionLM:
        """The model, built from config.json's contents (the loader builds it on the meta device, then
        fills every parameter from the checkpoint's tensors of the same names)."""

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``input_ids [T], positions [T] -> hidden [T, D]`` for one packed batch: the fed positions of
        every scheduled request, one after the other. ``layers.attention(q, k, v, layer)`` runs each
        request over its own keys or its KV pages, whichever the runner set up; a family with decoder
        passes reads their rows and conditioning from ``layers.current_context()`` (DiffusionGemma)."""

    @property
    def schedule(self) -> str:
        """How this family's requests are decoded pass by pass: the name of a schedule registered
        through the ``register_schedules`` hook (``full``: one canvas, bidirectional, blocks left to
        right; ``block``: block-diffusion, block-causal; ``uniform``: canvases of random tokens). By
        default derived from :attr:`noise` and ``args.block_size``; a family with its own schedule
        sets ``schedule = "its-name"``."""
        return "uniform" if self.noise == "uniform" else "block" if self.args.block_size else "full"

    def conditioning_input(self, conditioning: torch.Tensor) -> torch.Tensor:
        """The model's input for a request's next pass from what its sampler returned in
        ``Commit.conditioning`` (DiffusionGemma: processed logits ``[n, V]`` -> self-conditioning
        ``[n, D]``). Called only when a sampler returns conditioning, so a family without any never
        implements it."""
        raise TypeError(f"{type(self).__name__} takes no conditioning input, but the sampler returned "
                        "Commit.conditioning; use a sampler made for this family.")

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.rotary: RotaryTable | None = None
        self.tp = build_group()                 # None: one device
        if self.tp is not None:                 # the heads first: the error a user can act on
            self.tp.kv_heads(args.num_kv_heads, args.num_heads)

    @property
    def kv_shapes(self) -> tuple[tuple[int, int], ...]:
        """Each layer's (Hkv, head_dim) as this rank's KV pool holds it: its share of the layer's
        heads (DiffusionGemma's sliding and full layers have different counts, split apart)."""
        if self.tp is None:
            return self.args.kv_shapes
        mine = [self.tp.kv_heads(kv, self.args.num_heads) for kv, _ in self.args.kv_shapes]
        return tuple((h.stop - h.start, d) for h, (_, d) in zip(mine, self.args.kv_shapes))

    @classmethod
    def family_defaults(cls, generation_config: dict) -> dict:
        """The family's decoding defaults for a checkpoint: :attr:`sampling_defaults`, which a family
        whose reference reads its own fields of ``generation_config.json`` updates from them."""
        return dict(cls.sampling_defaults)

    def setup(self, device: torch.device | str) -> None:
        """Build non-parameter state (the RoPE table) on the target device after weights load."""
        a = self.args
        self.rotary = RotaryTable(a.head_dim, a.rope_theta, a.max_positions, device, a.rotary_dim)

    def stacked_name(self, name: str) -> tuple[str, int] | None:
        """Where a checkpoint tensor goes when the model stacks it with its siblings: per-expert
        weights (``...experts.7.gate_proj.weight``) load into one ``[E, ...]`` parameter at index 7,
        so an MoE checkpoint is materialised once, already stacked. None: loaded under its own name."""
        return None

    @abstractmethod
    def head(self) -> tuple[RMSNorm, torch.Tensor]:
        """The final norm and the LM head weight ``[V, D]``."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        norm, weight = self.head()
        return self.gather_vocab(F.linear(norm(hidden), weight))         # [N, V]

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """This rank's logits ``[N, V / world]`` of a vocabulary-parallel head -> every rank's ``[N, V]``
        (one all-gather of the sampler's rows only); unchanged on one device."""
        if self.tp is None:
            return logits
        return self.tp.gather_last(logits)[:, :self.args.vocab_size]

    def compute_unmask_stats(self, hidden: torch.Tensor, exclude_id: int = -1) -> UnmaskStats:
        """Greedy token and its fp32 softmax probability per row of ``hidden [N, D]``; the kernel
        path never builds the [N, V] logits. ``exclude_id`` (the mask id) is never chosen. Under
        tensor parallelism each rank reduces its rows of the head and the ranks exchange four numbers
        a row, not the logits (a head kept whole on every rank decides alone)."""
        norm, weight = self.head()
        if self.tp is None:
            return unmask_stats(norm(hidden), weight, exclude_id)
        logits = F.linear(norm(hidden), weight)                          # [N, V / world], or [N, V] whole
        if logits.shape[1] == self.args.vocab_size:
            return greedy_from_logits(logits, exclude_id)
        return vocab_parallel_stats(self.tp, logits, self.args.vocab_size, exclude_id)


class DecoderStackLM(DiffusionLM):
    """A family whose checkpoint keeps a Llama-style stack under ``model.``: ``embed_tokens``,
    ``layers`` (each ``(x, residual, cos, sin) -> (x, residual)``, the residual adds inside its
    norms), ``norm``, and an ``lm_head`` unless the embeddings are tied. Its forward and head are
    these whatever the layers hold (Dream, SDAR, LLaDA-MoE, WeDLM)."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary.lookup(positions)                        # [T, 1, rotary_dim]
        x, residual = self.model.embed_tokens(input_ids), None          # [T, D]
        for layer in self.model.layers:
            x, residual = layer(x, residual, cos, sin)
        return residual + x

    def head(self) -> tuple[RMSNorm, torch.Tensor]:
        w = self.model.embed_tokens.weight if self.args.tie_word_embeddings else self.lm_head.weight
        return self.model.norm, w

