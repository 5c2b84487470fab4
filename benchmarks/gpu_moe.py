"""Block diffusion on an LLaDA2.0-mini-shaped MoE with random bf16 weights (16B, fits one H200).

No download: the model is built on the meta device and filled in place on the GPU
(benchmarks/random_checkpoint.py). Requests go straight through the engine's ModelRunner (paged KV
pool, paged-attention and fused-MoE kernels, CUDA graphs, the llada2 sampler) without the
scheduler and tokenizer. Random weights are never confident, so each pass commits one token: the
numbers measure the cost of a pass. The bound is the time to read, at the HBM bandwidth, every
weight a pass touches: attention, the dense layer, routers, shared experts, the LM head, and the
routed experts the batch's tokens actually chose (counted per pass from the routers' decisions).

    python benchmarks/gpu_moe.py                       # batch 1, 8, 32; 512-token prompt; 256 new
    python benchmarks/gpu_moe.py --tiny --device cpu   # seconds, for a smoke test
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

from random_checkpoint import block_config, random_model  # noqa: E402

from dlm_backend.engine.quant.methods import METHODS, quantize_model, quantized_summary  # noqa: E402

from dlm_backend.engine.engine_config import EngineConfig  # noqa: E402
from dlm_backend.engine.forward.runner import ModelRunner  # noqa: E402
from dlm_backend.engine.kernels import resolve_kernels  # noqa: E402
from dlm_backend.engine.kv import KVPool, PageAllocator  # noqa: E402
from dlm_backend.engine.kv.pool import page_size_for  # noqa: E402
from dlm_backend.engine.models.llada2 import LLaDA2MoeSparseMoeBlock  # noqa: E402
from dlm_backend.engine.params import SamplingParams  # noqa: E402
from dlm_backend.engine.requests.block_sequence import BlockSequence  # noqa: E402
from dlm_backend.engine.requests.sequence import ScheduledBatch  # noqa: E402
from dlm_backend.engine.samplers import LLaDA2Sampler, TokenInfo  # noqa: E402


def mini_config() -> dict:
    """LLaDA2.0-mini's shape (notes: hidden 2048, 20 layers, 16/4 heads of 128, dense FFN 5120, 256
    experts of width 512, top-8 in 4 of 8 groups, one shared expert, vocabulary 157184)."""
    c = block_config("llada2", hidden=2048, layers=20, vocab=157184, heads=16, kv_heads=4, experts=256,
                     max_len=4096)
    return {**c, "head_dim": 128, "intermediate_size": 5120, "moe_intermediate_size": 512, "num_experts_per_tok": 8,
            "n_group": 8, "topk_group": 4, "mask_token_id": 156895, "eos_token_id": 156892, "pad_token_id": 156892}


def tiny_config() -> dict:
    return block_config("llada2", hidden=64, layers=3, vocab=512, heads=4, kv_heads=2, experts=16, max_len=1024)


class ExpertCounter:
    """Unique routed experts per MoE layer in each forward, from hooks on ``routers`` (modules whose
    output starts with ``topk_idx``; a host sync per layer: used on an eager runner only, never inside
    a captured graph)."""

    def __init__(self, routers):
        self.routers = list(routers)
        self.touched: list[int] = []
        self.hooks = []

    def __enter__(self) -> "ExpertCounter":
        self.hooks = [r.register_forward_hook(lambda mod, inp, out: self.touched.append(int(out[0].unique().numel())))
                      for r in self.routers]
        return self

    def __exit__(self, *exc) -> None:
        for h in self.hooks:
            h.remove()

    def take(self) -> int:
        n, self.touched = sum(self.touched), []
        return n


def _tensors(module) -> list:
    """A module's parameters and buffers: quantized weights are buffers (engine/quant)."""
    return [*module.parameters(), *module.buffers()]


def split_bytes(model, experts: list) -> tuple[int, int]:
    """(bytes of every weight outside the ``experts`` modules, bytes of one expert of them)."""
    routed = {id(t) for e in experts for t in _tensors(e)}
    always = sum(t.numel() * t.element_size() for t in _tensors(model) if id(t) not in routed)
    per_stack = sum(t.numel() * t.element_size() for t in _tensors(experts[0]))
    return always, per_stack // experts[0].down_proj.shape[0]


def quantized(model, method: str | None, device: str):
    """``model`` with ``--quantization`` applied in memory (what ``quantization=`` does at load)."""
    if method:
        quantize_model(model, method, device, next(model.parameters()).dtype)
        print(f"quantized: {method} ({', '.join(f'{n} x {k}' for k, n in quantized_summary(model)[0].items())})")
    return model


def moe_blocks(model) -> list:
    return [m for m in model.modules() if isinstance(m, LLaDA2MoeSparseMoeBlock)]


def weight_bytes(model) -> tuple[int, int]:
    """(bytes read by every pass whatever the routing, bytes of one routed expert)."""
    always, per_expert = split_bytes(model, [b.experts for b in moe_blocks(model)])
    embed = model.model.word_embeddings.weight
    always -= embed.numel() * embed.element_size()          # a pass gathers a few rows, not the table
    return always, per_expert


def drive(runner, alloc, model, seqs, counter=None) -> list[tuple]:
    """Run ``seqs`` to completion on their own pages; per-pass records (kind, seconds, experts touched or 0)."""
    for s in seqs:
        s.pages = alloc.allocate(alloc.pages_for(s.kv_positions))
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    records = []
    while live := [s for s in seqs if not s.is_finished]:
        kind = live[0].plan(model.logits_shift).kind
        sync()
        t0 = time.perf_counter()
        runner.step(ScheduledBatch.of(live, runner.logits_shift))
        sync()
        records.append((kind, time.perf_counter() - t0, counter.take() if counter else 0))
    for s in seqs:
        alloc.release(s.pages)
    return records


def run(runner, alloc, model, batch, prompt_len, new_tokens, block, counter=None, seed=0):
    """``batch`` requests to completion; per-pass records (kind, seconds, experts touched or 0)."""
    vocab, mask = model.args.vocab_size, runner.tokens.mask_id
    params = SamplingParams(sampler="llada2", max_tokens=new_tokens, block_length=block, threshold=0.95,
                            cache="prefix", ignore_eos=True)
    g = torch.Generator().manual_seed(seed)
    seqs = [BlockSequence(torch.randint(0, min(vocab, mask) - 8, (prompt_len,), generator=g).tolist(), params,
                          LLaDA2Sampler(), runner.tokens) for _ in range(batch)]
    return seqs, drive(runner, alloc, model, seqs, counter)


def measure(model, device, batch, prompt_len, new_tokens, block, hbm_tbps) -> dict:
    """Throughput, the median denoising pass and its weight-read bound for one batch size."""
    a = model.args
    page = page_size_for(block)
    pages = batch * -(-(prompt_len + new_tokens + block) // page)
    dtype = next(model.parameters()).dtype
    alloc = PageAllocator(pages, page)
    pool = KVPool(a.kv_shapes, page, pages, dtype, torch.device(device))
    config = EngineConfig(model="random", device=device)
    triton = resolve_kernels(config.kernels, device)
    tokens = TokenInfo(mask_id=a.mask_token_id)
    # Which experts a pass touches: two blocks on an eager runner with hooks on the routers.
    with ExpertCounter(b.gate for b in moe_blocks(model)) as counter:
        eager = ModelRunner(model, torch.device(device), dtype, tokens, pool, triton, cuda_graphs=False)
        _, census = run(eager, alloc, model, batch, prompt_len, 2 * block, block, counter)
    experts = statistics.median(e for kind, _, e in census if kind == "denoise")
    runner = ModelRunner(model, torch.device(device), dtype, tokens, pool, triton, config.cuda_graphs)
    run(runner, alloc, model, batch, prompt_len, min(new_tokens, 2 * block), block)           # warm-up, capture
    t0 = time.perf_counter()
    seqs, records = run(runner, alloc, model, batch, prompt_len, new_tokens, block)
    wall = time.perf_counter() - t0
    step_s = statistics.median(t for kind, t, _ in records if kind == "denoise")
    always, per_expert = weight_bytes(model)
    bound_s = (always + experts * per_expert) / (hbm_tbps * 1e12)
    return {"batch": batch, "passes": len(records), "passes_per_s": len(records) / wall,
            "tokens_per_s": sum(len(s.committed_token_ids) for s in seqs) / wall, "step_ms": 1e3 * step_s,
            "experts_per_pass": experts, "bound_ms": 1e3 * bound_s, "bound_fraction": bound_s / step_s,
            "graphs": bool(runner.graphs and any(s.graph is not None for s in runner.graphs.steps.values()))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--hbm-tbps", type=float, default=4.8, help="HBM bandwidth for the bound (H200: 4.8)")
    ap.add_argument("--tiny", action="store_true", help="a 3-layer hidden-64 MoE, for smoke tests")
    ap.add_argument("--quantization", choices=list(METHODS), default=None, help="quantize the random weights")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_moe: no CUDA device; use --tiny --device cpu for a smoke run.")
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    t0 = time.perf_counter()
    model = quantized(random_model(tiny_config() if a.tiny else mini_config(), a.device, dtype), a.quantization,
                      a.device)
    n = sum(p.numel() for p in model.parameters())       # float ones: quantized weights are buffers
    print(f"model: LLaDA2-mini shape, {n / 1e9:.2f}B params, {dtype}, built in {time.perf_counter() - t0:.1f}s")
    cols = ["batch", "passes", "passes_per_s", "tokens_per_s", "step_ms", "experts_per_pass", "bound_ms",
            "bound_fraction", "graphs"]
    print("  ".join(f"{c:>16}" for c in cols))
    for b in (int(x) for x in a.batches.split(",")):
        r = measure(model, a.device, b, a.prompt, a.new, a.block, a.hbm_tbps)
        print("  ".join(f"{r[c]:>16.3f}" if isinstance(r[c], float) else f"{r[c]!s:>16}" for c in cols), flush=True)


if __name__ == "__main__":
    main()
