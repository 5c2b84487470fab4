"""Static-shape dual-cache block steps, replayed as CUDA graphs.

Between block starts a dual-cache sequence feeds exactly its current block (plus one row for a
shifted model) and reads every other position from its cache, so a batch of such sequences has a
fixed shape: ``bucket`` sequences x ``q_len`` rows over caches of ``cache_len`` positions. One
:class:`StaticBlockStep` per (bucket, q_len, cache_len) holds static input buffers (ids, positions,
valid key counts), a K/V pool ``[layers, bucket, Hkv, cache_len, D]`` and the output hidden states;
on CUDA its forward is captured once into a ``torch.cuda.CUDAGraph`` and replayed every pass.

The pool slot of a sequence is filled from its own KV cache once per block (the block start
rewrote that cache); afterwards each pass writes the block's new K/V into the pool inside the
graph. The per-sequence cache is not updated by these passes, and needs not be: the next block
start recomputes every position. Padding slots attend over their own dummy keys; their rows are
never read. The same step runs eagerly on CPU (``capture=False``) so tests can compare it with the
varlen path.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.layers import ForwardContext, forward_context
from dlm_backend.engine.layers.attention import padded_attention

BUCKETS = (1, 2, 4, 8, 16, 32)
CACHE_ROUND = 256            # cache lengths are rounded up so nearby lengths share one graph


def bucket_for(n: int) -> int | None:
    """Smallest batch bucket holding ``n`` sequences (None when too many)."""
    return next((b for b in BUCKETS if b >= n), None)


class StaticBlockStep:
    """Fixed-shape buffers (and optionally a CUDA graph) for one (bucket, q_len, cache_len)."""

    def __init__(self, model, bucket: int, q_len: int, cache_len: int, dtype: torch.dtype,
                 device: torch.device, triton: bool):
        a = model.args
        self.model, self.bucket, self.q_len, self.triton = model, bucket, q_len, triton
        rows = bucket * q_len
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)                 # [B*M]
        self.pos = torch.zeros(rows, dtype=torch.long, device=device)                 # [B*M]
        self.k_len = torch.full((bucket,), q_len, dtype=torch.int32, device=device)  # [B]
        shape = (a.num_layers, bucket, a.num_kv_heads, cache_len, a.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)                       # [layers, B, Hkv, L, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.cu_q = torch.arange(0, rows + 1, q_len, dtype=torch.int32, device=device)
        self.k_start = torch.zeros(bucket, dtype=torch.int32, device=device)
        self.slot_rows = torch.arange(bucket, device=device)[:, None].expand(bucket, q_len)
        self.owner: list[tuple[int, int] | None] = [None] * bucket   # (seq_id, block_index) per slot
        self.hidden: torch.Tensor | None = None                      # [B*M, D] output
        self.graph = None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        """Attention for the static batch (called from layers.attention): write the block's K/V into
        the pool at its positions, then attend over each slot's first ``k_len`` keys."""
        B, M = self.bucket, self.q_len
        kp, vp = self.k[layer], self.v[layer]                                         # [B, Hkv, L, D]
        p = self.pos.view(B, M)
        kp[self.slot_rows, :, p] = k.view(B, M, k.shape[1], k.shape[2])               # no host sync
        vp[self.slot_rows, :, p] = v.view(B, M, v.shape[1], v.shape[2])
        if self.triton:
            from dlm_backend.engine.kernels.attention import attention as flash

            return flash(q, kp, vp, self.cu_q, self.k_start, self.k_len, M)
        return padded_attention(q.view(B, M, q.shape[1], q.shape[2]), kp, vp, self.k_len).reshape(q.shape)

    def _forward(self) -> torch.Tensor:
        with forward_context(ForwardContext(self, self.triton)):
            return self.model(self.ids, self.pos)

    def load(self, seqs, caches, shift: int) -> None:
        """Copy this pass's inputs into the static buffers (and a cache into a slot once per block)."""
        B, M = self.bucket, self.q_len
        ids = torch.zeros(B * M, dtype=torch.long)
        pos = torch.arange(B * M, dtype=torch.long) % M          # padding slots: positions 0..M-1
        k_len = torch.full((B,), M, dtype=torch.int32)
        for i, (seq, cache) in enumerate(zip(seqs, caches)):
            start = seq.block_start - shift
            ids[i * M:(i + 1) * M] = torch.tensor(seq.canvas[start:start + M])
            pos[i * M:(i + 1) * M] = torch.arange(start, start + M)
            k_len[i] = seq.length
            key = (seq.seq_id, seq.block_index)
            if self.owner[i] != key:
                self.k[:, i, :, :seq.length] = cache.k
                self.v[:, i, :, :seq.length] = cache.v
                self.owner[i] = key
        for i in range(len(seqs), B):
            self.owner[i] = None
        self.ids.copy_(ids, non_blocking=True)
        self.pos.copy_(pos, non_blocking=True)
        self.k_len.copy_(k_len, non_blocking=True)

    def run(self) -> torch.Tensor:
        """One forward over the static buffers: replay the graph if captured, else eagerly."""
        if self.graph is not None:
            self.graph.replay()
            return self.hidden
        return self._forward()

    def capture(self, pool=None) -> None:
        """Record the forward into a CUDA graph (warm-up on a side stream first, as torch requires)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.hidden = self._forward()


class BlockGraphs:
    """Chooses, builds and runs :class:`StaticBlockStep`s for batches that fit them."""

    def __init__(self, model, dtype: torch.dtype, device: torch.device, capture: bool, triton: bool):
        self.model, self.dtype, self.device, self.capture, self.triton = model, dtype, device, capture, triton
        self.steps: dict[tuple[int, int, int], StaticBlockStep] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    @staticmethod
    def window_len(seq, shift: int) -> int | None:
        """The fixed window length of a dual-cache block step, or None if ``seq`` is not in one."""
        p = seq.params
        if p.cache != "dual" or seq.step_in_block == 0 or p.cfg_scale > 0 or seq.block_start - shift < 0:
            return None
        return seq.block_end - seq.block_start + shift

    def split(self, seqs, shift: int) -> tuple[list, int | None]:
        """The largest group of ``seqs`` sharing one block-step shape (at most the largest bucket) and
        its window length; the rest (block starts, other modes) take the varlen path."""
        groups: dict[int, list] = {}
        for seq in seqs:
            q_len = self.window_len(seq, shift)
            if q_len is not None:
                groups.setdefault(q_len, []).append(seq)
        if not groups:
            return [], None
        q_len, group = max(groups.items(), key=lambda kv: len(kv[1]))
        return group[:BUCKETS[-1]], q_len

    def forward(self, seqs, caches, shift: int, q_len: int) -> torch.Tensor:
        """Hidden states ``[bucket * q_len, D]``; sequence i owns rows ``i*q_len .. (i+1)*q_len``."""
        cache_len = -(-max(s.length for s in seqs) // CACHE_ROUND) * CACHE_ROUND
        key = (bucket_for(len(seqs)), q_len, cache_len)
        step = self.steps.get(key)
        if step is None:
            step = self.steps[key] = StaticBlockStep(self.model, key[0], q_len, cache_len, self.dtype, self.device,
                                                            self.triton)
            step.load(seqs, caches, shift)
            if self.capture:
                step.capture(self.pool)
        step.load(seqs, caches, shift)
        return step.run()
