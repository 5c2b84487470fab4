"""Everything an engine needs from a checkpoint (a folder, or a GGUF file), opened and checked in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dlm_backend.engine.checkpoint.folder import is_gguf, read_config, resolve_checkpoint
from dlm_backend.engine.checkpoint.tokenizer import Tokenizer
from dlm_backend.engine.checkpoint.weights import load_model
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.models.base import DiffusionLM
from dlm_backend.engine.models.config_reader import ConfigReader
from dlm_backend.engine.parallel.group import TPGroup, agree
from dlm_backend.engine.samplers.base import TokenInfo
from dlm_backend.engine.sampling_defaults import checkpoint_defaults, layered
from dlm_backend.errors import CheckpointError


@dataclass
class Checkpoint:
    """A loaded checkpoint: its folder (or GGUF file) and config, the model on its device, tokenizer and
    special tokens."""

    folder: Path
    hf_config: dict
    #: Decoding knobs the checkpoint names for itself (``generation_config.json``'s ``dlm_sampling``),
    #: over its family's reference set-up.
    sampling_defaults: dict
    model: DiffusionLM
    tokenizer: Tokenizer | None       # None: no tokenizer.json, token ids only
    tokens: TokenInfo

    @property
    def name(self) -> str:
        return self.folder.name


def open_checkpoint(config: EngineConfig, tp: TPGroup | None = None) -> Checkpoint:
    """Resolve, read, check and load the checkpoint ``config`` names (a DLMError naming the problem).
    With a tensor-parallel group, this rank's shard loads while the workers load theirs."""
    folder = resolve_checkpoint(config.model, config.revision)
    gguf = _open_gguf(folder)
    hf_config = {**(gguf.config() if gguf else read_config(folder)), **config.config_overrides}
    # Checked before the weights load, so a bad file fails fast.
    defaults = checkpoint_defaults(hf_config.get("_generation_config", {}), str(folder / "generation_config.json"))
    model = load_shard(config, folder, hf_config, tp, gguf)
    # The family's reference set-up first (LLaDA2: llada2 at 0.95), the checkpoint's own on top; a
    # checkpoint naming another sampler replaces it whole.
    defaults = layered(type(model).family_defaults(hf_config.get("_generation_config", {})), defaults)
    tokenizer = gguf.tokenizer() if gguf else checkpoint_tokenizer(folder)
    return Checkpoint(folder, hf_config, defaults, model, tokenizer, _token_info(model, hf_config, tokenizer))


def _open_gguf(path: Path):
    """The opened GGUF file when the checkpoint is one (read once for config, weights and tokenizer)."""
    if not is_gguf(path):
        return None
    from dlm_backend.engine.checkpoint.gguf_file import GGUFFile     # the gguf package only for GGUF checkpoints

    return GGUFFile(path)


def checkpoint_tokenizer(path: Path) -> Tokenizer | None:
    """A resolved checkpoint's tokenizer: a GGUF file's from its metadata, a folder's from
    tokenizer.json. None: none there, token ids only; one that is there but broken (or a link out of
    the folder, or to nothing) is an error, not "absent"."""
    if is_gguf(path):
        return _open_gguf(path).tokenizer()
    return Tokenizer(path) if os.path.lexists(path / "tokenizer.json") else None


def load_shard(config: EngineConfig, folder: Path, hf_config: dict, tp: TPGroup | None, gguf=None) -> DiffusionLM:
    """The model (this rank's shard under tensor parallelism; every rank fails together) on its device.
    ``gguf``: the checkpoint's GGUF file when open already (else opened here when ``folder`` is one)."""
    def load(device, group):
        file = gguf or _open_gguf(folder)          # inside agree(): a file one rank cannot read fails them all
        return load_model(folder, hf_config, device, config.torch_dtype, group, config.quantization,
                          file.source() if file else None)

    if tp is None:
        return load(config.torch_device, None)
    return agree(tp, lambda: load(tp.device, tp))


def _token_info(model: DiffusionLM, hf_config: dict, tokenizer: Tokenizer | None) -> TokenInfo:
    a, gen = model.args, hf_config.get("_generation_config", {})
    eos = set(a.eos_token_ids)
    eos.update(ConfigReader(gen, "generation_config.json").token_ids("eos_token_id", a.vocab_size))
    eot: list[int] = []
    if tokenizer is not None:
        tok_eos = tokenizer.token_id(tokenizer.special_tokens.get("eos_token"))
        if tok_eos is not None:
            eos.add(tok_eos)
        eot = [i for i in tokenizer.end_of_turn_ids() if i not in eos]
    mask = a.mask_token_id
    if getattr(model, "noise", "mask") == "uniform":
        mask = -1                       # no mask token: a uniform-noise canvas starts as random tokens
    elif mask is None and tokenizer is not None:       # LLaDA2 keeps its mask id in the tokenizer only
        mask = tokenizer.token_id(tokenizer.special_tokens.get("mask_token")) or tokenizer.token_id("<|mask|>")
    if mask is None:
        raise CheckpointError("The checkpoint names no mask token: config.json has no mask_token_id and the "
                              "tokenizer no mask token. Add mask_token_id to config.json (or pass "
                              "config_overrides={'mask_token_id': ...}).")
    bad = [f"{name} {i}" for name, ids in (("mask_token_id", [mask] if mask >= 0 else []), ("eos_token_id", eos))
           for i in ids if not 0 <= i < a.vocab_size]
    if bad:     # else every request fails inside the engine with an IndexError
        raise CheckpointError(f"{', '.join(bad)} is outside the vocabulary (size {a.vocab_size}); fix "
                              "config.json / generation_config.json.")
    return TokenInfo(mask_id=mask, eos_ids=tuple(sorted(eos)), eot_ids=tuple(eot), vocab_size=a.vocab_size)
