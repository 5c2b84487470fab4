"""A GGUF file (llama.cpp's format) as a checkpoint: its metadata as the config.json the engine's
implementation reads, its tensors under the HF names that implementation has (q/k rows put back in HF
order), its vocabulary as the tokenizer.

The file is read with the ``gguf`` package's own reader (``gguf.GGUFReader``, llama.cpp's Python
reader), never a parser of ours. A file is input like any other, so that reader runs bounded
(:class:`_BoundedReader`): every read must lie inside the file, and the header may take at most
:data:`MAX_READS` of them, so a header claiming 2^60 tensors or a 2^40-element array fails on the
first record past the end instead of looping or allocating. Tensor data stays memory-mapped; each
tensor is decoded (gguf_blocks.py for the quantized types) only when the loader reads it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from dlm_backend.errors import CheckpointError

try:
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader
except ImportError:             # an optional extra: safetensors checkpoints never import it
    raise CheckpointError("Reading a GGUF file needs llama.cpp's `gguf` package: pip install "
                          "'dlm_backend[gguf]' (or pip install gguf).") from None

from dlm_backend.engine.checkpoint.gguf_blocks import DECODERS, unpack
from dlm_backend.engine.checkpoint.gguf_names import Family, Meta, family_of, hf_config, name_map, permuted_heads
from dlm_backend.engine.checkpoint.gguf_tokenizer import build_tokenizer
from dlm_backend.engine.checkpoint.sources import Entry, TensorSource
from dlm_backend.engine.checkpoint.tokenizer import Tokenizer
from dlm_backend.engine.models.registry import from_config_json, resolve_model_class
from dlm_backend.engine.quant.experts import QuantizedExperts
from dlm_backend.engine.quant.int_weight import IntWeight

#: Reads the header may take: one per scalar, two per string, each kept by the reader as a small
#: array (~100 bytes). Qwen2's vocabulary (152K tokens, 151K merges, types) takes 760K, Llama 3's
#: (128K, 280K) under 1M; 4M bounds a hostile header to ~10 s of parsing and ~400 MB.
MAX_READS = 1 << 22
FLOATS = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}
READ_TYPES = (*FLOATS, *DECODERS)


class _BoundedReader(GGUFReader):
    """``gguf.GGUFReader`` whose every read is checked against the file's end and counted.

    Its reads slice a plain ndarray view of the memory map (the same bytes): slicing the ``np.memmap``
    subclass itself made a 152K-token vocabulary (760K reads) take 6.1 s to open, 2.0 s this way."""

    def __init__(self, path: Path):
        self._reads, self._bytes = 0, None
        super().__init__(path, "r")

    def _get(self, offset, dtype, count=1, override_order=None):
        if self._bytes is None:
            self._bytes = self.data.view(np.ndarray)
        offset, count, dtype = int(offset), int(count), np.dtype(dtype)
        end = offset + dtype.itemsize * count
        if offset < 0 or count < 0 or end > self._bytes.shape[0]:
            raise ValueError(f"it is {self._bytes.shape[0]} bytes long but a record needs bytes {offset} to {end}")
        self._reads += 1
        if self._reads > MAX_READS:
            raise ValueError(f"its header holds more than {MAX_READS} entries")
        values = self._bytes[offset:end].view(dtype)
        return values.view(values.dtype.newbyteorder(override_order or self.byte_order))


def _shape(tensor) -> tuple[int, ...]:
    """The logical (numpy / torch) shape: ggml lists dims innermost first."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


class GGUFFile:
    """One GGUF file, opened and checked: its family, metadata and tensors."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            mode = os.stat(self.path).st_mode
        except OSError as exc:
            raise CheckpointError(f"{self.path} cannot be read ({exc.strerror}).") from None
        if not stat.S_ISREG(mode):
            raise CheckpointError(f"{self.path} is not a regular file; point at the .gguf file itself.")
        try:
            self.reader = _BoundedReader(self.path)
        except (ValueError, KeyError, IndexError, TypeError, OverflowError, OSError, MemoryError,
                RecursionError) as exc:            # RecursionError: arrays of arrays 10^5 deep
            raise CheckpointError(f"{self.path} is not a readable GGUF file ({str(exc)[:200]}). A download may have "
                                  "stopped part way: re-download it, or use the model's safetensors folder.") from None
        if self.reader.byte_order != "I":
            raise CheckpointError(f"{self.path} is a GGUF file of the other byte order (big-endian); convert it "
                                  "with llama.cpp's converter for this machine.")
        self.meta = Meta(self.reader.fields, str(self.path))
        parts = self.meta.get("split.count", int, 1)
        if parts > 1:
            raise CheckpointError(f"{self.path} is part {self.meta.get('split.no', int, 0) + 1} of a GGUF split into "
                                  f"{parts} files; merge them first (llama.cpp: `llama-gguf-split --merge "
                                  f"{self.path.name} merged.gguf`) and pass the merged file.")
        self.family: Family = family_of(self.meta)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.shapes = {name: _shape(t) for name, t in self.tensors.items()}
        self._config: dict | None = None

    def config(self) -> dict:
        """config.json fields for the family's implementation, through the same range checks
        (a bad value is a CheckpointError naming this file and the metadata key)."""
        if self._config is None:
            config = hf_config(self.meta, self.family, self.shapes)
            cls = resolve_model_class(config)
            try:
                from_config_json(cls.args_from_config, config)
            except CheckpointError as exc:
                message = str(exc)
                keys = [f"{field} is {self.family.arch}.{key}" for field, key in self.family.fields.items()
                        if f" {field} " in message]
                raise CheckpointError(message.replace("config.json", f"{self.path} (its GGUF metadata, read as "
                                                      "config.json fields)") + (f" ({'; '.join(keys)})" if keys else "")
                                      ) from None
            self._config = config
        return dict(self._config)

    def source(self) -> GGUFSource:
        return GGUFSource(self)

    def tokenizer(self) -> Tokenizer | None:
        """The vocabulary and chat template as the engine's Tokenizer (None: the file has no vocabulary)."""
        return build_tokenizer(self.meta)


def gguf_config(path: str | os.PathLike) -> dict:
    """The HF-style config.json of a GGUF file, from its metadata alone (no tensor is read)."""
    return GGUFFile(path).config()


def _unpermute(x: torch.Tensor, heads: int, what: str) -> torch.Tensor:
    """Undo llama.cpp's q/k interleave: its row ``2i + j`` of a head is HF row ``j * hd/2 + i``."""
    rows = x.shape[0]
    if rows % (2 * heads):
        raise CheckpointError(f"{what}: {rows} rows do not split into {heads} heads of pairs. The file is damaged "
                              "or its head counts are wrong.")
    return x.reshape(heads, rows // heads // 2, 2, *x.shape[1:]).transpose(1, 2).reshape(x.shape).contiguous()


class GGUFSource(TensorSource):
    """A GGUF file's tensors under the family's HF names: floats as tensors, quantized ones as
    :class:`IntWeight` (the embedding and head, which the engine keeps in float, dequantized)."""

    def __init__(self, file: GGUFFile):
        self.file, fam = file, file.family
        file.config()                               # the metadata checked before any name is mapped
        layers = file.meta.get(f"{fam.arch}.block_count", int)
        self.names_of = name_map(fam, layers)
        self.stacked = {t.format(bid=bid) for t in fam.stacked for bid in range(layers)}
        self.total_bytes = file.path.stat().st_size
        self.label = str(file.path)
        odd = {n: t.tensor_type for n, t in file.tensors.items() if t.tensor_type not in READ_TYPES}
        if odd:
            name, kind = next(iter(odd.items()))
            raise CheckpointError(f"{file.path}: tensor {name} is {kind.name}" + (f" (and {len(odd) - 1} more)"
                                  if len(odd) > 1 else "") + ", a type this engine does not read. It reads "
                                  f"{', '.join(t.name for t in READ_TYPES)}: use a file quantized to one of them "
                                  "(Q4_K_M, Q5_K_M, Q6_K, Q8_0 or F16), or the model's safetensors release.")

    def _experts(self, tensor, shape: tuple[int, ...], kind) -> QuantizedExperts:
        """A stacked ``[E, N, K]`` quantized tensor as E per-expert IntWeights: its rows are whole
        blocks, so the E * N rows unpack as one matrix and split by expert."""
        experts, rows, cols = shape
        levels, scales, offsets, bits = unpack(tensor.data, kind, experts * rows, cols)
        split = (lambda a: [None] * experts if a is None else torch.from_numpy(a).split(rows))
        return QuantizedExperts([IntWeight(q, s, o, bits) for q, s, o in
                                 zip(split(levels), split(scales), split(offsets))])

    def names(self) -> list[str]:
        return [self.names_of.get(name, name) for name in self.file.tensors]

    def entries(self, target: str, progress: Callable[[int], None]) -> Iterator[Entry]:
        for name, tensor in self.file.tensors.items():
            hf = self.names_of.get(name, name)

            def read(tensor=tensor, hf=hf):
                return self._read(tensor, hf, target)
            yield Entry(hf, self.file.shapes[name], read, read)
            progress(int(tensor.n_bytes))

    def _read(self, tensor, hf: str, target: str) -> torch.Tensor | IntWeight | QuantizedExperts:
        shape, kind, fam = self.file.shapes[tensor.name], tensor.tensor_type, self.file.family
        heads = permuted_heads(fam, self.file.meta, hf)
        what = f"{self.file.path}: {tensor.name}"
        if kind in FLOATS:
            data = np.asarray(tensor.data)
            if kind == T.BF16:                      # the reader hands bf16 over as bytes
                data = data.view(np.int16)
            value = torch.from_numpy(np.array(data).reshape(shape))
            value = value.view(torch.bfloat16) if kind == T.BF16 else value
            value = value if heads is None else _unpermute(value, heads, what)
            return value.to(target)
        if len(shape) == 3 and hf in self.stacked:
            return self._experts(tensor, shape, kind)
        if len(shape) != 2:
            raise CheckpointError(f"{what} is a {len(shape)}-D {kind.name} tensor; this engine reads quantized "
                                  "weights of 2 dimensions only (and stacked experts of 3).")
        levels, scales, offsets, bits = unpack(tensor.data, kind, *shape)
        q, scale = torch.from_numpy(levels), torch.from_numpy(scales)
        offset = None if offsets is None else torch.from_numpy(offsets)
        if heads is not None:                       # rows carry their scales and offsets with them
            q, scale = _unpermute(q, heads, what), _unpermute(scale, heads, what)
            offset = None if offset is None else _unpermute(offset, heads, what)
        weight = IntWeight(q, scale, offset, bits)
        if hf in fam.float_only:                    # the embedding and head run in float: decoded once here
            return weight.dequantize(torch.float32).to(target)
        return weight
