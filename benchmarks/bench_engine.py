"""Engine vs. a plain re-implementation of the reference loop, on one checkpoint, in one run.

The baseline is LLaDA's published ``generate`` written out plainly: one token per pass, a full
forward over the whole canvas every pass, no cache. Every (sampler, cache) configuration of the
engine generates the same number of tokens from the same prompt; the table gives forward passes per
generated token and wall-clock time relative to the baseline (median of --repeats runs).

    python benchmarks/bench_engine.py                       # tiny parity checkpoint
    python benchmarks/bench_engine.py --synthetic           # a larger random LLaDA-shaped one
    python benchmarks/bench_engine.py --model tests/fixtures/parity/llada-moe-tiny --mask-token-id 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "parity" / "llada-tiny"
CONFIGS = [
    ("llada", "none"), ("llada", "prefix"), ("llada", "dual"),
    ("threshold", "none"), ("threshold", "prefix"), ("threshold", "dual"),
    ("factor", "none"), ("factor", "dual"),
    ("entropy_bounded", "none"), ("entropy_bounded", "dual"),
    ("dream", "none"), ("dream", "dual"),
]


def synthetic_checkpoint(folder: Path, d: int = 256, layers: int = 4, vocab: int = 2048) -> Path:
    """A random LLaDA-format checkpoint large enough that the forward, not Python, dominates."""
    from safetensors.torch import save_file

    config = json.loads((TINY / "config.json").read_text())
    config.update(d_model=d, n_layers=layers, n_heads=d // 64, n_kv_heads=d // 64, mlp_hidden_size=4 * d,
                  vocab_size=vocab, embedding_size=vocab, mask_token_id=vocab - 20, eos_token_id=vocab - 19,
                  pad_token_id=vocab - 19, max_sequence_length=2048)
    g = torch.Generator().manual_seed(0)
    state = {"model.transformer.wte.weight": torch.randn(vocab, d, generator=g) * 0.02,
             "model.transformer.ln_f.weight": torch.ones(d),
             "model.transformer.ff_out.weight": torch.randn(vocab, d, generator=g) * 0.02}
    for i in range(layers):
        p = f"model.transformer.blocks.{i}."
        for name, shape in [("q_proj", (d, d)), ("k_proj", (d, d)), ("v_proj", (d, d)), ("attn_out", (d, d)),
                            ("ff_proj", (4 * d, d)), ("up_proj", (4 * d, d)), ("ff_out", (d, 4 * d))]:
            state[p + name + ".weight"] = torch.randn(*shape, generator=g) / shape[1] ** 0.5
        state[p + "attn_norm.weight"] = torch.ones(d)
        state[p + "ff_norm.weight"] = torch.ones(d)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(state, str(folder / "model.safetensors"))
    return folder


@torch.inference_mode()
def reference_loop(model, prompt: list[int], gen: int, block: int, mask_id: int) -> tuple[list[int], int]:
    """LLaDA ``generate`` at one token per pass: full forward of the canvas every pass."""
    x = torch.tensor(prompt + [mask_id] * gen)
    L, P = len(x), len(prompt)
    passes = 0
    for b in range(gen // block):
        for _ in range(block):
            with forward_context(ForwardContext(PackedAttention([Segment(slice(0, L), 0)]))):
                logits = model.compute_logits(model(x, torch.arange(L)))
            passes += 1
            x0 = logits.argmax(-1)
            conf = torch.softmax(logits, -1).gather(-1, x0[:, None])[:, 0]
            conf[P + (b + 1) * block:] = -torch.inf
            conf = torch.where(x == mask_id, conf, -torch.inf)
            i = int(conf.argmax())
            x[i] = x0[i]
    return x[P:].tolist(), passes


def timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(TINY))
    ap.add_argument("--synthetic", action="store_true", help="build and use a larger random checkpoint")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--threshold", type=float, default=0.1)
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--gamma", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mask-token-id", type=int, default=None,
                    help="for a checkpoint whose config.json names none (llada-moe-tiny: 300, its cases.json's)")
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory()
    model_path = synthetic_checkpoint(Path(tmp.name) / "synthetic") if args.synthetic else Path(args.model)
    torch.set_num_threads(torch.get_num_threads())
    overrides = {} if args.mask_token_id is None else {"mask_token_id": args.mask_token_id}
    llm = LLM(str(model_path), device="cpu", dtype="float32", config_overrides=overrides)
    engine = llm.engine
    mask_id = engine.tokens.mask_id
    prompt = [(7 * i + 3) % min(mask_id, 256) for i in range(args.prompt_len)]

    (ref_tokens, ref_passes), ref_time = timed(
        lambda: reference_loop(engine.runner.model, prompt, args.gen, args.block, mask_id), args.repeats)
    a = engine.model_args
    print(f"checkpoint: {model_path.name} ({engine.architecture}, d={a.hidden_size}, layers={a.num_layers}, "
          f"vocab={a.vocab_size}); prompt {args.prompt_len}, gen {args.gen}, block {args.block}; "
          f"threshold {args.threshold}, factor {args.factor}, gamma {args.gamma}; "
          f"{torch.get_num_threads()} CPU threads, float32; median of {args.repeats}\n")
    print("| sampler | cache | passes | passes/token | tokens/pass | wall s | speed-up vs reference |")
    print("|---|---|---|---|---|---|---|")
    print(f"| reference loop | none | {ref_passes} | {ref_passes / args.gen:.3f} | {args.gen / ref_passes:.2f} "
          f"| {ref_time:.3f} | 1.00x |")
    for sampler, cache in CONFIGS:
        params = SamplingParams(sampler=sampler, cache=cache, max_tokens=args.gen, block_length=args.block,
                                threshold=args.threshold, factor=args.factor, gamma=args.gamma,
                                ignore_eos=True)
        out, t = timed(lambda: llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0], args.repeats)
        if sampler == "llada" and cache == "none":
            assert out.token_ids == ref_tokens, "engine llada/none must equal the reference loop"
        n = out.num_forward_passes
        print(f"| {sampler} | {cache} | {n} | {n / args.gen:.3f} | {args.gen / n:.2f} | {t:.3f} | "
              f"{ref_time / t:.2f}x |")


if __name__ == "__main__":
    main()
