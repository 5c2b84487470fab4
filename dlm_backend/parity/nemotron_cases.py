"""How Nemotron-Labs-Diffusion's three recorded decoders (``fixtures/parity-block/nemotron-labs-tiny``)
are asked of the engine, and what must come back.

The references count every forward in ``nfe`` except ``generate``'s prefill, and ``generate`` runs
one more causal pass after its last block; the engine counts the prefill and skips that pass, so
the totals agree (denoising passes plus cache passes). One difference is the reference's own: when
a block's first slot (the token the causal pass predicted) is already the end token, ``generate``
still denoises that block once before it returns, a pass the engine does not run.
``linear_spec_generate`` may return more than ``max_new_tokens`` (its last verify keeps up to a
block); the engine's output is cut there, and so is the compared output.
"""

from __future__ import annotations

from typing import Callable

from dlm_backend.engine.params import SamplingParams
from dlm_backend.parity.cases import Run, _same, tokens

SAMPLER = {"nemotron.generate": "nemotron", "nemotron.ar_generate": "nemotron_ar",
           "nemotron.linear_spec_generate": "nemotron_spec"}


def nemotron_decode(case: dict, fixture: dict) -> Run:
    n, L, tau, eos = case["max_new_tokens"], case["block_length"], case["threshold"], case["eos_token_id"]
    kw = dict(sampler=SAMPLER[case["sampler"]], max_tokens=n, temperature=0.0)
    if eos != fixture["eos_token_id"]:            # the decoder was given its own end token
        kw.update(ignore_eos=True, stop_token_ids=[eos])
    if case["sampler"] == "nemotron.generate":
        kw.update(block_length=L, remasking="low_confidence" if tau is None else "low_confidence_dynamic")
        if tau is not None:
            kw["threshold"] = tau
    elif case["sampler"] == "nemotron.linear_spec_generate":
        kw.update(block_length=L, options={"draft_threshold": tau})
    want, nfe = case["output"][:n], case["nfe"]
    if case["sampler"] == "nemotron.generate" and want and want[-1] == eos and (len(want) - 1) % L == 0:
        nfe -= 1                                  # the reference denoises a block that opens with the end once

    def check(outs) -> list[str]:
        out = outs[0]
        return (_same("tokens", tokens(out), want)
                + _same("passes", out.num_forward_passes + out.num_cache_passes, nfe))
    return Run([case["prompt"]], [SamplingParams(**kw)], check)


SAMPLERS: dict[str, Callable[..., Run]] = {name: nemotron_decode for name in SAMPLER}
