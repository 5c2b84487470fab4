"""A checkpoint's folder: found locally or fetched from the hub, and its config.json read
(checkpoint/sources.py lists its weight files, checkpoint/weights.py fills the model from them). A
GGUF file (llama.cpp's format), or a folder holding one and no config.json, is a checkpoint too: its
metadata stands in for config.json (checkpoint/gguf_file.py).

Only safetensors and GGUF are ever read; a folder of pickle checkpoints (.bin/.pt/.pth) is refused, and
no remote code is executed.
"""

from __future__ import annotations

import os
from pathlib import Path

from dlm_backend.engine.checkpoint.files import checkpoint_file, read_json
from dlm_backend.engine.models.registry import from_config_json, resolve_model_class
from dlm_backend.engine.quant.formats import checkpoint_format
from dlm_backend.errors import CheckpointError, ModelNotFoundError

HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]


#: The embedded model, shipped inside the package (trained by recipes/dlm_tiny).
EMBEDDED_MODEL = Path(__file__).resolve().parents[2] / "assets" / "dlm-tiny"


def default_model() -> str:
    """``$DLM_MODEL`` if set, else the embedded dlm-tiny checkpoint."""
    return os.environ.get("DLM_MODEL") or str(EMBEDDED_MODEL)


def resolve_checkpoint(model: str | os.PathLike, revision: str | None = None,
                       patterns: list[str] = HUB_PATTERNS) -> Path:
    """A local folder holding the checkpoint: ``model`` itself, or a hub snapshot of it; or a GGUF
    file (``model`` itself, or the one .gguf of a folder that has no config.json).

    Hub downloads go through huggingface_hub, so ``HF_HUB_OFFLINE``, ``HF_HOME`` and the local cache
    behave as everywhere else in the HF ecosystem. ``patterns`` limits what a download fetches.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return _gguf_in(path) or path
    if path.resolve() == EMBEDDED_MODEL:
        raise ModelNotFoundError(
            "No model was named and the embedded dlm-tiny checkpoint is not built in this install. "
            "Pass a model (a folder or hub id such as 'GSAI-ML/LLaDA-8B-Instruct'), set DLM_MODEL, or "
            f"build dlm-tiny with `dlm train` and copy its model/ folder to {EMBEDDED_MODEL}.")
    name = str(model)
    if is_gguf(path):
        return path
    if path.is_file():
        raise ModelNotFoundError(f"{name!r} is a file; pass the folder that holds it ({str(path.parent)!r}), or a "
                                 ".gguf file.")
    if path.suffix.lower() == ".gguf" and not path.exists():       # else asked of the hub as a repository id
        raise ModelNotFoundError(f"GGUF file {name!r} does not exist. Pass an existing .gguf file or checkpoint "
                                 "folder.")
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


def is_gguf(path: Path) -> bool:
    """Whether ``path`` (as :func:`resolve_checkpoint` returns it) is a GGUF file, not a folder."""
    return path.suffix.lower() == ".gguf" and path.is_file()


def _gguf_in(folder: Path) -> Path | None:
    """The one .gguf of a folder without config.json (None when there is a config.json or no .gguf);
    several are refused by name, since which one is meant (a quantization, a split part, a vision
    projector) is the caller's choice."""
    if os.path.lexists(folder / "config.json"):
        return None
    found = sorted(p.name for p in folder.iterdir() if p.suffix.lower() == ".gguf")
    if len(found) > 1:
        shown = ", ".join(found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
        raise CheckpointError(f"{folder} holds {len(found)} GGUF files ({shown}) and no config.json. Pass the one "
                              f"to load, e.g. {str(folder / found[0])!r}; a model split into parts must be merged "
                              "first (llama.cpp: llama-gguf-split --merge).")
    if not found:
        return None
    checkpoint_file(folder, found[0])     # inside the folder and a regular file (a hub cache's links to blobs/ too)
    return folder / found[0]


def checkpoint_config(path: Path) -> dict:
    """The config.json of a resolved checkpoint: a GGUF file's from its metadata, else the folder's."""
    if is_gguf(path):
        from dlm_backend.engine.checkpoint.gguf_file import gguf_config      # the gguf package only for GGUF files

        return gguf_config(path)
    return read_config(path)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def read_config(folder: Path) -> dict:
    """config.json (with generation_config.json under ``_generation_config``), refused with a
    CheckpointError naming the format when the weights are quantized in one this engine does not read."""
    config = read_json(folder, "config.json")
    if config is None:
        raise CheckpointError(f"{folder} has no config.json. Point at the folder that holds the "
                              "checkpoint's config.json and safetensors files.")
    checkpoint_format(config, f"{folder}/config.json")     # a format this engine does not read fails here
    generation = read_json(folder, "generation_config.json")
    if generation is not None:
        config["_generation_config"] = generation
    return config


def context_length(model: str, revision: str | None = None) -> int:
    """The model's context window from its config.json (or GGUF metadata) alone: no weights are read
    or downloaded.

    Frameworks ask for it before the first request (LlamaIndex's ``metadata``), often on an event
    loop, where loading an 8B checkpoint would stall everything for tens of seconds.
    """
    config = checkpoint_config(resolve_checkpoint(model, revision, patterns=["*.json"]))
    return from_config_json(resolve_model_class(config).args_from_config, config).max_positions
