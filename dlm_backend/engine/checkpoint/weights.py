"""Weights into a model: built on the meta device, filled straight from the checkpoint's tensors on
the target device and dtype (checkpoint/placement.py puts each one in its place), quantized as
they are read when asked."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from tqdm.auto import tqdm

from dlm_backend.engine.checkpoint.folder import is_gguf
from dlm_backend.engine.checkpoint.placement import Placement
from dlm_backend.engine.checkpoint.sources import SafetensorsSource, TensorSource
from dlm_backend.engine.models.base import DiffusionLM
from dlm_backend.engine.models.registry import from_config_json, resolve_model_class
from dlm_backend.engine.parallel.group import TPGroup, building
from dlm_backend.engine.quant.formats import checkpoint_format
from dlm_backend.errors import CheckpointError, DLMError

# Show a progress bar only when loading is slow enough to notice.
PROGRESS_MIN_BYTES = 256 * 2**20


class _NoMetaInit(TorchFunctionMode):
    """Skip ``torch.nn.init`` on meta tensors while a model is built (the weights replace them).

    On the meta device torch runs those initialisers through its Python references, whose first use
    imports ``torch._dynamo``: over a second of a first load, and, in a worker thread, event-loop
    stalls of 100-250 ms while that import holds the GIL. A mode is per thread, so other threads'
    initialisers are untouched.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensor = args[0] if args else kwargs.get("tensor")
        if getattr(func, "__module__", None) == "torch.nn.init" and isinstance(tensor, torch.Tensor) and tensor.is_meta:
            return tensor
        return func(*args, **kwargs)


def load_model(folder: Path, config: dict, device: torch.device, dtype: torch.dtype,
               tp: TPGroup | None = None, quantization: str | None = None,
               source: TensorSource | None = None) -> DiffusionLM:
    """Build the registered implementation for ``config`` and fill it from the checkpoint's tensors
    (``source``: the folder's safetensors, read by the format its ``quantization_config`` names).

    With a tensor-parallel group ``tp``, the model is built with this rank's shapes and each sharded
    tensor is read as this rank's slice only (``get_slice``), after its full shape is checked.
    ``quantization`` ("int8", "int4", "fp8") quantizes each full-precision weight a layer lets be
    quantized as it is read, so the float model is never whole in memory."""
    cls = resolve_model_class(config)
    if tp is not None and tp.world > 1 and not cls.tensor_parallel:
        raise DLMError(f"{cls.__name__} does not split over devices yet: run it with tensor_parallel_size=1 "
                       f"(asked: {tp.world}).")
    where = f"{folder}'s metadata" if is_gguf(folder) else f"{folder}/config.json"
    fmt = checkpoint_format(config, where) if source is None else None
    if fmt is not None and quantization is not None:
        raise CheckpointError(f"{folder} is already quantized ({fmt.method}); load it without quantization= "
                              f"(asked: {quantization!r}).")
    source = source or SafetensorsSource(folder, fmt)
    num_layers = from_config_json(cls.args_from_config, config).num_layers
    found = source.layer_count()    # before anything is built: num_hidden_layers 10**7 built layers for hours
    if found is not None and found != num_layers:
        raise CheckpointError(f"{where} says {num_layers} layers but the weights hold {found}. The config and "
                              "weights disagree: fix num_hidden_layers or re-download.")
    with _NoMetaInit(), torch.device("meta"), building(tp):
        model = from_config_json(cls.from_config, config)
    # Read straight onto the target device; the dtype cast then runs there too.
    target = f"cuda:{device.index or 0}" if device.type == "cuda" else str(device)
    placed = Placement(model, dtype, target, quantization)
    with tqdm(total=source.total_bytes, unit="B", unit_scale=True, desc="Loading weights",
              disable=source.total_bytes < PROGRESS_MIN_BYTES) as bar:
        for entry in source.entries(target, bar.update):
            if not entry.name.startswith(cls.ignored_prefixes):
                placed.add(entry)
    placed.check(folder, cls.__name__, model.args.tie_word_embeddings)          # as the family read its config
    placed.finish(device)
    model.setup(device)
    return model.eval().requires_grad_(False)
