"""Runs the model for a batch of sequences and applies their samplers. Never schedules."""

from __future__ import annotations

import torch

from dlm_backend.engine.cache import KVCache
from dlm_backend.engine.graphs import BlockGraphs
from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context
from dlm_backend.engine.models.base import DiffusionLM
from dlm_backend.engine.samplers.base import StepInput, TokenInfo
from dlm_backend.engine.sequence import Sequence
from dlm_backend.errors import EngineError


class ModelRunner:
    """Owns the weights, the per-request KV caches and random generators, and the forward pass.

    One :meth:`step` packs every scheduled sequence's query window into a single token batch, runs
    one forward, computes logits only for the masked slots of each sequence's current block and lets
    each sequence's sampler commit tokens. On CUDA, a batch made only of dual-cache block steps of one
    shape runs as a captured CUDA graph (engine/graphs.py), and greedy threshold requests take their
    (token, confidence) from the fused unmasking kernel instead of [N, V] logits.
    """

    def __init__(self, model: DiffusionLM, device: torch.device, dtype: torch.dtype, tokens: TokenInfo,
                 triton: bool = False, cuda_graphs: bool = False):
        self.model = model
        self.device = device
        self.dtype = dtype
        self.tokens = tokens
        self.triton = triton            # kernel dispatch, decided once (kernels.resolve_kernels)
        self.caches: dict[int, KVCache] = {}
        self.generators: dict[int, torch.Generator] = {}
        # Fixed-shape dual-cache block steps as CUDA graphs (CUDA only).
        self.graphs: BlockGraphs | None = None
        if device.type == "cuda" and cuda_graphs:
            self.graphs = BlockGraphs(model, dtype, device, capture=True, triton=triton)

    @property
    def logits_shift(self) -> int:
        return self.model.logits_shift

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

    def close(self) -> None:
        """Drop the weights, caches and captured graphs (the device memory returns to torch's allocator)."""
        self.caches.clear()
        self.generators.clear()
        self.graphs = None
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _wants_stats(self, seq: Sequence) -> bool:
        """Kernel path, greedy, plain logits: the sampler can decide from fused (token, confidence)."""
        p = seq.params
        return (seq.sampler.uses_unmask_stats and p.temperature == 0 and p.cfg_scale == 0
                and p.top_p is None and p.top_k is None)

    def _forward_packed(self, seqs: list[Sequence], shift: int):
        """Pack every sequence's window into one token batch and run the model over it."""
        ids: list[int] = []
        positions: list[int] = []
        segments: list[Segment] = []
        plans = []                  # per sequence: (candidate positions, hidden rows for them, has_cfg)
        for seq in seqs:
            start, end, cached = seq.window(shift)
            candidates = seq.masked_in_block
            row0 = len(ids)
            segments.append(Segment(slice(row0, row0 + end - start), start,
                                    self._cache_for(seq) if cached else None))
            ids += seq.canvas[start:end]
            positions += range(start, end)
            rows = [row0 + p - shift - start for p in candidates]
            cfg = seq.params.cfg_scale > 0
            if cfg:  # unconditional copy: the prompt masked out (LLaDA's classifier-free guidance)
                row0 = len(ids)
                segments.append(Segment(slice(row0, row0 + end - start), start, None))
                ids += [self.tokens.mask_id] * seq.prompt_len + seq.canvas[seq.prompt_len:end]
                positions += range(start, end)
                rows += [row0 + p - shift - start for p in candidates]
            plans.append((candidates, rows, cfg))
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        with forward_context(ForwardContext(PackedAttention(segments), self.triton)):
            return self.model(input_ids, pos), plans                       # [T, D]

    def _forward_static(self, seqs: list[Sequence], shift: int, q_len: int):
        """Dual-cache block steps of equal shape: the fixed-shape (CUDA graph) forward."""
        hidden = self.graphs.forward(seqs, [self._cache_for(s) for s in seqs], shift, q_len)
        plans = []
        for i, seq in enumerate(seqs):
            candidates = seq.masked_in_block
            start = seq.block_start - shift
            plans.append((candidates, [i * q_len + p - shift - start for p in candidates], False))
        return hidden, plans

    def _gather_rows(self, seqs: list[Sequence], parts):
        """Stack the candidate rows of every forward part into one [N, D] tensor, with each sequence's
        plan re-pointed at its rows there, in ``seqs`` order."""
        chosen, by_seq, n = [], {}, 0
        for part_seqs, hidden, plans in parts:
            chosen.append(hidden[self._index([r for _, rows, _ in plans for r in rows])])
            for seq, (candidates, rows, cfg) in zip(part_seqs, plans):
                by_seq[id(seq)] = (candidates, list(range(n, n + len(rows))), cfg)
                n += len(rows)
        hidden = chosen[0] if len(chosen) == 1 else torch.cat(chosen)
        return hidden, [by_seq[id(s)] for s in seqs]

    def _index(self, rows: list[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def step(self, seqs: list[Sequence]) -> None:
        """One denoising pass for every sequence in ``seqs`` (each commits at least one token)."""
        shift = self.logits_shift
        for seq in seqs:
            seq.begin_block_if_needed()
        # Dual-cache block steps of one shape run as a fixed-shape (CUDA graph) forward; the others
        # (block starts, other cache modes) as one packed varlen forward beside it.
        static, q_len = self.graphs.split(seqs, shift) if self.graphs is not None else ([], None)
        in_static = {id(s) for s in static}
        packed = [s for s in seqs if id(s) not in in_static]
        parts = []
        if static:
            parts.append((static, *self._forward_static(static, shift, q_len)))
        if packed:
            parts.append((packed, *self._forward_packed(packed, shift)))
        hidden, plans = self._gather_rows(seqs, parts)
        # Rows of sequences whose sampler decides from fused statistics skip the [N, V] logits.
        fused = [self.triton and self._wants_stats(seq) for seq in seqs]
        logits = stats = None
        logit_rows = [r for f, (_, rows, _) in zip(fused, plans) if not f for r in rows]
        stat_rows = [r for f, (_, rows, _) in zip(fused, plans) if f for r in rows]
        with forward_context(ForwardContext(None, self.triton)):       # the final norm and head
            if logit_rows:
                in_order = logit_rows == list(range(hidden.shape[0]))    # the usual case: skip a copy
                h = hidden if in_order else hidden[self._index(logit_rows)]
                logits = self.model.compute_logits(h)                                      # [N, V]
            if stat_rows:
                stats = self.model.compute_unmask_stats(hidden[self._index(stat_rows)], self.tokens.mask_id)
        checked = [t for t in (logits, stats.prob if stats is not None else None) if t is not None]
        if any(torch.isnan(t).any() for t in checked):
            # argmax over NaN picks an arbitrary token and the request would "succeed" with garbage.
            # Raising lets the engine retry the batch request by request, so only the culprit fails.
            # The check costs one host sync just before the samplers' own, with the GPU work queued.
            raise EngineError("The model produced NaN logits. The weights or inputs overflow in "
                              f"{self.dtype}; try dtype='float32'.")

        first = {False: 0, True: 0}
        for seq, f, (candidates, rows, cfg) in zip(seqs, fused, plans):
            n, at = len(candidates), first[f]
            first[f] += len(rows)
            if f:
                commit = seq.sampler.step_from_stats(type(stats)(*(t[at:at + n] for t in stats)), seq.params)
                seq.commit([candidates[i] for i in commit.indices], commit.token_ids)
                continue
            seq_logits = logits[at:at + n]
            if cfg:
                uncond = logits[at + n:at + 2 * n]
                seq_logits = uncond + (seq.params.cfg_scale + 1) * (seq_logits - uncond)
                if not bool(torch.isfinite(seq_logits).all()):     # the check above ran before guidance
                    raise EngineError(f"Classifier-free guidance at cfg_scale={seq.params.cfg_scale} overflowed "
                                      f"{self.dtype}; lower cfg_scale.")
            commit = seq.sampler.step(StepInput(
                logits=seq_logits, positions=candidates, step=seq.step_in_block,
                block_state=seq.block_state, params=seq.params,
                generator=self._generator_for(seq), tokens=self.tokens))
            seq.commit([candidates[i] for i in commit.indices], commit.token_ids)
