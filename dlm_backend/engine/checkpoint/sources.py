"""Where a model's tensors come from: safetensors files (full precision, or a quantized format's
stored tensors grouped into one weight each) or a GGUF file. The loader (checkpoint/weights.py)
reads any source the same way: named entries, each checked against the model before it is read."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from dlm_backend.engine.checkpoint.files import checkpoint_file, read_json
from dlm_backend.engine.quant.formats import QuantFormat
from dlm_backend.engine.quant.weight import QuantizedWeight
from dlm_backend.errors import CheckpointError, UnsafeCheckpointError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_LAYER_INDEX = re.compile(r"\.(?:layers|blocks|h)\.(\d+)\.")


@dataclass
class Entry:
    """One tensor of a checkpoint, under the model's name for it."""

    name: str
    shape: tuple[int, ...]                          # the logical shape (a quantized weight's [N, K])
    read: Callable[[], torch.Tensor | QuantizedWeight]
    #: what a tensor-parallel layer slices its part from (a safetensors slice reads only those bytes)
    part: Callable[[], Any]


class TensorSource(ABC):
    """A checkpoint's tensors: their names (read before anything is built) and the entries."""

    total_bytes: int = 0
    label: str = "the checkpoint"

    @abstractmethod
    def names(self) -> list[str]:
        """Every tensor's name, as the model names it."""

    @abstractmethod
    def entries(self, target: str, progress: Callable[[int], None]) -> Iterator[Entry]:
        """Every tensor, read onto device ``target``; ``progress(bytes)`` as files are done."""

    def layer_count(self) -> int | None:
        """The number of layers the tensors hold (``...layers.N.``), None when no name has one."""
        indices = {int(m.group(1)) for name in self.names() if (m := _LAYER_INDEX.search(name))}
        return max(indices) + 1 if indices else None


def open_safetensors(file: Path, target: str):
    try:
        return safe_open(str(file), framework="pt", device=target)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{file} is not a readable safetensors file ({exc}); a download may have stopped "
                              "part way. Re-download the checkpoint.") from None


class SafetensorsSource(TensorSource):
    """A folder's safetensors files; with a quantized ``fmt``, each quantized weight's stored tensors
    (which may sit in different shards) become one entry once all are read."""

    def __init__(self, folder: Path, fmt: QuantFormat | None = None):
        self.folder, self.fmt = folder, fmt
        self.files = safetensors_files(folder)
        self.total_bytes = sum(f.stat().st_size for f in self.files)
        self.label = str(folder)
        self._names: list[str] | None = None

    def names(self) -> list[str]:
        if self._names is None:
            self._names = []
            for file in self.files:
                with open_safetensors(file, "cpu") as f:
                    self._names.extend(f.keys())
        return self._names

    def entries(self, target: str, progress: Callable[[int], None]) -> Iterator[Entry]:
        groups = self.fmt.groups(set(self.names())) if self.fmt is not None else {}
        role_of = {stored: (weight, role) for weight, roles in groups.items() for role, stored in roles.items()}
        pending: dict[str, dict[str, torch.Tensor]] = {}
        for file in self.files:
            with open_safetensors(file, target) as f:
                for name in f.keys():
                    if name in role_of:
                        weight, role = role_of[name]
                        got = pending.setdefault(weight, {})
                        got[role] = f.get_tensor(name)
                        if len(got) == len(groups[weight]):
                            yield self._quantized(weight, pending.pop(weight))
                        continue
                    yield Entry(name, tuple(f.get_slice(name).get_shape()), lambda f=f, n=name: f.get_tensor(n),
                                lambda f=f, n=name: f.get_slice(n))
            progress(file.stat().st_size)

    def _quantized(self, weight: str, tensors: dict[str, torch.Tensor]) -> Entry:
        value = self.fmt.build(weight, tensors)
        return Entry(weight, tuple(value.shape), lambda: value, lambda: value)


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files, from ``model.safetensors.index.json`` when sharded."""
    index = folder / "model.safetensors.index.json"
    index_json = read_json(folder, index.name)
    if index_json is not None:
        weight_map = index_json.get("weight_map", {})
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: 'weight_map' must map tensor names to shard file names. Re-download "
                                  "the checkpoint.")
        files = {name: checkpoint_file(folder, name, index.name) for name in sorted(set(weight_map.values()))}
        missing = [name for name, file in files.items() if file is None]
        if missing:
            raise CheckpointError(f"Shards listed in {index.name} are missing: {', '.join(missing)}. "
                                  "Re-download the checkpoint.")
        return sorted(set(files.values()))
    # HF names weights model.safetensors / model-0000i-of-0000n.safetensors; other *.safetensors
    # files in a folder (adapters, test data) are not this model's weights. Each must be a regular
    # file inside the folder (safetensors memory-maps it; a FIFO would block the open).
    files = sorted(checkpoint_file(folder, f.name) for f in folder.glob("model*.safetensors"))
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
