"""Fixed-shape denoising steps over the paged KV pool, replayed as CUDA graphs.

Between block starts most passes have one shape: a dual-cache LLaDA/Dream step feeds its current
block (plus one row for a shifted model), a block-diffusion denoise step its block, each attending
to its own pages. A batch of such passes is ``bucket`` sequences x ``q_len`` rows; one
:class:`StaticStep` per (bucket, q_len, page-table width) holds static input buffers (ids,
positions, pool slots, page tables, key counts, block sizes) and the output hidden states, and on
CUDA its forward is captured once into a ``torch.cuda.CUDAGraph`` and replayed every pass: the keys
and values go straight into the shared pool, nothing is copied per request. Padding rows write to
and read from the pool's scratch page; their outputs are never read. The same step runs eagerly
on CPU (``capture=False``) so tests compare it with the packed path.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.layers import ForwardContext, forward_context
from dlm_backend.engine.layers.paged_attention import paged_attention_ref, write_kv

BUCKETS = (1, 2, 4, 8, 16, 32)


def bucket_for(n: int) -> int | None:
    """Smallest batch bucket holding ``n`` sequences (None when too many)."""
    return next((b for b in BUCKETS if b >= n), None)


class StaticStep:
    """Static buffers (and optionally a CUDA graph) for one (bucket, q_len, page-table width)."""

    def __init__(self, model, pool, bucket: int, q_len: int, width: int, device: torch.device, triton: bool):
        self.model, self.pool, self.bucket, self.q_len, self.triton = model, pool, bucket, q_len, triton
        rows, i32 = bucket * q_len, dict(dtype=torch.int32, device=device)
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)               # [B*M]
        self.pos = torch.zeros(rows, dtype=torch.long, device=device)               # [B*M]
        self.slots = torch.zeros(rows, dtype=torch.long, device=device)             # [B*M] pool slots
        self.cu_q = torch.arange(0, rows + 1, q_len, **i32)                          # [B+1]
        self.q_start = torch.zeros(bucket, **i32)                                   # [B]
        self.kv_len = torch.full((bucket,), q_len, **i32)                           # [B]
        self.page_table = torch.full((bucket, width), pool.scratch, **i32)         # [B, W]
        self.causal_block = torch.zeros(bucket, **i32)                              # [B]
        self.hidden: torch.Tensor | None = None                                     # [B*M, D] output
        self.graph = None

    @property
    def rows(self) -> int:
        return self.bucket * self.q_len

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, window: int | None = None,
               scale: float | None = None) -> torch.Tensor:
        kc, vc = self.pool.k[layer], self.pool.v[layer]
        write_kv(kc, vc, k, v, self.slots)                                          # no host sync
        if self.triton and window is None:
            from dlm_backend.engine.kernels.paged_attention import paged_attention

            return paged_attention(q, kc, vc, self.cu_q, self.q_start, self.kv_len, self.page_table,
                                   self.causal_block, self.q_len, scale)
        return paged_attention_ref(q, kc, vc, self.cu_q, self.q_start, self.kv_len, self.page_table,
                                   self.causal_block, scale, window)

    def _forward(self) -> torch.Tensor:
        with forward_context(ForwardContext(self, self.triton)):
            return self.model(self.ids, self.pos)

    def load(self, seqs, steps) -> None:
        """Copy this pass's inputs into the static buffers (padding slots: the scratch page)."""
        B, M, S = self.bucket, self.q_len, self.pool.page_size
        scratch = self.pool.scratch
        ids = torch.zeros(B * M, dtype=torch.long)
        pos = torch.arange(B * M, dtype=torch.long) % M
        slots = scratch * S + pos % S
        q_start, kv_len = torch.zeros(B, dtype=torch.int32), torch.full((B,), M, dtype=torch.int32)
        table = torch.full(tuple(self.page_table.shape), scratch, dtype=torch.int32)
        blocks = torch.zeros(B, dtype=torch.int32)
        for i, (seq, step) in enumerate(zip(seqs, steps)):
            rows = slice(i * M, (i + 1) * M)
            ids[rows] = torch.tensor(seq.canvas[step.start:step.end])
            pos[rows] = torch.arange(step.start, step.end)
            slots[rows] = torch.tensor([seq.pages[p // S] * S + p % S for p in range(step.start, step.end)])
            q_start[i], kv_len[i], blocks[i] = step.start, step.kv_end, step.block_size or 0
            table[i, :len(seq.pages)] = torch.tensor(seq.pages, dtype=torch.int32)
        for dst, src in ((self.ids, ids), (self.pos, pos), (self.slots, slots), (self.q_start, q_start),
                         (self.kv_len, kv_len), (self.page_table, table), (self.causal_block, blocks)):
            dst.copy_(src, non_blocking=True)

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
    """Chooses, builds and runs :class:`StaticStep`s for the passes that fit them."""

    def __init__(self, model, pool, device: torch.device, capture: bool, triton: bool = True):
        self.model, self.pool, self.device, self.capture, self.triton = model, pool, device, capture, triton
        self.steps: dict[tuple[int, int, int], StaticStep] = {}
        self.mempool = torch.cuda.graph_pool_handle() if capture else None

    @staticmethod
    def fits(step) -> bool:
        return step.paged and step.kind == "denoise" and not step.cfg and step.order is None

    def split(self, seqs, steps) -> list[int]:
        """Indices of the largest group of paged denoise passes sharing one length (at most the largest
        bucket); the rest (block starts, cache passes, other lengths) take the packed path."""
        groups: dict[int, list[int]] = {}
        for i, step in enumerate(steps):
            if self.fits(step):
                groups.setdefault(step.end - step.start, []).append(i)
        if not groups:
            return []
        return max(groups.values(), key=len)[:BUCKETS[-1]]

    def forward(self, seqs, steps, shift: int) -> tuple[torch.Tensor, list[list[int]]]:
        """Hidden states ``[bucket * q_len, D]`` and each sequence's candidate rows in them."""
        q_len = steps[0].end - steps[0].start
        width = max(len(s.pages) for s in seqs)
        width = 1 << (width - 1).bit_length()           # nearby table widths share one graph
        key = (bucket_for(len(seqs)), q_len, width)
        static = self.steps.get(key)
        if static is None:
            static = self.steps[key] = StaticStep(self.model, self.pool, key[0], q_len, width, self.device,
                                                  self.triton)
            static.load(seqs, steps)
            if self.capture:
                static.capture(self.mempool)
        static.load(seqs, steps)
        rows = [st.rows(i * q_len, shift) for i, st in enumerate(steps)]
        return static.run(), rows
