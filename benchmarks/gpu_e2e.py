"""End-to-end throughput on an LLaDA-8B-shaped model with random bf16 weights, built in memory.

No download and no checkpoint on disk: the model is created on the meta device and its weights
filled in place on the GPU. Requests go straight through the engine's ModelRunner (the forward,
KV caches, CUDA graphs, fused kernels and samplers) without the scheduler and tokenizer. Random
weights are never confident, so the threshold sampler commits one token per pass: the numbers
measure the cost of a pass, not how few passes a trained model needs.

    python benchmarks/gpu_e2e.py                       # batch 1, 8, 32; 512-token prompt; 256 new
    python benchmarks/gpu_e2e.py --tiny --device cpu   # seconds, for a smoke test
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm_backend.engine.engine_config import EngineConfig  # noqa: E402
from dlm_backend.engine.forward.runner import ModelRunner  # noqa: E402
from dlm_backend.engine.kernels import resolve_kernels  # noqa: E402
from dlm_backend.engine.kv import KVPool, PageAllocator  # noqa: E402
from dlm_backend.engine.kv.pool import page_size_for  # noqa: E402
from dlm_backend.engine.models.llada import LLaDAModelLM  # noqa: E402
from dlm_backend.engine.params import SamplingParams  # noqa: E402
from dlm_backend.engine.requests.canvas_sequence import CanvasSequence  # noqa: E402
from dlm_backend.engine.requests.sequence import ScheduledBatch  # noqa: E402
from dlm_backend.engine.samplers import ThresholdSampler, TokenInfo  # noqa: E402

MASK_ID = 126336


def llada_config(d_model=4096, n_layers=32, n_heads=32, mlp=12288, vocab=126464, max_len=4096) -> dict:
    """A LLaDA config.json (8B shape by default)."""
    return {"architectures": ["LLaDAModelLM"], "d_model": d_model, "n_layers": n_layers, "n_heads": n_heads,
            "n_kv_heads": n_heads, "mlp_hidden_size": mlp, "vocab_size": vocab, "embedding_size": vocab,
            "max_sequence_length": max_len, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
            "mask_token_id": min(MASK_ID, vocab - 1), "eos_token_id": vocab - 2, "weight_tying": False}


def build_random_llada(config: dict, device, dtype: torch.dtype, seed: int = 0) -> LLaDAModelLM:
    """The model for ``config`` with random weights (std 1/sqrt(fan_in), norms 1), made on ``device``."""
    with torch.device("meta"):
        model = LLaDAModelLM.from_config(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)                                   # RMSNorm weights
            else:
                p.normal_(0.0, 1.0 if name.endswith("wte.weight") else p.shape[1] ** -0.5, generator=g)
    model.setup(device)
    return model.eval()


def generate(runner: ModelRunner, allocator: PageAllocator, batch: int, prompt_len: int, new_tokens: int, block: int, seed: int = 0):
    """Run ``batch`` requests to completion; returns (sequences, per-pass records)."""
    vocab = runner.model.args.vocab_size
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(sampler="threshold", max_tokens=new_tokens, block_length=block, threshold=0.9,
                            cache="dual", ignore_eos=True)
    sampler = ThresholdSampler()
    seqs = [CanvasSequence(torch.randint(0, min(vocab, MASK_ID) - 2, (prompt_len,), generator=g).tolist(), params,
                           sampler, runner.tokens) for _ in range(batch)]
    for s in seqs:
        s.pages = allocator.allocate(allocator.pages_for(s.kv_positions))
    passes = []
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    while True:
        live = [s for s in seqs if not s.is_finished]
        if not live:
            break
        refresh = any(s.step_in_block == 0 for s in live)
        sync()
        t0 = time.perf_counter()
        runner.step(ScheduledBatch.of(live, runner.logits_shift))
        sync()
        passes.append((refresh, time.perf_counter() - t0))
    for s in seqs:
        allocator.release(s.pages)
    return seqs, passes


def measure(model, device, dtype, batch, prompt_len, new_tokens, block, hbm_tbps) -> dict:
    """Throughput numbers for one batch size (after a warm-up that compiles and captures)."""
    a = model.args
    page = page_size_for(a.block_size)
    num_pages = batch * -(-(prompt_len + new_tokens) // page)
    pool = KVPool(a.kv_shapes, page, num_pages, dtype, torch.device(device))
    allocator = PageAllocator(num_pages, page)
    config = EngineConfig(model="random", device=device)          # $DLM_KERNELS, $DLM_CUDA_GRAPHS, as the engine
    runner = ModelRunner(model, torch.device(device), dtype, TokenInfo(mask_id=a.mask_token_id), pool,
                         resolve_kernels(config.kernels, device), config.cuda_graphs)
    generate(runner, allocator, batch, prompt_len, min(new_tokens, 2 * block), block)          # warm-up
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    seqs, passes = generate(runner, allocator, batch, prompt_len, new_tokens, block)
    wall = time.perf_counter() - t0
    block_ms = [1e3 * t for r, t in passes if not r]
    refresh_ms = [1e3 * t for r, t in passes if r]
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bound_ms = weight_bytes / (hbm_tbps * 1e12) * 1e3
    step_ms = statistics.median(block_ms) if block_ms else float("nan")
    return {"batch": batch, "passes": len(passes), "passes_per_s": len(passes) / wall,
            "tokens": sum(len(s.committed_token_ids) for s in seqs), "tokens_per_s": batch * new_tokens / wall,
            "block_step_ms": step_ms, "refresh_ms": statistics.median(refresh_ms) if refresh_ms else float("nan"),
            "bw_bound_ms": bound_ms, "bw_fraction": bound_ms / step_ms,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan"),
            "graphs": bool(runner.graphs and any(s.graph is not None for s in runner.graphs.steps.values()))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--hbm-tbps", type=float, default=4.8, help="HBM bandwidth for the bound (H200: 4.8)")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer d=64 model, for smoke tests")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_e2e: no CUDA device; use --tiny --device cpu for a smoke run.")
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    config = llada_config(64, 2, 4, 160, 320, 1024) if a.tiny else llada_config()
    t0 = time.perf_counter()
    model = build_random_llada(config, a.device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e9:.2f}B params, {dtype}, built in {time.perf_counter() - t0:.1f}s on {a.device}")
    cols = ["batch", "passes", "passes_per_s", "tokens_per_s", "block_step_ms", "refresh_ms", "bw_bound_ms",
            "bw_fraction", "peak_gib", "graphs"]
    print("  ".join(f"{c:>13}" for c in cols))
    for b in (int(x) for x in a.batches.split(",")):
        r = measure(model, a.device, dtype, b, a.prompt, a.new, a.block, a.hbm_tbps)
        print("  ".join(f"{r[c]:>13.3f}" if isinstance(r[c], float) else f"{r[c]!s:>13}" for c in cols), flush=True)


if __name__ == "__main__":
    main()
