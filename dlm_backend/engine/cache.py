"""Per-request KV cache for Fast-dLLM's prefix and dual caching.

At the start of every block the runner recomputes the whole canvas and writes every position's
rotated keys/values here. Between block starts:

* ``prefix``: the query window is ``[block_start, end)``; attention reads the cached prompt and
  finished blocks and the freshly written rest.
* ``dual``: the window is the current block only; positions after it are read from the cache too
  (stale until the next block start, exactly as in Fast-dLLM's ``generate_with_dual_cache``).

Both are the same operation here: write the window's new K/V at its positions, attend over all
``L`` cached positions. Caching rotated keys equals LLaDA's re-rotation of raw keys (same op).
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of one canvas: ``[layers, Hkv, L, D]`` each."""

    def __init__(self, num_layers: int, num_kv_heads: int, length: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, num_kv_heads, length, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def length(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Store k/v ([Hkv, q, D]) at positions ``start..start+q``; return the layer's full K, V."""
        end = start + k.shape[1]
        self.k[layer, :, start:end] = k
        self.v[layer, :, start:end] = v
        return self.k[layer], self.v[layer]
