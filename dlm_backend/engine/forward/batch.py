"""One forward's inputs as host values: what the runner packs from the scheduled passes, and what a
tensor-parallel engine's rank 0 broadcasts so every rank runs the same forward (workers never see a
request, only this)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dlm_backend.engine.layers import DecoderRows, PackedAttention, Segment
from dlm_backend.engine.layers.paged_attention import PagedBatch
from dlm_backend.engine.requests.sequence import Pass, Sequence


@dataclass
class ForwardBatch:
    """Token rows of one packed forward (paged passes first) and the rows the head reads.

    ``cu``/``starts``/``lens``/``pages``/``blocks`` describe the paged passes (layers/paged_attention.py
    ``PagedBatch``), ``plain`` the unpaged segments as ``(row0, row1, pos_start, block_size)``.
    ``logit_rows`` get ``[N, V]`` logits, ``stat_rows`` the fused greedy statistics (``exclude_id``:
    the mask id, never chosen).
    """

    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    cu: list[int] = field(default_factory=lambda: [0])
    starts: list[int] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    pages: list[list[int]] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    plain: list[tuple[int, int, int, int | None]] = field(default_factory=list)
    decoder_rows: list[int] = field(default_factory=list)
    #: per decoder pass: its row count and its self-conditioning input [n, D] (None: zeros)
    conditioning: list = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)
    stat_rows: list[int] = field(default_factory=list)
    exclude_id: int = -1

    def add(self, seq: Sequence, step: Pass, shift: int, mask_id: int) -> list[int]:
        """Append one pass (and its unconditional copy with ``cfg``); returns the rows holding its
        candidates' predictions (conditional ones first)."""
        row0, n = len(self.ids), step.end - step.start
        fed = step.fed
        self.ids += [seq.canvas[p] for p in fed]
        self.positions += fed
        rows = step.rows(row0, shift)
        if step.decoder:
            self.decoder_rows += range(row0, row0 + n)
            self.conditioning.append((n, step.conditioning))
        if step.paged:
            self.cu.append(self.cu[-1] + n)
            self.starts.append(step.start)
            self.lens.append(step.kv_end)
            self.pages.append(seq.pages)
            self.blocks.append(step.block_size or 0)
        else:
            self.plain.append((row0, row0 + n, step.start, step.block_size))
        if step.cfg:            # unconditional copy: the prompt masked out (LLaDA's classifier-free guidance)
            row1 = len(self.ids)
            self.plain.append((row1, row1 + n, step.start, step.block_size))
            self.ids += [mask_id] * seq.prompt_len + seq.canvas[seq.prompt_len:step.end]
            self.positions += range(step.start, step.end)
            rows += step.rows(row1, shift)
        return rows

    def tensors(self, pool, device: torch.device, hidden_size: int, dtype: torch.dtype):
        """``(input_ids [T], positions [T], attention backend, decoder rows or None)`` on ``device``."""
        plain = PackedAttention([Segment(slice(a, b), s, L) for a, b, s, L in self.plain])
        backend = PagedBatch(pool, plain, self.cu, self.starts, self.lens, self.pages, self.blocks, device)
        decoder = None
        if self.decoder_rows:
            cond = [c if c is not None else torch.zeros(n, hidden_size, dtype=dtype, device=device)
                    for n, c in self.conditioning]
            decoder = DecoderRows(torch.tensor(self.decoder_rows, dtype=torch.long, device=device), torch.cat(cond))
        ids = torch.tensor(self.ids, dtype=torch.long, device=device)
        return ids, torch.tensor(self.positions, dtype=torch.long, device=device), backend, decoder
