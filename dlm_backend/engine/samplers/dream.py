"""Dream's ``diffusion_generate``: the number to reveal follows a linear timestep schedule.

Timesteps ``linspace(1, eps, S + 1)`` in float32; at pass i with t = ts[i], s = ts[i + 1]:

* ``origin``: every masked slot is revealed independently with probability 1 - s/t (all at the last
  pass), with the token sampled from its distribution;
* ``maskgit_plus`` / ``topk_margin`` / ``entropy``: ``int(m * (1 - s/t))`` slots (all remaining at the
  last pass) with the highest confidence: max probability, top-1 minus top-2, or negative entropy.

Probabilities stay in the logits dtype (bf16 for real checkpoints), as in the reference. The count
is computed from this request's own masked count (the reference averages over its batch, which
would make a request's output depend on its neighbours). The logit shift is the model's business.
``top_k`` defaults to 50: ``diffusion_generate`` inherits transformers' GenerationConfig default, so
the published sampler ranks confidences inside the top 50 unless told otherwise (the parity fixtures
only match with it). By default one block spans the canvas, as in the reference; a block_length gives Fast-dLLM's blocked
Dream variant with a schedule per block.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput, top_k_indices


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, sorted_index = torch.sort(logits, descending=True)
    cumulative = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cumulative > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_index, remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    top_k = min(top_k, logits.shape[-1])
    kth = torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def sample_tokens(logits: torch.Tensor, params: SamplingParams, random,
                  mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(confidence, token) per row, following the reference ``sample_tokens``."""
    if params.temperature > 0:
        logits = logits / params.temperature
    unfiltered = logits
    if params.top_p is not None and params.top_p < 1:
        logits = top_p_filter(logits, params.top_p)
    if params.top_k is not None:
        logits = top_k_filter(logits, params.top_k)
    probs = torch.softmax(logits, dim=-1)                        # [N, V], logits dtype
    # Never predict the mask itself (it would leave the slot masked); a no-op for real checkpoints.
    pick = probs
    if 0 <= mask_id < probs.shape[-1]:
        pick = probs.clone()
        pick[:, mask_id] = -1
    if params.temperature > 0:
        sample_probs = pick.float().clamp_min(0)
        # A narrow top_k/top_p can keep the mask token alone; its row then has no mass left and
        # multinomial would raise. Such a row takes its most likely real token instead.
        empty = sample_probs.sum(dim=-1) == 0                    # [N]
        if empty.any():
            real = unfiltered[empty].clone()
            if 0 <= mask_id < real.shape[-1]:
                real[:, mask_id] = -torch.inf
            sample_probs[empty] = torch.nn.functional.one_hot(real.argmax(dim=-1), real.shape[-1]).float()
        x0 = random.multinomial(sample_probs)
        confidence = probs.gather(-1, x0[:, None])[:, 0]
    else:
        confidence, x0 = pick.max(dim=-1)
    if params.alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        confidence = top2[:, 0] - top2[:, 1]
    elif params.alg == "entropy":
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


REFERENCE_TOP_K = 50


class DreamSampler(Sampler):
    name = "dream"
    schedules = ("full",)               # Dream's diffusion_generate: a full-sequence canvas
    uses_steps = True
    default_block_length = None

    def begin_block(self, num_masked, steps, params):
        return torch.linspace(1, params.eps, steps + 1)           # float32 timesteps, on the host

    def step(self, inp: StepInput) -> Commit:
        p, ts, i = inp.params, inp.block_state, inp.step
        if p.top_k is None:
            p = p.replace(top_k=REFERENCE_TOP_K)
        steps = len(ts) - 1
        n = len(inp.positions)
        last = i >= steps - 1
        t, s = ts[min(i, steps - 1)], ts[min(i + 1, steps)]
        if p.alg == "origin":
            p_transfer = 1.0 if last else float(1 - s / t)
            reveal = inp.random.rand((n,)) < p_transfer
            chosen = reveal.nonzero()[:, 0].tolist()
            if not chosen:
                return Commit([], [])
            _, x0 = sample_tokens(inp.logits[chosen], p, inp.random, inp.tokens.mask_id)
            return Commit(chosen, x0.tolist())
        confidence, x0 = sample_tokens(inp.logits, p, inp.random, inp.tokens.mask_id)
        # Reference arithmetic: float32 tensor product, then int() truncation.
        k = n if last else int(torch.tensor(float(n)) * (1 - s / t))
        if k <= 0:
            return Commit([], [])
        if p.alg_temp:
            weights = torch.softmax(confidence.float() / p.alg_temp, dim=-1)
            chosen = inp.random.sample(weights, min(k, n)).tolist()
        else:
            chosen = top_k_indices(confidence, k)
        return Commit(chosen, x0[chosen].tolist())
