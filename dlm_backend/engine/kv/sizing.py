"""How many KV pages an engine's memory budget holds, and the pool built from it: the KV cache's
sizing lives beside the cache, and the engine's config only carries the budget."""

from __future__ import annotations

import torch

from dlm_backend.engine.kv.pool import KVPool, page_size_for
from dlm_backend.errors import DLMError

MIN_KV_BYTES = 1 << 20          # below a MiB no realistic request fits a page of every layer
CPU_KV_BYTES = 1 << 30          # torch.empty: the OS commits pages only as requests write them
GPU_KV_FRACTION = 0.9           # of the memory free after the weights, the rest for activations


def check_kv_budget(budget: int | None) -> None:
    """A DLMError for a KV budget (``kv_cache_memory``, bytes) that is not a whole number of at least
    :data:`MIN_KV_BYTES`; None (sized from the device) passes."""
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_KV_BYTES):
        raise DLMError(f"kv_cache_memory (dlm serve --kv-cache-memory) must be a number of bytes of at least "
                       f"1 MiB ({MIN_KV_BYTES}), got {budget!r}.")


def kv_pages(budget: int | None, shapes, page_size: int, dtype: torch.dtype, device: torch.device) -> int:
    """How many KV pages ``budget`` bytes hold (None: :data:`GPU_KV_FRACTION` of the free GPU memory, or
    :data:`CPU_KV_BYTES`), at least one request's worth of a small canvas; ``shapes``: each layer's
    (Hkv, head_dim) on this device (a rank's share under tensor parallelism)."""
    if budget is None:
        budget = int(torch.cuda.mem_get_info(device)[0] * GPU_KV_FRACTION) if device.type == "cuda" else CPU_KV_BYTES
    page = KVPool.page_bytes(shapes, page_size, dtype)
    return max(4, budget // page)


def make_pool(model, budget: int | None, dtype: torch.dtype, device: torch.device, tp=None) -> KVPool:
    """The KV pool for ``model`` on ``device`` within ``budget`` bytes: every rank of a tensor-parallel
    engine takes the page count the tightest rank can hold, since rank 0's page tables address every
    rank's pool."""
    page_size = page_size_for(model.args.block_size)
    pages = kv_pages(budget, model.kv_shapes, page_size, dtype, device)
    if tp is not None:
        pages = tp.min_over_ranks(pages)
    return KVPool(model.kv_shapes, page_size, pages, dtype, device)

