"""Packed batches and the masked-diffusion loss for dlm-tiny.

Why packing: examples range from 20 tokens (a greeting) to 450 (three tool schemas), so rows grouped
by length put one task family in each step; packed rows mix every family in every step and waste
no compute on padding. Attention keeps the examples of a row apart (per example, in length buckets:
example_attention.py), and positions restart at 0 for each example, so each one is computed exactly
as if it were alone.

Why some prompts are masked too: in SFT only the reply is supervised, and replies are 2-15% of the
tokens (a QA answer is 2-4 tokens after a 100-token context), so run 2 learned from ~500 tokens a
step and after 3500 steps could not yet write its own tool-call boilerplate on training examples.
With probability ``prompt_mask_prob`` an example is masked over its whole length, as in LLaDA's
pre-training; its questions repeat names from its contexts, so this is also copy practice.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dlm_backend.engine.layers import ForwardContext, forward_context
from dlm_backend.errors import DLMError
from dlm_tiny.block_layout import first_slots, lay_out, layout_length
from dlm_tiny.example_attention import ExampleAttention, block_visible
from dlm_tiny.row_attention import RowAttention


@dataclass
class PackedBatch:
    """One optimiser step. ``ids``, ``pos``, ``ex``, ``noisy`` are ``[B, L]``: token, position within its
    example, the example's index in ``prompt_len``/``reply_len`` (``-1`` for the unused tail of a row),
    and whether the token is in the block layout's noisy copy (block_layout.py; none in the Dream layout)."""

    ids: torch.Tensor
    pos: torch.Tensor
    ex: torch.Tensor
    noisy: torch.Tensor
    prompt_len: torch.Tensor      # [E]
    reply_len: torch.Tensor       # [E] reply with its end-of-turn token, before the EOS run
    block_size: int = 0           # 0: the Dream layout

    @property
    def blocks(self) -> torch.Tensor | None:
        """``[B, L]``: each token's block within its example (None in the Dream layout)."""
        return self.pos // self.block_size if self.block_size else None

    @property
    def attend(self) -> torch.Tensor:
        """``[B, L, L]``: a token sees exactly the tokens of its own example (the tail sees the tail),
        in the block layout only those :func:`block_visible` allows."""
        same = self.ex[:, :, None] == self.ex[:, None, :]
        if not self.block_size:
            return same
        blk = self.blocks
        return same & block_visible(blk[:, :, None], self.noisy[:, :, None], blk[:, None, :], self.noisy[:, None, :])

    def to(self, device: torch.device | str) -> PackedBatch:
        """The batch on ``device`` (batches are built on the CPU, from Python lists)."""
        return PackedBatch(*(t.to(device) for t in (self.ids, self.pos, self.ex, self.noisy, self.prompt_len,
                                                    self.reply_len)), self.block_size)


class PackedBatches:
    """Batch ``step`` of a run, a pure function of (seed, step): resuming needs only the step.

    Each epoch shuffles the examples (seeded) and fills ``rows`` rows of ``max_len`` tokens in that
    order; every example is followed by 1..``max_extra_pad`` EOS tokens (the model learns to end a
    reply and fill the rest of its canvas), drawn uniformly or, with ``pad_dist="log"``,
    log-uniformly: short runs as often as long ones on a log scale, so a run up to 256 costs a mean
    of 46 EOS tokens an example instead of 128 and still shows every canvas length.

    ``block_size`` > 0 lays each example out in the block layout (block_layout.py): clean, then a noisy
    copy from the block holding its first reply token. Its EOS run is drawn as above and then runs
    on to the end of its block, as a served canvas does (engine/requests/block_sequence.py decodes whole blocks); a
    cut to fit a row ends on a block boundary too. Examples whose reply and one EOS do not fit
    ``max_len`` in this layout are left out; ``dropped`` counts them.
    """

    def __init__(self, pairs: list[tuple[list[int], list[int]]], seed: int, max_len: int, rows: int,
                 max_extra_pad: int, eos: int, pad_dist: str = "uniform", block_size: int = 0):
        self.block_size = block_size
        if block_size:
            kept = [(p, r) for p, r in pairs if layout_length(len(p) + len(r) + 1, len(p), block_size) <= max_len]
            self.dropped, pairs = len(pairs) - len(kept), kept
        else:                    # encode_examples already keeps the examples that fit max_len
            self.dropped = 0
        self.pairs, self.seed, self.max_len, self.rows = pairs, seed, max_len, rows
        self.max_extra_pad, self.eos, self.pad_dist = max_extra_pad, eos, pad_dist
        self._epochs: dict[int, list[list[list[tuple[int, int]]]]] = {}
        self._lengths: dict[int, int] = {}           # batches per epoch: EOS runs change the packing

    def _plan(self, epoch: int) -> list[list[list[tuple[int, int]]]]:
        """The epoch's batches: rows of (example index, EOS run length)."""
        if epoch not in self._epochs:
            rng = random.Random(f"{self.seed}-epoch-{epoch}")
            order = list(range(len(self.pairs)))
            rng.shuffle(order)
            batches, batch, row, used = [], [], [], 0
            for j in order:
                extra = self._to_block_end(j, self._extra(rng))
                n = self._length(j, extra)
                if used + n > self.max_len:           # the row is full: start the next one
                    batch.append(row)
                    row, used = [], 0
                    if len(batch) == self.rows:
                        batches.append(batch)
                        batch = []
                row.append((j, extra))
                used += n
            if not batches:
                raise DLMError(f"{len(self.pairs)} examples do not fill one step of {self.rows} rows of "
                               f"{self.max_len} tokens; raise --num-examples or lower --rows")
            self._epochs = {epoch: batches}           # keep one epoch's plan in memory
            self._lengths[epoch] = len(batches)
        return self._epochs[epoch]

    def _to_block_end(self, j: int, extra: int) -> int:
        """The EOS run ``extra``, lengthened in the block layout so the example ends on a block boundary."""
        if not self.block_size:
            return extra
        n = len(self.pairs[j][0]) + len(self.pairs[j][1]) + extra
        return extra + -n % self.block_size

    def _length(self, j: int, extra: int) -> int:
        """Tokens example ``j`` takes in its row with an EOS run of ``extra``."""
        prompt, reply = self.pairs[j]
        return min(self.max_len, layout_length(len(prompt) + len(reply) + extra, len(prompt), self.block_size))

    def _extra(self, rng: random.Random) -> int:
        """One example's EOS run, 1..``max_extra_pad``."""
        if self.pad_dist == "log":
            return min(self.max_extra_pad, int(math.exp(rng.uniform(0, math.log(self.max_extra_pad + 1)))))
        return rng.randint(1, self.max_extra_pad)

    def _epoch_length(self, epoch: int) -> int:
        return self._lengths[epoch] if epoch in self._lengths else len(self._plan(epoch))

    def __call__(self, step: int) -> PackedBatch:
        epoch, index = 0, step
        while index >= self._epoch_length(epoch):
            index -= self._epoch_length(epoch)
            epoch += 1
        plan = self._plan(epoch)[index]
        B, L = len(plan), self.max_len
        ids = torch.full((B, L), self.eos, dtype=torch.long)
        pos = torch.zeros(B, L, dtype=torch.long)
        ex = torch.full((B, L), -1, dtype=torch.long)
        noisy = torch.zeros(B, L, dtype=torch.bool)
        prompt_len, reply_len = [], []
        for r, row in enumerate(plan):
            at = 0
            for j, extra in row:
                prompt, reply = self.pairs[j]
                clean = prompt + reply + [self.eos] * extra
                while layout_length(len(clean), len(prompt), self.block_size) > L - at:   # cut the EOS run
                    clean.pop()
                while self.block_size and len(clean) % self.block_size and len(clean) > len(prompt) + len(reply) + 1:
                    clean.pop()                       # a cut block ends where a block does
                tokens, positions, copy = lay_out(clean, len(prompt), self.block_size)
                n = len(tokens)
                ids[r, at:at + n] = torch.tensor(tokens)
                pos[r, at:at + n] = torch.tensor(positions)
                ex[r, at:at + n] = len(prompt_len)
                noisy[r, at:at + n] = torch.tensor(copy)
                prompt_len.append(len(prompt))
                reply_len.append(min(len(reply), len(clean) - len(prompt)))
                at += n
        return PackedBatch(ids, pos, ex, noisy, torch.tensor(prompt_len), torch.tensor(reply_len), self.block_size)


def sample_mask(batch: PackedBatch, gen: torch.Generator, t_min: float,
                prompt_mask_prob: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which tokens to mask (``[B, L]`` bool), each example's ratio ``t`` and whether its prompt is
    masked too (``[E]`` each).

    t ~ U(t_min, 1) per example and every eligible token is masked with probability t (LLaDA). An
    SFT example's eligible tokens are its reply and EOS run; a prompt-masked example's are all but
    its first token (Dream predicts position i from output i - 1, so position 0 has no predictor).
    In the block layout only the noisy copy's reply and EOS slots are eligible, never a block's first
    slot (block_layout.py), and no prompt is masked.
    """
    E, dev = batch.prompt_len.shape[0], batch.ids.device
    # drawn from the CPU generator whatever the device: a run's masks are the same on CPU and GPU
    t = t_min + (1 - t_min) * torch.rand(E, generator=gen).to(dev)
    whole = (torch.rand(E, generator=gen).to(dev) < prompt_mask_prob) & (batch.block_size == 0)
    ex = batch.ex.clamp_min(0)
    start = torch.where(whole, 1, batch.prompt_len)[ex]                     # [B, L]
    eligible = (batch.ex >= 0) & (batch.pos >= start)
    if batch.block_size:
        eligible &= batch.noisy & (batch.pos % batch.block_size != 0)
    masked = eligible & (torch.rand(batch.ids.shape, generator=gen).to(dev) < t[ex])
    return masked, t, whole


def diffusion_loss(model, batch: PackedBatch, mask_id: int, gen: torch.Generator, t_min: float,
                   prompt_mask_prob: float, pad_weight: float, ar_prob: float = 0.0,
                   per_example: bool = True) -> torch.Tensor:
    """Masked-diffusion loss: cross-entropy on masked tokens weighted by 1/t, summed per example
    and divided by its supervised length, averaged over examples (so long examples do not dominate).

    With probability ``ar_prob`` an example is instead trained autoregressively: clean input, causal
    attention inside it, next-token loss on every token. Masked diffusion needs many times the
    compute of autoregression for the same loss, and a diffusion model initialised from an
    autoregressive one learns much faster (Dream-7B starts from Qwen2.5, hence its logit shift);
    the training loop starts at ``ar_prob`` 1 and anneals it to 0, so the finished model is a pure
    diffusion model that began as an autoregressive one.

    The EOS run after a reply weighs ``pad_weight``: it is trivial to predict and at full weight it
    drowned the replies (a 24-example overfit test learned the padding and never the answers).

    ``per_example=False`` attends over whole rows under a block-diagonal mask instead of
    :class:`ExampleAttention`'s length buckets: the same loss, slower; probes/bench_train_step.py
    times the two.

    In the block layout (block_layout.py) each reply block's first token is read autoregressively from
    the clean copy, at weight 1 as the causal examples' tokens are.
    """
    B, L = batch.ids.shape
    if batch.block_size and ar_prob:
        raise ValueError("the block layout has no autoregressive examples (block_layout.py): ar_prob must be 0")
    masked, t, whole = sample_mask(batch, gen, t_min, prompt_mask_prob)
    causal = torch.rand(t.shape, generator=gen).to(t.device) < ar_prob              # [E]
    in_example = batch.ex >= 0
    causal_tok = causal[batch.ex.clamp_min(0)] & in_example                         # [B, L]
    masked &= ~causal_tok
    inputs = torch.where(masked, torch.full_like(batch.ids, mask_id), batch.ids)
    if per_example:
        backend = ExampleAttention(batch.ex, causal, batch.blocks, batch.noisy)
    else:
        own_past = batch.pos[:, None, :] <= batch.pos[:, :, None]
        backend = RowAttention(B, L, batch.attend & (~causal_tok[:, :, None] | own_past))
    # triton=False: training runs the layers' torch code, which autograd differentiates
    with forward_context(ForwardContext(backend, triton=False)):
        hidden = model(inputs.reshape(-1), batch.pos.reshape(-1)).view(B, L, -1)   # [B, L, D]
    read_ar = causal_tok & (batch.pos >= 1)                                          # [B, L]
    if batch.block_size:
        read_ar |= in_example & first_slots(batch.pos, batch.noisy, batch.prompt_len[batch.ex.clamp_min(0)],
                                            batch.block_size)
    b, i = (masked | read_ar).nonzero(as_tuple=True)
    e = batch.ex[b, i]
    in_reply = batch.pos[b, i] < (batch.prompt_len + batch.reply_len)[e]
    logits = model.compute_logits(hidden[b, i - 1])                                # [M, V]
    ce = F.cross_entropy(logits, batch.ids[b, i], reduction="none")
    ce = ce * torch.where(in_reply, 1.0, pad_weight) / torch.where(read_ar[b, i], 1.0, t[e])
    supervised = torch.where(whole | causal, batch.prompt_len - 1, 0) + batch.reply_len  # [E]
    summed = torch.zeros_like(t).index_add_(0, e, ce)                               # [E]
    return (summed / supervised.clamp_min(1)).mean()
