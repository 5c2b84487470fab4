"""Find a checkpoint (local folder or hub id), read its config and load its safetensors weights.

Only safetensors are ever read; pickle checkpoints (.bin/.pt/.pth) are refused, and no remote code
is executed. The model is built on the meta device, so weights are materialised once, straight on
the target device and dtype.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

from dlm_backend.engine.models.base import DiffusionLM
from dlm_backend.engine.models.registry import resolve_model_class
from dlm_backend.errors import CheckpointError, ModelNotFoundError, UnsafeCheckpointError

HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
#: Tensors some exports carry that no implementation needs: rotary tables recomputed at load, and
#: (for a tied model) a copy of the embedding saved as the head.
HARMLESS_EXTRAS = ("rotary_emb.inv_freq",)
HEADS = ("lm_head.weight", "transformer.ff_out.weight")
# Show a progress bar only when loading is slow enough to notice.
PROGRESS_MIN_BYTES = 256 * 2**20


#: The embedded model, shipped inside the package (see dlm_backend/training).
EMBEDDED_MODEL = Path(__file__).resolve().parents[1] / "assets" / "dlm-tiny"


def default_model() -> str:
    """``$DLM_MODEL`` if set, else the embedded dlm-tiny checkpoint."""
    return os.environ.get("DLM_MODEL") or str(EMBEDDED_MODEL)


def resolve_checkpoint(model: str | os.PathLike, revision: str | None = None,
                       patterns: list[str] = HUB_PATTERNS) -> Path:
    """A local folder holding the checkpoint: ``model`` itself, or a hub snapshot of it.

    Hub downloads go through huggingface_hub, so ``HF_HUB_OFFLINE``, ``HF_HOME`` and the local cache
    behave as everywhere else in the HF ecosystem. ``patterns`` limits what a download fetches.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.resolve() == EMBEDDED_MODEL:
        raise ModelNotFoundError(
            "No model was named and the embedded dlm-tiny checkpoint is not built in this install. "
            "Pass a model (a folder or hub id such as 'GSAI-ML/LLaDA-8B-Instruct'), set DLM_MODEL, or "
            f"build dlm-tiny with `dlm train` and copy its model/ folder to {EMBEDDED_MODEL}.")
    name = str(model)
    if path.is_file():
        raise ModelNotFoundError(f"{name!r} is a file; pass the folder that holds it ({str(path.parent)!r}).")
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelNotFoundError(f"Model folder {name!r} does not exist. Pass an existing checkpoint "
                                 "folder or a hub id like 'GSAI-ML/LLaDA-8B-Instruct'.")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (HfHubHTTPError, HFValidationError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError)

    try:
        return Path(snapshot_download(name, revision=revision, allow_patterns=patterns))
    except HFValidationError as exc:        # "my model", "C:\\models\\llada": neither a folder nor an id
        raise ModelNotFoundError(f"{name!r} is neither an existing folder nor a hub id ({exc}). Pass a "
                                 "checkpoint folder or an id like 'GSAI-ML/LLaDA-8B-Instruct'.") from None
    except LocalEntryNotFoundError as exc:
        raise ModelNotFoundError(
            f"Model {name!r} is not in the local Hugging Face cache and the hub cannot be reached "
            f"(offline={_offline()}). Download it once with network access "
            f"(`huggingface-cli download {name}`), or pass a local checkpoint folder.") from exc
    except RepositoryNotFoundError as exc:
        raise ModelNotFoundError(f"Hub repository {name!r} does not exist or is private. Check the id, "
                                 "or log in with `huggingface-cli login`.") from exc
    except (HfHubHTTPError, OSError) as exc:
        raise ModelNotFoundError(f"Could not fetch {name!r} from the hub: {exc}. Check the network, "
                                 "or pass a local checkpoint folder.") from exc
    except Exception as exc:  # noqa: BLE001 - the HTTP client's own errors (a proxy's 407, TLS) pass through the hub
        raise ModelNotFoundError(f"Could not fetch {name!r} from the hub ({type(exc).__name__}: {exc}). Check "
                                 "the network and proxy settings, or pass a local checkpoint folder.") from exc


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def read_config(folder: Path) -> dict:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder} has no config.json. Point at the folder that holds the "
                              "checkpoint's config.json and safetensors files.")
    config = read_json(config_path)
    scaling = config.get("rope_scaling")
    if scaling and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
        # Loading it anyway gave the same tokens as without it: refused, not silently ignored.
        raise CheckpointError(f"{config_path} asks for rope_scaling {scaling}; this engine implements plain "
                              "RoPE only. Remove rope_scaling and keep prompts within max_position_embeddings.")
    generation_path = folder / "generation_config.json"
    if generation_path.is_file():
        config["_generation_config"] = read_json(generation_path)
    return config


def read_json(path: Path) -> dict:
    """A checkpoint's JSON file; a truncated or hand-broken one is a CheckpointError naming it."""
    try:
        value = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}). Re-download the checkpoint or fix the file.") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} must hold a JSON object. Re-download the checkpoint or fix the file.")
    return value


def context_length(model: str, revision: str | None = None) -> int:
    """The model's context window from its config.json alone: no weights are read or downloaded.

    Frameworks ask for it before the first request (LlamaIndex's ``metadata``), often on an event
    loop, where loading an 8B checkpoint would stall everything for tens of seconds.
    """
    config = read_config(resolve_checkpoint(model, revision, patterns=["*.json"]))
    return _from_config(resolve_model_class(config).args_from_config, config).max_positions


def _from_config(build, config: dict):
    try:
        return build(config)
    except KeyError as exc:
        raise CheckpointError(f"config.json lacks {exc.args[0]!r}, which this architecture needs. Re-download "
                              "the checkpoint or add the field.") from None


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files, from ``model.safetensors.index.json`` when sharded."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map", {})
        files = sorted({folder / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"Shards listed in {index.name} are missing: {', '.join(missing)}. "
                                  "Re-download the checkpoint.")
        return files
    # HF names weights model.safetensors / model-0000i-of-0000n.safetensors; other *.safetensors
    # files in a folder (adapters, test data) are not this model's weights.
    files = sorted(folder.glob("model*.safetensors"))
    if files:
        return files
    # A hub download fetches no pickle, but a sharded one's index (pytorch_model.bin.index.json) shows it.
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES or p.name.endswith(".bin.index.json"))
    if pickles:
        raise UnsafeCheckpointError(
            f"{folder} holds only pickle weights ({', '.join(pickles)}). Pickle files can run arbitrary "
            "code when loaded, so dlm_backend never reads them. Convert the checkpoint to safetensors "
            "(e.g. `safetensors.torch.save_file(torch.load(f, weights_only=True), 'model.safetensors')` "
            "in a trusted environment) or use a repository that publishes safetensors.")
    raise CheckpointError(f"{folder} has no model*.safetensors weights. Point at a complete checkpoint folder "
                          "(a hub repository that publishes only pickle .bin weights is not read: use one with "
                          "safetensors).")


def default_dtype(device: torch.device) -> torch.dtype:
    # bf16 matmuls are hundreds of times slower than fp32 on CPU cores; on GPU bf16 is the native dtype.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(folder: Path, config: dict, device: torch.device, dtype: torch.dtype) -> DiffusionLM:
    """Build the registered implementation for ``config`` and fill it from the safetensors files."""
    cls = resolve_model_class(config)
    with torch.device("meta"):
        model = _from_config(cls.from_config, config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    files = safetensors_files(folder)
    state: dict[str, torch.Tensor] = {}
    shape_errors: list[str] = []
    unexpected: list[str] = []
    total = sum(f.stat().st_size for f in files)
    # Read straight onto the target device; the dtype cast then runs there too.
    target = f"cuda:{device.index or 0}" if device.type == "cuda" else str(device)
    with tqdm(total=total, unit="B", unit_scale=True, desc="Loading weights",
              disable=total < PROGRESS_MIN_BYTES) as bar:
        for file in files:
            try:
                reader = safe_open(str(file), framework="pt", device=target)
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(f"{file} is not a readable safetensors file ({exc}); a download may "
                                      "have stopped part way. Re-download the checkpoint.") from None
            with reader as f:
                for name in f.keys():
                    if name not in expected:
                        unexpected.append(name)
                        continue
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != expected[name]:
                        shape_errors.append(f"{name}: expected {list(expected[name])}, found {list(shape)}")
                        continue
                    state[name] = f.get_tensor(name).to(dtype)
            bar.update(file.stat().st_size)
    # A tensor the implementation has no place for would be dropped and the logits silently wrong
    # (e.g. LLaDA with include_bias: biases on every layer); only known leftovers are skipped.
    tied = bool(config.get("tie_word_embeddings") or config.get("weight_tying"))
    unexpected = [n for n in unexpected if not n.endswith(HARMLESS_EXTRAS) and not (tied and n.endswith(HEADS))]
    if unexpected:
        shown = ", ".join(unexpected[:8]) + (f" and {len(unexpected) - 8} more" if len(unexpected) > 8 else "")
        raise CheckpointError(f"Tensors in {folder} that {cls.__name__} has no place for: {shown}. The "
                              "checkpoint is of another variant than its config.json says, or not supported.")
    missing = sorted(set(expected) - set(state) - {n.split(": ")[0] for n in shape_errors})
    if shape_errors:
        raise CheckpointError(f"Tensors with the wrong shape for {cls.__name__} in {folder}: "
                              f"{'; '.join(shape_errors[:8])}. The config.json and weights disagree: "
                              "re-download the checkpoint or fix config.json.")
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise CheckpointError(f"Tensors missing from {folder} for {cls.__name__}: {shown}. "
                              "The checkpoint is incomplete or of another architecture: re-download it.")
    model.load_state_dict(state, assign=True)
    model.setup(device)
    return model.eval().requires_grad_(False)
