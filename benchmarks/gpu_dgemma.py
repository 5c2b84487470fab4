"""DiffusionGemma on a 26B-A4B-shaped model with random bf16 weights (25B parameters, 50 GB: one H200).

No download: the model is built on the meta device and filled in place on the GPU
(benchmarks/random_checkpoint.py). Requests go straight through the engine's ModelRunner (paged KV
pool, fused-MoE kernel, the ``diffusiongemma`` sampler) without the scheduler and tokenizer.
Random weights are never confident, so every canvas takes ``max_denoising_steps`` decoder steps:
the numbers are the cost of a step and of the committed tokens it buys at that step count. The
bound is the time to read, at the HBM bandwidth, every weight a decoder step touches: attention,
the dense MLPs, routers, the tied embedding twice (the LM head, and the self-conditioning's
softmax times the embedding), and the routed experts the canvas's tokens actually chose (counted
from the routers' decisions).

Shape (notes section 4.2, partly third-party): hidden 2816, 30 layers (five sliding of window 1024
to one full, the last full), 16 query heads; sliding layers 8 KV heads of 256, full layers 2 of 512
with V = K; 128 experts of width 704, top 8, beside a dense MLP of 2112; vocabulary 262144; canvas 256.

    python benchmarks/gpu_dgemma.py                        # batch 1 and 8; prompt 512; 2 canvases; 16 steps
    python benchmarks/gpu_dgemma.py --tiny --device cpu    # seconds, for a smoke test
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_moe import ExpertCounter, drive, quantized, split_bytes  # noqa: E402
from random_checkpoint import dgemma_config, random_model  # noqa: E402

from dlm_backend.engine.engine_config import EngineConfig  # noqa: E402
from dlm_backend.engine.forward.runner import ModelRunner  # noqa: E402
from dlm_backend.engine.kernels import resolve_kernels  # noqa: E402
from dlm_backend.engine.kv import KVPool, PageAllocator  # noqa: E402
from dlm_backend.engine.kv.pool import page_size_for  # noqa: E402
from dlm_backend.engine.models.diffusion_gemma import GemmaExperts, GemmaRouter  # noqa: E402
from dlm_backend.engine.params import SamplingParams  # noqa: E402
from dlm_backend.engine.quant.methods import METHODS  # noqa: E402
from dlm_backend.engine.requests.uniform_sequence import UniformSequence  # noqa: E402
from dlm_backend.engine.samplers import DiffusionGemmaSampler, TokenInfo  # noqa: E402


def big_config() -> dict:
    return dgemma_config(hidden=2816, layers=30, vocab=262144, heads=16, kv_heads=8, experts=128, canvas=256,
                         max_len=8192, window=1024, top_k=8, intermediate=2112, moe_width=704, head_dim=256,
                         global_head_dim=512, global_kv_heads=2)


def tiny_config() -> dict:
    return dgemma_config(hidden=64, layers=3, vocab=512, heads=4, kv_heads=2, experts=8, canvas=16, max_len=1024,
                         window=8, top_k=2)


def weight_bytes(model) -> tuple[int, int]:
    """(bytes a decoder step reads whatever the routing, bytes of one routed expert)."""
    always, per_expert = split_bytes(model, [m for m in model.modules() if isinstance(m, GemmaExperts)])
    embed = model.model.decoder.embed_tokens.weight
    always += embed.numel() * embed.element_size()     # read twice: the head, and probs @ E for self-conditioning
    return always, per_expert


def run(runner, alloc, model, batch, prompt_len, new_tokens, steps, counter=None, seed=0):
    """``batch`` requests to completion; per-pass records (kind, seconds, experts touched or 0)."""
    a = model.args
    params = SamplingParams(sampler="diffusiongemma", max_tokens=new_tokens, block_length=a.block_size,
                            max_denoising_steps=steps, confidence_threshold=0.0, ignore_eos=True, seed=seed)
    g = torch.Generator().manual_seed(seed)
    seqs = [UniformSequence(torch.randint(3, a.vocab_size, (prompt_len,), generator=g).tolist(), params,
                            DiffusionGemmaSampler(), runner.tokens) for _ in range(batch)]
    return seqs, drive(runner, alloc, model, seqs, counter)


def measure(model, device, batch, prompt_len, new_tokens, steps, hbm_tbps) -> dict:
    """Committed tokens per second, the median decoder step and its weight-read bound for one batch."""
    a = model.args
    page = page_size_for(a.block_size)
    pages = batch * -(-(prompt_len + new_tokens + a.block_size) // page)
    dtype = next(model.parameters()).dtype
    alloc = PageAllocator(pages, page)
    pool = KVPool(a.kv_shapes, page, pages, dtype, torch.device(device))
    triton = resolve_kernels(EngineConfig(model="random", device=device).kernels, device)
    runner = ModelRunner(model, torch.device(device), dtype, TokenInfo(mask_id=-1, vocab_size=a.vocab_size), pool,
                         triton, cuda_graphs=False)
    routers = (m for m in model.modules() if isinstance(m, GemmaRouter))
    with ExpertCounter(routers) as counter:                # which experts a step touches (also the warm-up)
        _, census = run(runner, alloc, model, batch, prompt_len, a.block_size, 2, counter)
    experts = statistics.median(e for kind, _, e in census if kind == "denoise")
    t0 = time.perf_counter()
    seqs, records = run(runner, alloc, model, batch, prompt_len, new_tokens, steps)
    wall = time.perf_counter() - t0
    step_s = statistics.median(t for kind, t, _ in records if kind == "denoise")
    encode_s = statistics.median(t for kind, t, _ in records if kind == "cache")
    always, per_expert = weight_bytes(model)
    bound_s = (always + experts * per_expert) / (hbm_tbps * 1e12)
    tokens = sum(len(s.committed_token_ids) for s in seqs)
    return {"batch": batch, "passes": len(records), "tokens": tokens, "tokens_per_s": tokens / wall,
            "step_ms": 1e3 * step_s, "encode_ms": 1e3 * encode_s, "experts_per_step": experts,
            "bound_ms": 1e3 * bound_s, "bound_fraction": bound_s / step_s}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--canvases", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16, help="max_denoising_steps (the reference default is 48)")
    ap.add_argument("--hbm-tbps", type=float, default=4.8, help="HBM bandwidth for the bound (H200: 4.8)")
    ap.add_argument("--tiny", action="store_true", help="a 3-layer hidden-64 model, for smoke tests")
    ap.add_argument("--quantization", choices=list(METHODS), default=None, help="quantize the random weights")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_dgemma: no CUDA device; use --tiny --device cpu for a smoke run.")
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    t0 = time.perf_counter()
    model = quantized(random_model(tiny_config() if a.tiny else big_config(), a.device, dtype), a.quantization,
                      a.device)
    n = sum(p.numel() for p in model.parameters())
    print(f"model: DiffusionGemma 26B-A4B shape, {n / 1e9:.2f}B params, {dtype}, built in "
          f"{time.perf_counter() - t0:.1f}s; {a.steps} steps a canvas of {model.args.block_size}")
    cols = ["batch", "passes", "tokens", "tokens_per_s", "step_ms", "encode_ms", "experts_per_step", "bound_ms",
            "bound_fraction"]
    print("  ".join(f"{c:>16}" for c in cols))
    for b in (int(x) for x in a.batches.split(",")):
        r = measure(model, a.device, b, a.prompt, a.canvases * model.args.block_size, a.steps, a.hbm_tbps)
        print("  ".join(f"{r[c]:>16.3f}" if isinstance(r[c], float) else f"{r[c]!s:>16}" for c in cols), flush=True)


if __name__ == "__main__":
    main()
