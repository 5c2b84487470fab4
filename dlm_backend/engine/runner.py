"""Runs the model for a batch of sequences and applies their samplers. Never schedules."""

from __future__ import annotations

import torch

from dlm_backend.engine.cache import KVCache
from dlm_backend.engine.layers import AttentionContext, Segment, attention_context
from dlm_backend.engine.models.base import DiffusionLM
from dlm_backend.engine.samplers.base import StepInput, TokenInfo
from dlm_backend.engine.sequence import Sequence


class ModelRunner:
    """Owns the weights, the per-request KV caches and random generators, and the forward pass.

    One :meth:`step` packs every scheduled sequence's query window into a single token batch, runs
    one forward, computes logits only for the masked slots of each sequence's current block and lets
    each sequence's sampler commit tokens.
    """

    def __init__(self, model: DiffusionLM, device: torch.device, dtype: torch.dtype, tokens: TokenInfo):
        self.model = model
        self.device = device
        self.dtype = dtype
        self.tokens = tokens
        self.caches: dict[int, KVCache] = {}
        self.generators: dict[int, torch.Generator] = {}

    @property
    def logits_shift(self) -> int:
        return self.model.logits_shift

    @property
    def cache_bytes(self) -> int:
        return sum(c.nbytes for c in self.caches.values())

    def _cache_for(self, seq: Sequence) -> KVCache:
        cache = self.caches.get(seq.seq_id)
        if cache is None:
            a = self.model.args
            cache = KVCache(a.num_layers, a.num_kv_heads, seq.length, a.head_dim, self.dtype, self.device)
            self.caches[seq.seq_id] = cache
        return cache

    def _generator_for(self, seq: Sequence) -> torch.Generator:
        gen = self.generators.get(seq.seq_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            seed = seq.params.seed
            gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
            self.generators[seq.seq_id] = gen
        return gen

    def free(self, seq: Sequence) -> None:
        self.caches.pop(seq.seq_id, None)
        self.generators.pop(seq.seq_id, None)

    @torch.inference_mode()
    def step(self, seqs: list[Sequence]) -> None:
        """One denoising pass for every sequence in ``seqs`` (each commits at least one token)."""
        shift = self.logits_shift
        ids: list[int] = []
        positions: list[int] = []
        segments: list[Segment] = []
        rows: list[int] = []        # hidden rows whose logits the samplers need
        plans = []                  # per sequence: (candidate positions, logits rows slice, has_cfg)
        for seq in seqs:
            seq.begin_block_if_needed()
            start, end, cached = seq.window(shift)
            candidates = seq.masked_in_block
            row0 = len(ids)
            segments.append(Segment(slice(row0, row0 + end - start), start,
                                    self._cache_for(seq) if cached else None))
            ids += seq.canvas[start:end]
            positions += range(start, end)
            first = len(rows)
            rows += [row0 + p - shift - start for p in candidates]
            cfg = seq.params.cfg_scale > 0
            if cfg:  # unconditional copy: the prompt masked out (LLaDA's classifier-free guidance)
                row0 = len(ids)
                segments.append(Segment(slice(row0, row0 + end - start), start, None))
                ids += [self.tokens.mask_id] * seq.prompt_len + seq.canvas[seq.prompt_len:end]
                positions += range(start, end)
                rows += [row0 + p - shift - start for p in candidates]
            plans.append((candidates, first, cfg))

        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        with attention_context(AttentionContext(segments)):
            hidden = self.model(input_ids, pos)                             # [T, D]
        logits = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])  # [N, V]

        for seq, (candidates, first, cfg) in zip(seqs, plans):
            n = len(candidates)
            seq_logits = logits[first:first + n]
            if cfg:
                uncond = logits[first + n:first + 2 * n]
                seq_logits = uncond + (seq.params.cfg_scale + 1) * (seq_logits - uncond)
            commit = seq.sampler.step(StepInput(
                logits=seq_logits, positions=candidates, step=seq.step_in_block,
                block_state=seq.block_state, params=seq.params,
                generator=self._generator_for(seq), tokens=self.tokens))
            seq.commit([candidates[i] for i in commit.indices], commit.token_ids)
