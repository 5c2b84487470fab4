"""How an engine is built (model, device, dtype, execution switches) and the limits it runs under."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields

import torch

from dlm_backend.engine.kernels import MODES
from dlm_backend.engine.kv.sizing import check_kv_budget
from dlm_backend.engine.quant.methods import check_quantization
from dlm_backend.errors import DLMError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_dtype(dtype: str) -> None:
    """A DLMError for a dtype name the engine cannot load in."""
    if dtype != "auto" and dtype not in DTYPES:
        raise DLMError(f"dtype {dtype!r} is not supported; use 'auto' or one of {', '.join(DTYPES)}.")


def check_device(device: str) -> None:
    """A DLMError for a device name torch does not know or this machine does not have."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise DLMError(f"device {device!r} is not a device name; use 'cpu', 'cuda' or 'cuda:N'.") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise DLMError(f"device {device!r}: this machine has no CUDA GPU torch can use; use 'cpu' (or omit "
                       "--device for the best available).")


def default_dtype(device: torch.device) -> torch.dtype:
    # bf16 matmuls are hundreds of times slower than fp32 on CPU cores; on GPU bf16 is the native dtype.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@dataclass
class EngineLimits:
    """What one engine admits. Limits can change on a running engine (a server sets its own on the
    shared engine); each default is stated here once and every front door derives from it."""

    max_num_seqs: int = 64               # requests denoised together in one batch
    max_num_batched_tokens: int = 32768  # query rows of one forward (at least one request always runs)
    max_waiting: int = 256               # queued (not yet running) requests; beyond it requests are refused
    max_model_len: int | None = None     # prompt + max_tokens; None: the model's own context

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "max_model_len":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise DLMError(f"{f.name} must be an integer >= 1, got {value!r}.")


@dataclass
class EngineConfig:
    """What an engine is built from. ``device``/``dtype`` default to CUDA+bf16 when present, else
    CPU+fp32; ``kernels`` and ``cuda_graphs`` default to ``$DLM_KERNELS`` and ``$DLM_CUDA_GRAPHS``,
    read once here (the layers never look at the environment)."""

    model: str
    device: str | None = None
    dtype: str = "auto"
    revision: str | None = None
    kernels: str = field(default_factory=lambda: os.environ.get("DLM_KERNELS", "auto").strip().lower() or "auto")
    cuda_graphs: bool = field(default_factory=lambda: os.environ.get("DLM_CUDA_GRAPHS", "1") != "0")
    #: config.json values to replace, e.g. {"mask_token_id": 156895} for a checkpoint that lacks it
    config_overrides: dict = field(default_factory=dict)
    #: bytes of the paged KV cache shared by all requests (None: 90% of the GPU's memory left after
    #: the weights, or 1 GiB on CPU); admission waits for free pages, so this bounds memory, not speed
    kv_cache_memory: int | None = None
    #: share the keys and values of identical prompt prefixes between requests (block families);
    #: off only changes how many passes a request costs, never its tokens
    prefix_caching: bool = True
    #: devices (processes) the model is split over: column/row-parallel layers, experts partitioned,
    #: rank 0 scheduling (engine/parallel); on CPU the ranks are processes talking over gloo
    tensor_parallel_size: int = 1
    #: quantize a full-precision checkpoint's linear and expert weights as they load ("int8", "int4",
    #: "fp8": engine/quant/methods.py); None runs the checkpoint's own precision (a quantized
    #: checkpoint, GPTQ/AWQ/FP8/GGUF, always runs as published)
    quantization: str | None = None

    def __post_init__(self):
        check_dtype(self.dtype)
        check_quantization(self.quantization)
        if self.device is not None:
            check_device(self.device)
        check_kv_budget(self.kv_cache_memory)
        if not isinstance(self.config_overrides, dict):
            raise DLMError("config_overrides must be a dict of config.json fields.")
        tp = self.tensor_parallel_size
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise DLMError(f"tensor_parallel_size must be an integer >= 1 (devices to split the model over), "
                           f"got {tp!r}.")
        if self.kernels not in MODES:
            raise DLMError(f"kernels (DLM_KERNELS) {self.kernels!r} is not a kernel mode; use one of "
                           f"{', '.join(MODES)}.")

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @property
    def torch_dtype(self) -> torch.dtype:
        return default_dtype(self.torch_device) if self.dtype == "auto" else DTYPES[self.dtype]

    @property
    def key(self) -> tuple:
        """Engines are shared per key: the same weights on the same device, run the same way."""
        return (os.path.abspath(self.model) if os.path.exists(self.model) else self.model,   # a folder or a GGUF file str(self.torch_device),
                self.torch_dtype, self.revision, self.kernels, self.cuda_graphs, self.kv_cache_memory,
                self.prefix_caching, self.tensor_parallel_size, self.quantization,
                json.dumps(self.config_overrides, sort_keys=True, default=str))
