"""Runs the model for a batch of sequences and applies their samplers. Never schedules."""

from __future__ import annotations

import torch

from dlm_backend.engine.graphs import BlockGraphs
from dlm_backend.engine.kv import KVPool
from dlm_backend.engine.layers import DecoderRows, ForwardContext, PackedAttention, Segment, forward_context
from dlm_backend.engine.layers.paged_attention import PagedBatch
from dlm_backend.engine.models.base import DiffusionLM
from dlm_backend.engine.samplers.base import StepInput, TokenInfo
from dlm_backend.engine.samplers.random import TorchRandom
from dlm_backend.engine.sequence import Pass, Sequence
from dlm_backend.errors import EngineError


class ModelRunner:
    """Owns the weights, the KV pool and the forward pass.

    One :meth:`step` asks each scheduled sequence for its next :class:`Pass`, packs every pass's
    positions into a single token batch (paged passes first: their keys and values go into the pool
    and their attention reads the pool; then unpaged ones), runs one forward, computes logits only
    for each pass's candidate slots and lets each sequence's sampler decide. On CUDA, a batch of
    paged passes of one shape runs as a captured CUDA graph (engine/graphs.py), and greedy threshold
    requests take their (token, confidence) from the fused unmasking kernel instead of [N, V] logits.
    """

    def __init__(self, model: DiffusionLM, device: torch.device, dtype: torch.dtype, tokens: TokenInfo,
                 pool: KVPool | None, triton: bool = False, cuda_graphs: bool = False):
        self.model, self.device, self.dtype, self.tokens = model, device, dtype, tokens
        self.pool = pool
        self.triton = triton            # kernel dispatch, decided once (kernels.resolve_kernels)
        self.graphs: BlockGraphs | None = None
        # The static step feeds ids and positions alone: a decoder pass's self-conditioning is not captured.
        if device.type == "cuda" and cuda_graphs and triton and pool is not None and model.noise == "mask":
            self.graphs = BlockGraphs(model, pool, device, capture=True)

    @property
    def logits_shift(self) -> int:
        return self.model.logits_shift

    def _random_for(self, seq: Sequence):
        """The request's draws: a generator on this device seeded once (from ``seed``, else at
        random), kept on the sequence (a replayed run brings its own). Made before a step plans its
        passes: a uniform-noise canvas draws its first tokens when its first pass is planned."""
        if seq.random is None:
            gen = torch.Generator(device=self.device)
            seed = seq.params.seed
            gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
            seq.random = TorchRandom(gen)
        return seq.random

    def close(self) -> None:
        """Drop the weights, the KV pool and captured graphs (the memory returns to torch's allocator)."""
        self.graphs = self.pool = self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _wants_stats(self, seq: Sequence, step: Pass) -> bool:
        """Kernel path, greedy, plain logits: the sampler can decide from fused (token, confidence)."""
        p = seq.params
        return (self.triton and step.kind == "denoise" and seq.sampler.uses_unmask_stats and not step.cfg
                and p.temperature == 0 and p.top_p is None and p.top_k is None)

    # -- the forward ---------------------------------------------------------------------------------

    def _forward(self, seqs: list[Sequence], steps: list[Pass], shift: int):
        """Pack the passes (paged first) into one token batch and run the model; returns the hidden
        states and, per sequence, the rows holding its candidates' predictions."""
        order = sorted(range(len(seqs)), key=lambda i: not steps[i].paged)
        ids: list[int] = []
        positions: list[int] = []
        rows: dict[int, list[int]] = {}
        cu, starts, lens, pages, blocks, plain = [0], [], [], [], [], []
        decoder_rows, conditioning = [], []
        for i in order:
            seq, step = seqs[i], steps[i]
            row0, n = len(ids), step.end - step.start
            ids += seq.canvas[step.start:step.end]
            positions += range(step.start, step.end)
            rows[i] = [row0 + max(p - shift - step.start, 0) for p in step.candidates]
            if step.decoder:
                decoder_rows += range(row0, row0 + n)
                conditioning.append(step.conditioning if step.conditioning is not None else
                                    torch.zeros(n, self.model.args.hidden_size, dtype=self.dtype, device=self.device))
            if step.paged:
                cu.append(cu[-1] + n)
                starts.append(step.start)
                lens.append(step.kv_end)
                pages.append(seq.pages)
                blocks.append(step.block_size or 0)
            else:
                plain.append(Segment(slice(row0, row0 + n), step.start, step.block_size))
            if step.cfg:            # unconditional copy: the prompt masked out (LLaDA's classifier-free guidance)
                row1 = len(ids)
                plain.append(Segment(slice(row1, row1 + n), step.start, step.block_size))
                ids += [self.tokens.mask_id] * seq.prompt_len + seq.canvas[seq.prompt_len:step.end]
                positions += range(step.start, step.end)
                rows[i] += [row1 + max(p - shift - step.start, 0) for p in step.candidates]
        backend = PagedBatch(self.pool, PackedAttention(plain), cu, starts, lens, pages, blocks, self.device)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        decoder = DecoderRows(self._index(decoder_rows), torch.cat(conditioning)) if decoder_rows else None
        with forward_context(ForwardContext(backend, self.triton, decoder)):
            return self.model(input_ids, pos), [rows[i] for i in range(len(seqs))]          # [T, D]

    def _index(self, rows: list[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    # -- one step ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, seqs: list[Sequence]) -> None:
        """One forward for every sequence in ``seqs``: each commits at least one token, or caches keys."""
        shift = self.logits_shift
        for seq in seqs:
            self._random_for(seq)
        steps = [seq.plan(shift) for seq in seqs]
        static = self.graphs.split(seqs, steps) if self.graphs is not None else []
        if static:
            hidden_s, rows_s = self.graphs.forward([seqs[i] for i in static], [steps[i] for i in static], shift)
        rest = [i for i in range(len(seqs)) if i not in set(static)]
        if rest:
            hidden_r, rows_r = self._forward([seqs[i] for i in rest], [steps[i] for i in rest], shift)
        # One [N, D] tensor of every candidate row, each sequence's rows re-pointed into it.
        parts, plans, n = [], [None] * len(seqs), 0
        for group, hidden, group_rows in ((static, hidden_s if static else None, rows_s if static else None),
                                          (rest, hidden_r if rest else None, rows_r if rest else None)):
            if not group:
                continue
            flat = [r for rr in group_rows for r in rr]
            parts.append(hidden[self._index(flat)])
            for i, rr in zip(group, group_rows):
                plans[i] = list(range(n, n + len(rr)))
                n += len(rr)
        hidden = parts[0] if len(parts) == 1 else torch.cat(parts) if parts else None
        fused = [self._wants_stats(seq, st) for seq, st in zip(seqs, steps)]
        logits = stats = None
        logit_rows = [r for f, rr in zip(fused, plans) if not f for r in rr]
        stat_rows = [r for f, rr in zip(fused, plans) if f for r in rr]
        with forward_context(ForwardContext(None, self.triton)):       # the final norm and head
            if logit_rows:
                h = hidden if logit_rows == list(range(hidden.shape[0])) else hidden[self._index(logit_rows)]
                logits = self.model.compute_logits(h)                                      # [N, V]
            if stat_rows:
                stats = self.model.compute_unmask_stats(hidden[self._index(stat_rows)], self.tokens.mask_id)
        checked = [t for t in (logits, stats.prob if stats is not None else None) if t is not None]
        if any(torch.isnan(t).any() for t in checked):
            # argmax over NaN picks an arbitrary token and the request would "succeed" with garbage.
            # Raising lets the engine retry the batch request by request, so only the culprit fails.
            raise EngineError("The model produced NaN logits. The weights or inputs overflow in "
                              f"{self.dtype}; try dtype='float32'.")
        first = {False: 0, True: 0}
        for seq, step, f in zip(seqs, steps, fused):
            n = len(step.candidates)
            at = first[f]
            first[f] += n * (2 if step.cfg else 1)
            if f:
                part = type(stats)(*(t[at:at + n] for t in stats))
                seq.apply(step, seq.sampler.step_from_stats(part, self._step_input(seq, step, None)))
            elif step.kind == "cache":
                seq.apply(step, ar_tokens=logits[at:at + n].argmax(-1).tolist() if n else None)
            else:
                seq.apply(step, self._decide(seq, step, logits[at:at + n], logits[at + n:at + 2 * n]))

    def _decide(self, seq: Sequence, step: Pass, seq_logits: torch.Tensor, uncond: torch.Tensor):
        if step.cfg:
            seq_logits = uncond + (seq.params.cfg_scale + 1) * (seq_logits - uncond)
            if not bool(torch.isfinite(seq_logits).all()):     # the NaN check above ran before guidance
                raise EngineError(f"Classifier-free guidance at cfg_scale={seq.params.cfg_scale} overflowed "
                                  f"{self.dtype}; lower cfg_scale.")
        commit = seq.sampler.step(self._step_input(seq, step, seq_logits))
        if commit.conditioning is not None:         # the model's input for the next pass, made once here
            commit.conditioning = self.model.conditioning_input(commit.conditioning)
        return commit

    def _step_input(self, seq: Sequence, step: Pass, logits: torch.Tensor | None) -> StepInput:
        random = self._random_for(seq)
        return StepInput(logits=logits, positions=step.candidates, step=seq.step_in_block,
                         block_state=seq.block_state, params=seq.params, generator=random.generator,
                         tokens=self.tokens, current=[seq.canvas[p] for p in step.candidates],
                         masked=step.masked or [True] * len(step.candidates), random=random)
