"""Block-diffusion families: the references' loop against the engine, and prefix caching, in one run.

1. **Reference loop vs engine.** The published ``generate`` of LLaDA2 (and Fast-dLLM v2's, SDAR's
   without its store-KV cache) recomputes the whole prefix with the block-causal mask at every
   denoising pass. The baseline here is that loop written out plainly for LLaDA2.0's rule (one
   forward over ``[0, block end)`` per pass, no cache); each sampler's baseline is the engine with
   ``cache="none"``, which runs the same forwards. Against them, the engine with its paged KV cache.
   Same prompt, same tokens (checked), same passes: the wall ratio is what the cache buys.
2. **Prefix caching.** 32 requests share a long system prompt (an agent's instructions and tool
   schemas); throughput with the prefix cache on and off, same outputs.
3. **LLaDA2 quantized.** The engine's weights quantized at load (int8, int4) against the same
   float32 plain loop.

Random block-shaped checkpoints (benchmarks/random_checkpoint.py), CPU, float32.

    python benchmarks/bench_block.py                 # hidden 256, 4 layers; prompt 512, 128 new
    python benchmarks/bench_block.py --quick         # smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from random_checkpoint import block_config, write_checkpoint  # noqa: E402

from dlm_backend import LLM  # noqa: E402
from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context  # noqa: E402

SAMPLERS = [("llada2", "llada2", {}), ("llada2", "llada2_edit", {"threshold": 0.5, "max_post_steps": 1}),
            ("sdar", "sdar", {}), ("fastdllm2", "fastdllm2", {"sub_block_length": 8})]


@torch.inference_mode()
def llada2_reference(model, prompt: list[int], gen: int, block: int, mask_id: int, threshold: float):
    """LLaDA2.0's ``generate`` (greedy, steps = block) written out: a full forward of ``[0, window
    end)`` with the block-causal mask at every pass."""
    P = len(prompt)
    total = -(-(P + gen) // block) * block
    x = torch.tensor(prompt + [mask_id] * (total - P))
    passes = 0
    for b in range(P // block, total // block):
        end = (b + 1) * block
        for step in range(block):
            masked = x[end - block:end] == mask_id
            if not masked.any():
                break
            with forward_context(ForwardContext(PackedAttention([Segment(slice(0, end), 0, block)]))):
                logits = model.compute_logits(model(x[:end], torch.arange(end))[end - block:]).float()
            passes += 1
            probs = torch.softmax(logits, -1)
            logits[:, mask_id] = -torch.inf
            token = logits.argmax(-1)
            conf = torch.where(masked, probs.gather(1, token[:, None])[:, 0], -torch.inf)
            pick = conf > threshold
            if int(pick.sum()) < 1:
                pick = torch.zeros_like(pick)
                pick[int(conf.argmax())] = True
            x[end - block:end][pick] = token[pick]
    return x[P:P + gen].tolist(), passes


def timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def reference_table(folders: dict, args) -> None:
    print(f"## Reference loop vs engine (prompt {args.prompt}, {args.gen} new tokens, median of {args.repeats})\n")
    print("| family | sampler | baseline | passes | baseline s | engine cache | engine s | engine cache passes | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for family, sampler, knobs in SAMPLERS:
        llm = LLM(str(folders[family]), dtype="float32", prefix_caching=False)
        prompt = [(7 * i + 3) % 1000 for i in range(args.prompt)]
        base = llm.sampling_params(sampler=sampler, max_tokens=args.gen, ignore_eos=True, **knobs)
        block = llm.engine.model_args.block_size
        if sampler == "llada2":
            model, mask = llm.engine.runner.model, llm.engine.tokens.mask_id
            (ref_tokens, ref_passes), ref_t = timed(
                lambda: llada2_reference(model, prompt, args.gen, block, mask, base.threshold), args.repeats)
            label = "plain loop"
        else:
            ref, ref_t = timed(lambda: llm.generate(prompt_token_ids=[prompt], sampling_params=base.replace(
                cache="none"))[0], args.repeats)
            ref_tokens, ref_passes, label = ref.token_ids, ref.num_forward_passes, "cache none"
        # prefix: the same math as the baseline, so the same tokens; Fast-dLLM's block cache (dual) is
        # its own approximation (stale keys inside the block), so its tokens may differ.
        for cache in ("prefix", "dual") if sampler == "fastdllm2" else ("prefix",):
            out, t = timed(lambda: llm.generate(prompt_token_ids=[prompt], sampling_params=base.replace(
                cache=cache))[0], args.repeats)
            if cache == "prefix":
                assert out.token_ids == ref_tokens and out.num_forward_passes == ref_passes, (family, sampler)
            print(f"| {family} | {sampler} | {label} | {ref_passes} | {ref_t:.2f} | {cache} | {t:.2f} | "
                  f"{out.num_cache_passes} | {ref_t / t:.1f}x |")
        llm.close()


def prefix_table(folders: dict, args) -> None:
    print(f"\n## {args.requests} requests sharing a {args.system}-token system prompt "
          f"({args.question} own tokens, {args.answer} new each)\n")
    print("Random weights are never confident: one token a pass makes every block cost a pass per slot, and "
          "decoding then outweighs the prompt. A trained model commits several a pass (LLaDA2 at 0.95, SDAR "
          "at 0.9); the second row of each family decodes 8 tokens a pass (SDAR: its whole block of 4).\n")
    print("| family | tokens / pass | prefix cache | wall s | requests/s | prompt pages hit | speed-up |")
    print("|---|---|---|---|---|---|---|")
    system = [(11 * i + 5) % 1000 for i in range(args.system)]
    prompts = [system + [(13 * r + j) % 1000 for j in range(args.question)] for r in range(args.requests)]
    for family in ("sdar", "llada2"):
        for per_pass in (1, 8):
            rows = {}
            for on in (False, True):
                llm = LLM(str(folders[family]), dtype="float32", prefix_caching=on)
                block = llm.engine.model_args.block_size
                params = llm.sampling_params(max_tokens=args.answer, ignore_eos=True,
                                             steps=max(1, block // per_pass))
                start = time.perf_counter()
                outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
                rows[on] = (time.perf_counter() - start, [o.token_ids for o in outs], llm.engine.allocator.hit_rate)
                llm.close()
            assert rows[True][1] == rows[False][1], family
            for on in (False, True):
                wall, _, hits = rows[on]
                print(f"| {family} | {min(per_pass, block)} | {'on' if on else 'off'} | {wall:.2f} | "
                      f"{args.requests / wall:.2f} | {hits:.0%} | {rows[False][0] / wall:.1f}x |")


def quantized_table(folders: dict, args) -> None:
    """LLaDA2 (MoE) against its plain loop again, the engine's weights quantized at load: its experts
    and dense layers on the packed int8/int4 kernels (tokens differ from float's, so passes may too)."""
    print(f"\n## LLaDA2 quantized at load (prompt {args.prompt}, {args.gen} new tokens, median of {args.repeats})\n")
    print("| weights | passes | engine s | plain loop s (float32) | speed-up |\n|---|---|---|---|---|")
    prompt = [(7 * i + 3) % 1000 for i in range(args.prompt)]
    base = None
    for method in (None, *args.quantization.split(",")):
        with LLM(str(folders["llada2"]), dtype="float32", prefix_caching=False, quantization=method) as llm:
            params = llm.sampling_params(sampler="llada2", max_tokens=args.gen, ignore_eos=True)
            if base is None:
                model, block = llm.engine.runner.model, llm.engine.model_args.block_size
                _, base = timed(lambda: llada2_reference(model, prompt, args.gen, block, llm.engine.tokens.mask_id,
                                                         params.threshold), args.repeats)
            out, t = timed(lambda: llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0], args.repeats)
            print(f"| {method or 'float32'} | {out.num_forward_passes} | {t:.2f} | {base:.2f} | {base / t:.1f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--system", type=int, default=1024)
    ap.add_argument("--question", type=int, default=16)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="hidden 128, 2 layers, shorter prompts")
    ap.add_argument("--quantization", default="int8,int4", help="methods for the LLaDA2 quantized rows ('' for none)")
    args = ap.parse_args()
    if args.quick:
        args.hidden, args.layers, args.prompt, args.gen, args.requests, args.system = 128, 2, 128, 32, 8, 256
    with tempfile.TemporaryDirectory() as tmp:
        blocks = {"llada2": 32, "sdar": 4, "fastdllm2": 32}           # each family's released block
        folders = {f: write_checkpoint(block_config(f, hidden=args.hidden, layers=args.layers, block=b), Path(tmp) / f)
                   for f, b in blocks.items()}
        print(f"random checkpoints: hidden {args.hidden}, {args.layers} layers, vocab 4096 (LLaDA2: 16 experts, "
              f"top-4; blocks of 32, SDAR 4); {torch.get_num_threads()} CPU threads, float32\n")
        reference_table(folders, args)
        prefix_table(folders, args)
        if args.quantization:
            quantized_table(folders, args)


if __name__ == "__main__":
    main()
