"""The causal diffusion families on the engine against their reference decoders written out plainly:
Nemotron-Labs-Diffusion (its three modes, also against each other) and WeDLM.

1. **Reference loop vs engine.** NVIDIA's ``generate``, ``ar_generate`` and ``linear_spec_generate``
   run one request at a time over a growing cache: a causal prefill, then per block bidirectional
   passes over the cache and a causal pass that extends it (self-speculation: drafts, then a causal
   verify whose kept part stays). The baseline is that loop written out over one sequence's own KV
   pages (``dlm_backend.parity.forward.PagedRun``: the same layers, no scheduler, no batching), for
   ``--requests`` prompts one after another; the engine gets them all at once. Same tokens (checked),
   same passes per request.
2. **Self-speculation vs block diffusion vs autoregressive**, equal output length: passes and wall
   time per mode on the same prompts (self-speculation's tokens are the autoregressive ones).
   Random weights: drafts are rarely what the causal pass predicts, so a verify keeps about one
   token and self-speculation costs two passes a token here; a trained checkpoint keeps several.

3. **WeDLM.** Tencent's ``generate_wedlm`` recomputes the whole reordered sequence (committed slots
   first, causal) at every pass; the baseline is that loop written out. The engine keeps the prompt
   and finished blocks' keys in its pages and feeds only the block. Same tokens and passes (checked).

Random checkpoints of the released shapes at toy width (benchmarks/random_checkpoint.py), CPU,
float32.

    python benchmarks/bench_causal_families.py            # hidden 256, 4 layers; prompt 256, 64 new, 4 requests
    python benchmarks/bench_causal_families.py --quick
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_block import timed  # noqa: E402
from random_checkpoint import block_config, write_checkpoint  # noqa: E402

from dlm_backend import LLM  # noqa: E402
from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context  # noqa: E402
from dlm_backend.parity.forward import PagedRun  # noqa: E402


def argmax(run: PagedRun, ids: list[int], start: int, end: int, causal: bool) -> torch.Tensor:
    """Argmax of every fed position of one pass (causal: block size 1; else over the whole cache)."""
    hidden = run.hidden(torch.tensor(ids), start, end, block=1 if causal else 0)
    return run.model.compute_logits(hidden).argmax(-1)


@torch.inference_mode()
def nemotron_reference(model, prompt: list[int], gen: int, L: int, mask: int, mode: str) -> tuple[list[int], int]:
    """The reference decoders, greedy, one token a denoising pass (``generate`` without threshold;
    ``linear_spec_generate`` with threshold 0): (tokens, forwards, the prefill included)."""
    P = len(prompt)
    run = PagedRun(model, P + gen + L + 1)
    seq = list(prompt)
    nxt, passes = int(argmax(run, seq, 0, P, True)[-1]), 1
    while len(seq) - P + (mode != "block") < gen:      # ar / spec: the pending next token counts
        c = len(seq)
        if mode == "ar":
            seq.append(nxt)
            nxt, passes = int(argmax(run, [nxt], c, c + 1, True)[-1]), passes + 1
            continue
        block = [nxt] + [mask] * (L - 1)
        while mask in block:                      # generate: the most confident slot; spec: all in one pass
            hidden = run.hidden(torch.tensor(block), c, c + L, block=0)
            logits = model.compute_logits(hidden)
            logits[:, mask] = -torch.inf
            conf, tok = torch.softmax(logits, -1).max(-1)
            masked = torch.tensor([t == mask for t in block])
            pick = [int(torch.where(masked, conf, -torch.inf).argmax())] if mode == "block" else \
                masked.nonzero()[:, 0].tolist()
            for i in pick:
                block[i] = int(tok[i])
            passes += 1
        ar = argmax(run, block, c, c + L, True).tolist()
        passes += 1
        if mode == "block":
            seq += block
            nxt = ar[-1]
            continue
        kept = 1
        while kept < L and block[kept] == ar[kept - 1]:
            kept += 1
        seq += block[:kept]
        nxt = ar[kept - 1]
    if mode != "block":
        seq.append(nxt)
    return seq[P:P + gen], passes - (mode == "block")      # generate's last causal pass is not needed


SAMPLER = {"block": "nemotron", "ar": "nemotron_ar", "spec": "nemotron_spec"}


@torch.inference_mode()
def wedlm_reference(model, prompt: list[int], gen: int, L: int, mask: int) -> tuple[list[int], int]:
    """``generate_wedlm`` at threshold 0 written out: per pass one causal forward over the whole
    sequence reordered committed slots first, the most confident mask committed."""
    seq, passes = list(prompt), 0
    while len(seq) - len(prompt) < gen:
        n = min(L, gen - (len(seq) - len(prompt)))
        start = len(seq)
        seq += [mask] * n
        while mask in seq[start:]:
            order = [p for p in range(len(seq)) if seq[p] != mask] + [p for p in range(len(seq)) if seq[p] == mask]
            T = len(order)
            with forward_context(ForwardContext(PackedAttention([Segment(slice(0, T), 0, 1)]))):
                hidden = model(torch.tensor([seq[p] for p in order]), torch.tensor(order))
            first = T - seq.count(mask)
            conf, tok = torch.softmax(model.compute_logits(hidden[first:]).float(), -1).max(-1)
            i = int(conf.argmax())
            seq[order[first + i]] = int(tok[i])
            passes += 1
    return seq[len(prompt):], passes


def wedlm_table(folder: Path, args) -> None:
    llm = LLM(str(folder), dtype="float32", prefix_caching=False)
    model, mask = llm.engine.runner.model, llm.engine.tokens.mask_id
    prompts = [[(7 * i + 13 * r + 3) % 4000 for i in range(args.prompt)] for r in range(args.requests)]
    print(f"\n## WeDLM: reference loop vs engine ({args.requests} requests, blocks of 16, one token a pass)\n")
    print("| baseline | loop passes / request | loop s | engine passes / request | engine s | speed-up |")
    print("|---|---|---|---|---|---|")
    ref, ref_t = timed(lambda: [wedlm_reference(model, p, args.gen, 16, mask) for p in prompts], args.repeats)
    params = llm.sampling_params(max_tokens=args.gen, ignore_eos=True, remasking="low_confidence")
    outs, t = timed(lambda: llm.generate(prompt_token_ids=prompts, sampling_params=params), args.repeats)
    for (tokens, passes), out in zip(ref, outs):
        assert out.token_ids == tokens and out.num_forward_passes == passes, "wedlm"
    print(f"| recompute per pass | {ref[0][1]} | {ref_t:.2f} | {outs[0].num_forward_passes} | {t:.2f} | "
          f"{ref_t / t:.1f}x |")
    llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="hidden 128, 2 layers, prompt 64, 32 new")
    args = ap.parse_args()
    if args.quick:
        args.hidden, args.layers, args.prompt, args.gen = 128, 2, 64, 32
    with tempfile.TemporaryDirectory() as tmp:
        config = block_config("nemotron", hidden=args.hidden, layers=args.layers, block=args.block)
        folder = write_checkpoint(config, Path(tmp) / "nemotron")
        llm = LLM(str(folder), dtype="float32", prefix_caching=False)
        model, mask = llm.engine.runner.model, llm.engine.tokens.mask_id
        prompts = [[(7 * i + 13 * r + 3) % 4000 for i in range(args.prompt)] for r in range(args.requests)]
        print(f"random Nemotron-Labs-Diffusion: hidden {args.hidden}, {args.layers} layers, vocab 4096, blocks of "
              f"{args.block}; {args.requests} requests of {args.prompt} prompt + {args.gen} new tokens; "
              f"{torch.get_num_threads()} CPU threads, float32, median of {args.repeats}\n")
        print("| mode | sampler | loop passes / request | loop s | engine passes / request | engine s | "
              "speed-up | tokens / pass |")
        print("|---|---|---|---|---|---|---|---|")
        walls = {}
        for mode, sampler in SAMPLER.items():
            ref, ref_t = timed(lambda: [nemotron_reference(model, p, args.gen, args.block, mask, mode)
                                        for p in prompts], args.repeats)
            params = llm.sampling_params(sampler=sampler, max_tokens=args.gen, ignore_eos=True, block_length=args.block,
                                         remasking="low_confidence")
            outs, t = timed(lambda: llm.generate(prompt_token_ids=prompts, sampling_params=params), args.repeats)
            for (tokens, passes), out in zip(ref, outs):
                assert out.token_ids == tokens and out.num_forward_passes + out.num_cache_passes == passes, mode
            passes = sum(o.num_forward_passes + o.num_cache_passes for o in outs) / len(outs)
            walls[mode] = t
            print(f"| {mode} | {sampler} | {ref[0][1]} | {ref_t:.2f} | {passes:.0f} | {t:.2f} | {ref_t / t:.1f}x | "
                  f"{args.gen / passes:.2f} |")
        print(f"\nself-speculation vs block diffusion: {walls['block'] / walls['spec']:.2f}x wall; "
              f"vs autoregressive: {walls['ar'] / walls['spec']:.2f}x wall (equal output length; spec's tokens = AR's)")
        llm.close()
        wedlm_table(write_checkpoint(block_config("wedlm", hidden=args.hidden, layers=args.layers),
                                     Path(tmp) / "wedlm"), args)


if __name__ == "__main__":
    main()
