"""Attention over the paged KV pool: the torch reference of the paged kernel, and the KV write.

The pool holds, per layer, ``k_cache, v_cache [num_pages, page_size, Hkv, D]`` (vLLM's layout); a
sequence owns pages through its page table (logical page i holds positions ``i*page_size ..``).
One forward's queries are packed ``q [T, Hq, D]``; sequence b's rows ``cu_q[b]:cu_q[b+1]`` sit at
the contiguous positions ``q_start[b] ..``. Their keys and values are first written into the pool
(:func:`write_kv`), then each query attends over its sequence's keys at positions ``0 .. kv_len[b]``:
all of them (``causal_block[b] == 0``, the full-sequence families' caches) or block-causally
(``causal_block[b] == L``: a query at position i sees keys at j with ``j // L <= i // L``, the
block-diffusion families; ``L == 1`` is causal). A sliding-window layer also hides keys ``window``
or more positions back, from each query in a (block-)causal pass, from the first fed position in
a bidirectional one (layers/attention.py ``attention``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlm_backend.engine.layers.attention import sdpa

#: The widest head the paged kernel runs (its accumulator is [BLOCK_M, D] in registers); wider heads
#: (DiffusionGemma's 512-wide full layers) and sliding windows take the torch path.
KERNEL_HEAD_DIM = 256


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Store k, v [T, Hkv, D] at pool slots [T] (``page * page_size + offset``)."""
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v


def gather_kv(cache: torch.Tensor, pages: torch.Tensor | slice, length: int) -> torch.Tensor:
    """One sequence's keys (or values) at positions ``0 .. length``: [length, Hkv, D]. ``pages`` are its
    first ``ceil(length / page_size)`` pages, an index tensor, or a slice when they follow one another
    in the pool (the usual case: a request's own pages are allocated together), read without a copy."""
    rows = cache[pages] if isinstance(pages, slice) else cache.index_select(0, pages)
    return rows.reshape(-1, *cache.shape[2:])[:length]


def page_run(pages: list[int], length: int, page_size: int, device) -> torch.Tensor | slice:
    """The pages holding positions ``0 .. length`` as :func:`gather_kv` reads them."""
    n = -(-length // page_size)
    first = pages[0]
    if pages[n - 1] - first == n - 1 and pages[:n] == list(range(first, first + n)):
        return slice(first, first + n)
    return torch.tensor(pages[:n], dtype=torch.long, device=device)


@dataclass
class SequencePlan:
    """One sequence's part of a paged attention call: the same for every layer of a forward."""

    rows: slice
    pages: torch.Tensor | slice
    length: int
    mask: torch.Tensor | None       # [q, length - first] bool, None: every key read
    first: int = 0                  # keys before it are seen by no query (a window): never read


def plan_sequences(cu_q: list[int], q_start: list[int], kv_len: list[int], page_table: list[list[int]],
                   causal_block: list[int], page_size: int, device, window: int | None = None) -> list[SequencePlan]:
    plans = []
    for b, length in enumerate(kv_len):
        mask = None
        # A window hides every key at or before q_start - window from every query: those are not read
        # (a 1024-window layer of a 32K-token request reads 1024 + n keys, not 32K).
        first = max(0, q_start[b] - window + 1) if window is not None else 0
        qpos = torch.arange(q_start[b], q_start[b] + cu_q[b + 1] - cu_q[b], device=device)
        kpos = torch.arange(first, length, device=device)
        if causal_block[b]:
            mask = (kpos[None, :] // causal_block[b]) <= (qpos[:, None] // causal_block[b])      # [q, L]
            if window is not None:                      # see the module docstring
                mask &= kpos[None, :] > qpos[:, None] - window
        plans.append(SequencePlan(slice(cu_q[b], cu_q[b + 1]), page_run(page_table[b], length, page_size, device),
                                  length, mask, first))
    return plans


def paged_attention_plans(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plans: list[SequencePlan],
                          scale: float | None = None) -> torch.Tensor:
    """:func:`paged_attention_ref` over plans made once per forward (:func:`plan_sequences`)."""
    out = torch.empty_like(q)
    for p in plans:
        keys = gather_kv(k_cache, p.pages, p.length)[p.first:].transpose(0, 1)        # [Hkv, L, D]
        values = gather_kv(v_cache, p.pages, p.length)[p.first:].transpose(0, 1)
        out[p.rows] = sdpa(q[p.rows].transpose(0, 1)[None], keys[None], values[None], p.mask, scale)[0].transpose(0, 1)
    return out


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_q: torch.Tensor,
                        q_start: torch.Tensor, kv_len: torch.Tensor, page_table: torch.Tensor,
                        causal_block: torch.Tensor, scale: float | None = None,
                        window: int | None = None) -> torch.Tensor:
    """Torch reference of the paged attention kernel (see the module docstring); returns [T, Hq, D].

    q: [T, Hq, D]; k_cache, v_cache: [P, S, Hkv, D]; cu_q: [B+1]; q_start, kv_len, causal_block: [B];
    page_table: [B, max_pages] int32 (all int tensors are read on the host here). ``window`` is this
    reference's alone (the kernel has none).
    """
    plans = plan_sequences(cu_q.tolist(), q_start.tolist(), kv_len.tolist(), page_table.tolist(),
                           causal_block.tolist(), k_cache.shape[1], q.device, window)
    return paged_attention_plans(q, k_cache, v_cache, plans, scale)


class PagedBatch:
    """The attention backend of one forward: paged segments (rows ``0..T_paged``, written into the
    pool, then attending over their pages) and unpaged ones after them (:class:`PackedAttention`).

    Built once per forward from host lists; the int32 tensors go to the device in one copy each, so
    the kernel path never syncs (and a CUDA graph can replay it: engine/forward/cuda_graphs.py refills the same
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
        self.pages, self.plans = pages, {}

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, window: int | None = None,
               scale: float | None = None) -> torch.Tensor:
        from dlm_backend.engine.layers.attention import triton_enabled

        scale = self.scale if scale is None else scale
        out = self.plain.attend(q, k, v, layer, window, scale) if self.plain.segments else torch.empty_like(q)
        if self.rows:
            n = self.rows
            kc, vc = self.pool.k[layer], self.pool.v[layer]
            write_kv(kc, vc, k[:n], v[:n], self.slots)
            if triton_enabled() and window is None and q.shape[-1] <= KERNEL_HEAD_DIM:
                from dlm_backend.engine.kernels.paged_attention import paged_attention

                out[:n] = paged_attention(q[:n], kc, vc, self.cu_q, self.q_start, self.kv_len, self.page_table,
                                          self.causal_block, self.max_q, scale)
            else:
                if window not in self.plans:           # the same for every layer of a window: made at the first
                    cu, starts, lens, blocks = self.host
                    self.plans[window] = plan_sequences(cu, starts, lens, self.pages, blocks, kc.shape[1], q.device,
                                                        window)
                out[:n] = paged_attention_plans(q[:n], kc, vc, self.plans[window], scale)
        return out
