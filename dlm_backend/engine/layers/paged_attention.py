"""Attention over the paged KV pool: the torch reference of the paged kernel, and the KV write.

The pool holds, per layer, ``k_cache, v_cache [num_pages, page_size, Hkv, D]`` (vLLM's layout); a
sequence owns pages through its page table (logical page i holds positions ``i*page_size ..``).
One forward's queries are packed ``q [T, Hq, D]``; sequence b's rows ``cu_q[b]:cu_q[b+1]`` sit at
the contiguous positions ``q_start[b] ..``. Their keys and values are first written into the pool
(:func:`write_kv`), then each query attends over its sequence's keys at positions ``0 .. kv_len[b]``:
all of them (``causal_block[b] == 0``, the full-sequence families' caches) or block-causally
(``causal_block[b] == L``: a query at position i sees keys at j with ``j // L <= i // L``, the
block-diffusion families).
"""

from __future__ import annotations

import torch

from dlm_backend.engine.layers.attention import sdpa


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Store k, v [T, Hkv, D] at pool slots [T] (``page * page_size + offset``)."""
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v


def gather_kv(cache: torch.Tensor, pages: torch.Tensor, length: int) -> torch.Tensor:
    """One sequence's keys (or values) at positions ``0 .. length`` from its pages: [length, Hkv, D]."""
    page_size = cache.shape[1]
    n = -(-length // page_size)
    return cache[pages[:n].long()].reshape(-1, *cache.shape[2:])[:length]


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_q: torch.Tensor,
                        q_start: torch.Tensor, kv_len: torch.Tensor, page_table: torch.Tensor,
                        causal_block: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Torch reference of the paged attention kernel (see the module docstring); returns [T, Hq, D].

    q: [T, Hq, D]; k_cache, v_cache: [P, S, Hkv, D]; cu_q: [B+1]; q_start, kv_len, causal_block: [B];
    page_table: [B, max_pages] int32 (all int tensors are read on the host here).
    """
    out = torch.empty_like(q)
    cu, starts, lens, blocks = cu_q.tolist(), q_start.tolist(), kv_len.tolist(), causal_block.tolist()
    for b in range(len(lens)):
        rows = slice(cu[b], cu[b + 1])
        keys = gather_kv(k_cache, page_table[b], lens[b]).transpose(0, 1)            # [Hkv, L, D]
        values = gather_kv(v_cache, page_table[b], lens[b]).transpose(0, 1)
        mask = None
        if blocks[b]:
            qpos = torch.arange(starts[b], starts[b] + cu[b + 1] - cu[b], device=q.device)
            kpos = torch.arange(lens[b], device=q.device)
            mask = (kpos[None, :] // blocks[b]) <= (qpos[:, None] // blocks[b])       # [q, L]
        out[rows] = sdpa(q[rows].transpose(0, 1)[None], keys[None], values[None], mask, scale)[0].transpose(0, 1)
    return out
