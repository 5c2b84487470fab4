"""What `dlm train` refuses before it writes or trains anything: flags that cannot make a run, a
resume whose flags differ from the run it resumes, and an ``--init-from`` stage whose shape or
frozen circuits differ from its first stage's. Each is a DLMError naming the flag and the fix,
where it used to be a traceback (or, for a resume, a silently mixed run)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dlm_backend.errors import DLMError

if TYPE_CHECKING:
    from dlm_tiny.train_config import TrainConfig

#: Flags a resumed run may change: how long it runs, how often it saves, the precision of its products.
#: ``precision`` too: weights and optimiser state are float32 either way, so a bf16 run can go on in float32.
#: ``device`` too: a run started on the CPU may go on on a GPU (the state is saved on the CPU).
#: ``compile`` too: it changes how the same functions run, not what the run trains.
RESUMABLE_CHANGES = {"steps", "save_every", "out_dir", "precision", "device", "compile"}
#: Settings a stage started with ``--init-from`` inherits: the frozen circuits were built for them.
#: They are written into the run's config.json under this key.
TRAINING_KEY = "dlm_training"
CIRCUIT_FIELDS = ("copy_circuit", "copy_prev_dims", "pointer_layer", "copy_gain")
SHAPE_FIELDS = {"hidden_size": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                "num_kv_heads": "num_key_value_heads", "intermediate_size": "intermediate_size"}


def check_flags(cfg: TrainConfig) -> None:
    """Flags that cannot make a run."""
    for flag, share in (("unanswerable", cfg.unanswerable), ("qa-hard", cfg.qa_hard),
                        ("rag-templates", cfg.rag_templates)):
        if not 0 <= share <= 1:
            raise DLMError(f"--{flag} is a share of QA questions: got {share}, give 0..1 (e.g. 0.3)")
    if cfg.pad_dist not in ("uniform", "log"):
        raise DLMError(f"--pad-dist: got {cfg.pad_dist!r}; give 'uniform' or 'log'")
    if cfg.precision not in ("float32", "bf16"):
        raise DLMError(f"--precision: got {cfg.precision!r}; give 'float32' or 'bf16'")
    device = check_device(cfg.device)
    if cfg.precision == "bf16" and device.type == "cpu" and not bf16_is_native():
        raise DLMError("--precision bf16 needs a CPU with native bfloat16 (AVX512-BF16 or AMX); this one would "
                       "emulate it, hundreds of times slower: train with --precision float32")
    # bf16 tensor cores start with Ampere (8.0); older GPUs emulate it, as a CPU without AVX512-BF16 does
    if cfg.precision == "bf16" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        raise DLMError(f"--precision bf16: {cfg.device} has no native bfloat16 (compute capability "
                       f"{torch.cuda.get_device_capability(device)}, needs 8.0); train with --precision float32")
    for flag, value in (("save-every", cfg.save_every), ("max-extra-pad", cfg.max_extra_pad), ("rows", cfg.rows),
                        ("num-examples", cfg.num_examples)):
        if value < 1:
            raise DLMError(f"--{flag} must be at least 1, got {value}")
    if cfg.steps < 0:
        raise DLMError(f"--steps must be 0 or more, got {cfg.steps}")
    if cfg.num_heads < 1 or cfg.num_kv_heads < 1 or cfg.num_heads % cfg.num_kv_heads or cfg.hidden_size % cfg.num_heads:
        raise DLMError(f"--num-heads {cfg.num_heads} must divide --hidden-size {cfg.hidden_size} and be a multiple "
                       f"of --num-kv-heads {cfg.num_kv_heads} (e.g. 256, 4, 2)")
    head_dim = cfg.hidden_size // cfg.num_heads
    if cfg.copy_circuit and head_dim < 16:
        raise DLMError(f"the copy circuit needs heads of at least 16 dims (8 rotary pairs); --hidden-size "
                       f"{cfg.hidden_size} over {cfg.num_heads} heads gives {head_dim}: use fewer heads or "
                       f"--no-copy-circuit")
    if cfg.max_len > 2048:
        raise DLMError(f"--max-len {cfg.max_len} is longer than the model's 2048 positions; give 2048 or less")
    if cfg.pointer_layer and not cfg.copy_circuit:
        raise DLMError(f"--pointer-layer {cfg.pointer_layer} copies through the copy circuit, which "
                       f"--no-copy-circuit turns off: pass --pointer-layer 0 with it")
    if cfg.block_size < 0 or cfg.block_size > cfg.max_len:
        raise DLMError(f"--block-size {cfg.block_size}: give 0 (the Dream layout) or a block of 1..--max-len "
                       f"({cfg.max_len}) positions, e.g. 8")
    if cfg.block_size and (cfg.prompt_mask_prob or cfg.ar_until):
        raise DLMError(f"--block-size {cfg.block_size} trains replies block by block, with no whole-prompt masking "
                       f"and no autoregressive start (block_layout.py); pass --prompt-mask-prob 0 --ar-until 0")
    if cfg.init_from and not (Path(cfg.init_from) / "config.json").is_file():
        raise DLMError(f"--init-from {cfg.init_from}: no config.json there; give the checkpoint folder "
                       f"(a run's model/ folder, or dlm_backend/assets/dlm-tiny)")


def check_device(name: str) -> torch.device:
    """``--device``: "cpu" or an available CUDA device."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DLMError(f"--device: cannot read {name!r}; give cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise DLMError(f"--device {name}: training runs on cpu or cuda; give one of them")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DLMError(f"--device {name}: torch sees no CUDA device here; train with --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise DLMError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                       f"give cuda:0..cuda:{torch.cuda.device_count() - 1}")
    return device


def bf16_is_native() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware: AVX512-BF16 or AMX on x86. (oneDNN's own
    ``_is_mkldnn_bf16_supported`` also says yes for AVX512 without BF16, where it emulates bf16.)"""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:       # a torch without these probes: do not guess
        return False


def check_weights(weights: dict[str, float], families: dict[str, float]) -> None:
    """A family mix ``random.choices`` can draw from: finite weights, not all zero."""
    bad = [name for name, w in weights.items() if not math.isfinite(w)]
    if bad:
        raise DLMError(f"--family-weights: {bad} are not finite; give numbers like qa=0.35")
    if sum({**families, **weights}.values()) <= 0:
        raise DLMError("--family-weights: every family weighs 0; give at least one a positive weight")


def check_resume(saved: dict | None, cfg: TrainConfig) -> None:
    """A resumed run must continue the run it resumes (only ``RESUMABLE_CHANGES`` may differ)."""
    if saved is None:            # a state saved before runs recorded their flags
        return
    now = asdict(cfg)
    changed = sorted(k for k in now if k not in RESUMABLE_CHANGES and k in saved and saved[k] != now[k])
    if changed:
        diff = ", ".join(f"--{k.replace('_', '-')} {saved[k]!r} -> {now[k]!r}" for k in changed)
        raise DLMError(f"{cfg.out_dir} holds a run started with other flags ({diff}); resume it with its own "
                       f"flags (its train_config.json), or train into a new --out-dir")


def training_settings(cfg: TrainConfig) -> dict:
    """What a later ``--init-from`` stage must keep, for the run's config.json."""
    return {name: getattr(cfg, name) for name in CIRCUIT_FIELDS}


def check_init_from(init_config: dict, cfg: TrainConfig) -> None:
    """An ``--init-from`` stage must have its checkpoint's shape and, where the checkpoint records
    them, its circuit settings (a different setting would train weights that were built frozen)."""
    shape = [f"--{k.replace('_', '-')} {getattr(cfg, k)} (checkpoint: {init_config.get(key)})"
             for k, key in SHAPE_FIELDS.items() if init_config.get(key) != getattr(cfg, k)]
    recorded = init_config.get(TRAINING_KEY, {})
    circuit = [f"--{k.replace('_', '-')} {getattr(cfg, k)} (checkpoint: {recorded[k]})"
               for k in CIRCUIT_FIELDS if k in recorded and recorded[k] != getattr(cfg, k)]
    if shape or circuit:
        raise DLMError(f"--init-from {cfg.init_from} was trained with other settings: {', '.join(shape + circuit)}; "
                       f"pass the checkpoint's values")


def saved_flags(state: dict) -> dict | None:
    """The flags a train_state.pt was started with (None for states saved before they were recorded)."""
    flags = state.get("config")
    return json.loads(flags) if isinstance(flags, str) else None
