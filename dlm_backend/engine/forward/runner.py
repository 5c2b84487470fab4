"""Runs the model for a batch of sequences and applies their samplers. Never schedules."""

from __future__ import annotations

import torch

from dlm_backend.engine.forward.batch import ForwardBatch
from dlm_backend.engine.forward.cuda_graphs import BlockGraphs
from dlm_backend.engine.forward.observe import frame_after, observe_cache, observe_denoise
from dlm_backend.engine.kv import KVPool
from dlm_backend.engine.layers import ForwardContext, forward_context
from dlm_backend.engine.models.base import DiffusionLM
from dlm_backend.engine.requests.sequence import Pass, ScheduledBatch, Sequence
from dlm_backend.engine.samplers.base import StepInput, TokenInfo
from dlm_backend.engine.samplers.random import TorchRandom
from dlm_backend.errors import EngineError


class ModelRunner:
    """Owns the weights, the KV pool and the forward pass.

    One :meth:`step` takes each scheduled sequence's planned :class:`Pass`, packs every pass's
    positions into a single token batch (paged passes first: their keys and values go into the pool
    and their attention reads the pool; then unpaged ones), runs one forward, computes logits only
    for each pass's candidate slots and lets each sequence's sampler decide. On CUDA, a batch of
    paged passes of one shape runs as a captured CUDA graph (engine/forward/cuda_graphs.py), and greedy threshold
    requests take their (token, confidence) from the fused unmasking kernel instead of [N, V] logits.
    """

    def __init__(self, model: DiffusionLM, device: torch.device, dtype: torch.dtype, tokens: TokenInfo | None,
                 pool: KVPool | None, triton: bool = False, cuda_graphs: bool = False, workers=None):
        self.model, self.device, self.dtype, self.tokens = model, device, dtype, tokens
        self.pool = pool
        self.triton = triton            # kernel dispatch, decided once (kernels.resolve_kernels)
        self.workers = workers          # rank 0 of a tensor-parallel engine: its worker processes
        self.graphs: BlockGraphs | None = None
        # The static step feeds ids and positions alone: a decoder pass's self-conditioning is not captured.
        # A tensor-parallel forward's collectives are not captured either (rank 0 alone would replay).
        if (device.type == "cuda" and cuda_graphs and triton and pool is not None and model.noise == "mask"
                and model.tp is None):
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
        """Drop the weights, the KV pool and captured graphs (the memory returns to torch's allocator);
        a tensor-parallel engine's workers stop."""
        if self.workers is not None:
            self.workers.close()
        self.graphs = self.pool = self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _wants_stats(self, seq: Sequence, step: Pass) -> bool:
        """Kernel path, greedy, plain logits: the sampler can decide from fused (token, confidence)."""
        p = seq.params
        return (self.triton and step.kind == "denoise" and seq.sampler.uses_unmask_stats and not step.cfg
                and p.temperature == 0 and p.top_p is None and p.top_k is None and p.logprobs is None)

    # -- the forward ---------------------------------------------------------------------------------

    def execute(self, batch: ForwardBatch):
        """Run one packed forward and its head on this rank: ``(logits [N, V] or None, UnmaskStats or
        None)`` for ``batch``'s head rows. Rank 0 of a tensor-parallel engine first sends the batch to
        the workers, which run this same method on it (forward/workers.py)."""
        if self.workers is None:
            return self._execute(batch)
        self.workers.send(batch)
        try:
            return self._execute(batch)
        except RuntimeError as exc:          # a collective whose peer is gone
            raise self.workers.failure(exc) from exc

    def _execute(self, batch: ForwardBatch):
        return self._head(self.forward(batch), batch.logit_rows, batch.stat_rows, batch.exclude_id)

    def pack(self, seqs: list[Sequence], steps: list[Pass], shift: int) -> tuple[ForwardBatch, list[list[int]]]:
        """One forward of the passes (paged ones first, as PagedBatch reads them) and, per sequence,
        the rows holding its candidates' predictions."""
        batch = ForwardBatch(exclude_id=self.tokens.mask_id)
        packed = {i: batch.add(seqs[i], steps[i], shift, self.tokens.mask_id)
                  for i in sorted(range(len(seqs)), key=lambda i: not steps[i].paged)}
        return batch, [packed[i] for i in range(len(seqs))]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """The model over ``batch``'s rows: hidden states [T, D] (no head)."""
        ids, pos, backend, decoder = batch.tensors(self.pool, self.device, self.model.args.hidden_size, self.dtype)
        with forward_context(ForwardContext(backend, self.triton, decoder)):
            return self.model(ids, pos)

    def _head(self, hidden: torch.Tensor, logit_rows: list[int], stat_rows: list[int], exclude_id: int):
        """The final norm and head on just the rows a sampler reads."""
        logits = stats = None
        with forward_context(ForwardContext(None, self.triton)):
            if logit_rows:
                h = hidden if logit_rows == list(range(hidden.shape[0])) else hidden[self._index(logit_rows)]
                logits = self.model.compute_logits(h)                                      # [N, V]
            if stat_rows:
                stats = self.model.compute_unmask_stats(hidden[self._index(stat_rows)], exclude_id)
        return logits, stats

    def _index(self, rows: list[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    # -- one step ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, batch: ScheduledBatch) -> None:
        """One forward for the scheduled passes: each request commits at least one token, or caches keys."""
        shift, mask_id = self.logits_shift, self.tokens.mask_id
        seqs, steps = batch.seqs, batch.passes
        for seq, step in zip(seqs, steps):
            self._random_for(seq)
            seq.begin_pass(step)
        fused = [self._wants_stats(seq, st) for seq, st in zip(seqs, steps)]
        static = self.graphs.split(seqs, steps) if self.graphs is not None else []
        rest = [i for i in range(len(seqs)) if i not in set(static)]
        outputs: list = [None] * len(seqs)       # per sequence: its logits [n (2n with cfg), V] or UnmaskStats
        if static:
            hidden, rows = self.graphs.forward([seqs[i] for i in static], [steps[i] for i in static], shift)
            logit_rows, stat_rows = _head_rows(rows, [fused[i] for i in static])
            _split(outputs, static, rows, fused, *self._head(hidden, logit_rows, stat_rows, mask_id))
        if rest:
            batch, rows = self.pack([seqs[i] for i in rest], [steps[i] for i in rest], shift)
            batch.logit_rows, batch.stat_rows = _head_rows(rows, [fused[i] for i in rest])
            _split(outputs, rest, rows, fused, *self.execute(batch))
        checked = [o if isinstance(o, torch.Tensor) else o.prob for o in outputs if o is not None]
        if any(torch.isnan(t).any() for t in checked):
            # argmax over NaN picks an arbitrary token and the request would "succeed" with garbage.
            # Raising lets the engine retry the batch request by request, so only the culprit fails.
            raise EngineError("The model produced NaN logits. The weights or inputs overflow in "
                              f"{self.dtype}; try dtype='float32'.")
        for seq, step, f, out in zip(seqs, steps, fused, outputs):
            n = len(step.candidates)
            if step.kind == "cache":
                tokens = out[:n].argmax(-1).tolist() if n else None
                observe_cache(seq, step, out, tokens)
                seq.apply(step, ar_tokens=tokens)
                continue
            if f:
                commit, logits, draft = seq.sampler.step_from_stats(out, self._step_input(seq, step, None)), None, out.token
            else:
                commit, logits = self._decide(seq, step, out[:n], out[n:2 * n])
                draft = self._draft(logits) if seq.params.stream_canvas else None
            shown = observe_denoise(seq, step, logits, commit, draft if seq.params.stream_canvas else None)
            seq.apply(step, commit)
            if seq.params.stream_canvas:
                seq.frames.append(frame_after(seq, step, *shown))

    def _draft(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's token per candidate row (never the mask token): a canvas frame's draft."""
        mask = self.tokens.mask_id
        if 0 <= mask < logits.shape[-1]:
            logits = logits.index_fill(1, torch.tensor([mask], device=logits.device), -torch.inf)
        return logits.argmax(-1)

    def _decide(self, seq: Sequence, step: Pass, seq_logits: torch.Tensor, uncond: torch.Tensor):
        """The sampler's commit and the logits it decided on (guided, with classifier-free guidance)."""
        if step.cfg:
            seq_logits = uncond + (seq.params.cfg_scale + 1) * (seq_logits - uncond)
            if not bool(torch.isfinite(seq_logits).all()):     # the NaN check above ran before guidance
                raise EngineError(f"Classifier-free guidance at cfg_scale={seq.params.cfg_scale} overflowed "
                                  f"{self.dtype}; lower cfg_scale.")
        commit = seq.sampler.step(self._step_input(seq, step, seq_logits))
        if commit.conditioning is not None:         # the model's input for the next pass, made once here
            commit.conditioning = self.model.conditioning_input(commit.conditioning)
        return commit, seq_logits

    def _step_input(self, seq: Sequence, step: Pass, logits: torch.Tensor | None) -> StepInput:
        return StepInput(logits=logits, positions=step.candidates, step=seq.step_in_block,
                         block_state=seq.block_state, params=seq.params, random=self._random_for(seq),
                         tokens=self.tokens, current=[seq.canvas[p] for p in step.candidates],
                         masked=step.masked or [True] * len(step.candidates))


def _head_rows(rows: list[list[int]], fused: list[bool]) -> tuple[list[int], list[int]]:
    """The hidden rows that get logits and those that get fused greedy statistics, in sequence order."""
    return ([r for f, rr in zip(fused, rows) if not f for r in rr], [r for f, rr in zip(fused, rows) if f for r in rr])


def _split(outputs: list, group: list[int], rows: list[list[int]], fused: list[bool], logits, stats) -> None:
    """Hand each sequence of ``group`` its slice of the head's output."""
    at = {False: 0, True: 0}
    for i, rr in zip(group, rows):
        f, a, n = fused[i], at[fused[i]], len(rr)
        at[f] += n
        outputs[i] = type(stats)(*(t[a:a + n] for t in stats)) if f else logits[a:a + n] if n else None
