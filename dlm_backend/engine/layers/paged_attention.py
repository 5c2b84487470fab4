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


class PagedBatch:
    """The attention backend of one forward: paged segments (rows ``0..T_paged``, written into the
    pool, then attending over their pages) and unpaged ones after them (:class:`PackedAttention`).

    Built once per forward from host lists; the int32 tensors go to the device in one copy each, so
    the kernel path never syncs (and a CUDA graph can replay it: engine/graphs.py refills the same
    tensors in place).
    """

    def __init__(self, pool, plain, cu_q: list[int], q_start: list[int], kv_len: list[int],
                 pages: list[list[int]], blocks: list[int], device, scale: float | None = None):
        from dlm_backend.engine.layers.attention import _i32

        self.pool, self.plain, self.scale = pool, plain, scale
        self.host = (cu_q, q_start, kv_len, blocks)
        self.rows = cu_q[-1] if cu_q else 0                           # paged rows come first
        size = pool.page_size if pool is not None else 1
        width = max((len(p) for p in pages), default=1)
        slots = [p[pos // size] * size + pos % size
                 for b, p in enumerate(pages) for pos in range(q_start[b], q_start[b] + cu_q[b + 1] - cu_q[b])]
        self.slots = torch.tensor(slots, dtype=torch.long, device=device)
        self.cu_q, self.q_start, self.kv_len = _i32(cu_q, device), _i32(q_start, device), _i32(kv_len, device)
        self.page_table = _i32([p + [0] * (width - len(p)) for p in pages] or [[0]], device)
        self.causal_block = _i32(blocks, device)
        self.max_q = max((cu_q[b + 1] - cu_q[b] for b in range(len(blocks))), default=0)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        from dlm_backend.engine.layers.attention import triton_enabled

        out = self.plain.attend(q, k, v, layer) if self.plain.segments else torch.empty_like(q)
        if self.rows:
            n = self.rows
            kc, vc = self.pool.k[layer], self.pool.v[layer]
            write_kv(kc, vc, k[:n], v[:n], self.slots)
            if triton_enabled():
                from dlm_backend.engine.kernels.paged_attention import paged_attention

                out[:n] = paged_attention(q[:n], kc, vc, self.cu_q, self.q_start, self.kv_len, self.page_table,
                                          self.causal_block, self.max_q, self.scale)
            else:
                cu, starts, lens, blocks = (torch.tensor(x) for x in self.host)
                out[:n] = paged_attention_ref(q[:n], kc, vc, cu, starts, lens, self.page_table, blocks, self.scale)
        return out
