"""Weights into a model: built on the meta device, filled straight from safetensors on the target
device and dtype, every tensor accounted for (a missing, unexpected or misshapen one is an error)."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch.overrides import TorchFunctionMode
from tqdm.auto import tqdm

from dlm_backend.engine.checkpoint.folder import safetensors_files
from dlm_backend.engine.layers.parallel import Sharded
from dlm_backend.engine.layers.routers import StackedExperts
from dlm_backend.engine.models.base import DiffusionLM
from dlm_backend.engine.models.registry import from_config_json, resolve_model_class
from dlm_backend.engine.parallel.group import TPGroup, building
from dlm_backend.errors import CheckpointError, DLMError

#: Tensors some exports carry that no implementation needs: rotary tables recomputed at load, and
#: (for a tied model) a copy of the embedding saved as the head.
HARMLESS_EXTRAS = ("rotary_emb.inv_freq",)
HEADS = ("lm_head.weight", "transformer.ff_out.weight")
# Show a progress bar only when loading is slow enough to notice.
PROGRESS_MIN_BYTES = 256 * 2**20
_LAYER_INDEX = re.compile(r"\.(?:layers|blocks|h)\.(\d+)\.")


def _open(file: Path, target: str):
    try:
        return safe_open(str(file), framework="pt", device=target)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{file} is not a readable safetensors file ({exc}); a download may have stopped "
                              "part way. Re-download the checkpoint.") from None


def _check_layer_count(files: list[Path], num_layers: int, folder: Path) -> None:
    """The config's layer count against the layers the weights hold, read from the files' headers
    before anything is built (``num_hidden_layers: 10000000`` built layers for hours)."""
    indices = set()
    for file in files:
        with _open(file, "cpu") as f:
            indices.update(int(m.group(1)) for name in f.keys() if (m := _LAYER_INDEX.search(name)))
    found = max(indices) + 1 if indices else 0
    if indices and found != num_layers:
        raise CheckpointError(f"{folder}/config.json says {num_layers} layers but the weights hold {found}. The "
                              "config.json and weights disagree: fix num_hidden_layers or re-download.")


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
               tp: TPGroup | None = None) -> DiffusionLM:
    """Build the registered implementation for ``config`` and fill it from the safetensors files.

    With a tensor-parallel group ``tp``, the model is built with this rank's shapes and each sharded
    tensor is read as this rank's slice only (``get_slice``), after its full shape is checked."""
    cls = resolve_model_class(config)
    if tp is not None and tp.world > 1 and not cls.tensor_parallel:
        raise DLMError(f"{cls.__name__} does not split over devices yet: run it with tensor_parallel_size=1 "
                       f"(asked: {tp.world}).")
    files = safetensors_files(folder)
    _check_layer_count(files, from_config_json(cls.args_from_config, config).num_layers, folder)
    with _NoMetaInit(), torch.device("meta"), building(tp):
        model = from_config_json(cls.from_config, config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    # Layers holding one rank's part of a tensor (none on one device), and the partitioned experts.
    shards = {n: m for n, m in model.named_modules() if isinstance(m, Sharded) and m.tp is not None}
    experts = {n: m for n, m in model.named_modules() if isinstance(m, StackedExperts) and m.tp is not None}
    state: dict[str, torch.Tensor] = {}
    stacked: dict[str, set[int]] = {}         # stacked parameter -> indices filled so far
    shape_errors: list[str] = []
    unexpected: list[str] = []
    total = sum(f.stat().st_size for f in files)
    # Read straight onto the target device; the dtype cast then runs there too.
    target = f"cuda:{device.index or 0}" if device.type == "cuda" else str(device)
    with tqdm(total=total, unit="B", unit_scale=True, desc="Loading weights",
              disable=total < PROGRESS_MIN_BYTES) as bar:
        for file in files:
            with _open(file, target) as f:
                for name in f.keys():
                    if name.startswith(cls.ignored_prefixes):
                        continue
                    shape = tuple(f.get_slice(name).get_shape())
                    into = model.stacked_name(name) if name not in expected else None
                    if into is not None and into[0] in expected:
                        into = _local_expert(experts, expected, into, name, shape, shape_errors)
                        if into is not None:
                            _stack(state, stacked, expected, into, name, shape, f, dtype, target, shape_errors)
                        continue
                    owner, _, param = name.rpartition(".")
                    if name in expected and owner in shards:
                        full = shards[owner].full_shape(param)
                        if shape != full:
                            shape_errors.append(f"{name}: expected {list(full)}, found {list(shape)}")
                        else:
                            state[name] = shards[owner].load_shard(param, f.get_slice(name)).to(dtype)
                        continue
                    if name not in expected:
                        unexpected.append(name)
                        continue
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
    missing += [f"{n}[{i}]" for n, got in stacked.items() for i in range(expected[n][0]) if i not in got]
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


def _local_expert(experts, expected, into, name, shape, shape_errors) -> tuple[str, int] | None:
    """``into`` with the expert's index on this rank; None when another rank holds it (or it is out
    of the checkpoint's range: an error recorded). Unchanged on one device."""
    param, index = into
    module = experts.get(param.rpartition(".")[0])
    if module is None:
        return into
    total = module.mine.stop - module.mine.start
    full = total * module.tp.world
    if not 0 <= index < full:
        shape_errors.append(f"{name}: expected {list(expected[param][1:])} at index < {full}, found {list(shape)}")
        return None
    local = module.local_index(index)
    return None if local is None else (param, local)


def _stack(state, stacked, expected, into, name, shape, reader, dtype, target, shape_errors) -> None:
    """Copy one per-expert tensor into its slice of the stacked parameter (allocated on first use)."""
    param, index = into
    if shape != expected[param][1:] or not 0 <= index < expected[param][0]:
        shape_errors.append(f"{name}: expected {list(expected[param][1:])} at index < {expected[param][0]}, "
                            f"found {list(shape)}")
        return
    if param not in state:
        state[param] = torch.empty(expected[param], dtype=dtype, device=target)
        stacked[param] = set()
    state[param][index].copy_(reader.get_tensor(name))
    stacked[param].add(index)

