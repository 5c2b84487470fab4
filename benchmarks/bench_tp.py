"""Tensor parallelism: what a pass sends between ranks, and what splitting costs against one device.

For each model and tensor-parallel size, the same greedy batch runs through ``LLM`` (scheduler, rank 0
broadcasting each forward's inputs, the workers' shards); the table gives the engine's forwards, the
wall time per forward, the payload bytes per forward of each collective (all-reduce: embedding,
attention, MLP/MoE; all-gather: the LM head's rows the sampler reads; broadcast: the pickled step
inputs), the time against TP 1, and whether every token equals TP 1's.

On CPU the ranks are processes over gloo on shared cores: a correctness and overhead figure, not a
speed claim. On GPUs (``benchmarks/gpu_check.sh`` runs it when more than one is visible) the random
LLaDA-8B and LLaDA2.0-mini shapes are written to a temporary folder (``--layers`` of them: every rank
reads a checkpoint, and the full 16B would take most of the check's budget to write) and run in bf16.

    python benchmarks/bench_tp.py                                   # CPU: the five tiny fixtures, TP 1 and 2
    python benchmarks/bench_tp.py --models llada-small --layers 4      # CPU, a compute-bound shape
    python benchmarks/bench_tp.py --device cuda --models llada-8b,llada2-mini --sizes 1,2,4 --layers 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from random_checkpoint import block_config, write_checkpoint  # noqa: E402

from dlm_backend import LLM  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
TINY = {
    "llada-tiny": (FIXTURES / "parity" / "llada-tiny", {}),
    "dream-tiny": (FIXTURES / "parity" / "dream-tiny", {}),
    "llada2-tiny": (FIXTURES / "parity-block" / "llada2-tiny", {"mask_token_id": 494}),
    "sdar-tiny": (FIXTURES / "parity-block" / "sdar-tiny", {}),
    "dgemma-tiny": (FIXTURES / "parity-block" / "diffusiongemma-tiny", {}),
}
#: DiffusionGemma samples (no greedy mode): seeded, its canvases turn on fp32 rounding (they change
#: with one device's thread count too), so its "tokens = TP1" may read NO where its logits agree.
SEEDED = {"dgemma-tiny"}


def llada_8b(layers: int) -> dict:
    """LLaDA-8B's shape (d 4096, 32 heads, MLP 12288, vocabulary 126464), ``layers`` of its 32."""
    return {"architectures": ["LLaDAModelLM"], "d_model": 4096, "n_heads": 32, "n_kv_heads": 32, "n_layers": layers,
            "mlp_hidden_size": 12288, "vocab_size": 126464, "embedding_size": 126464, "max_sequence_length": 4096,
            "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "mask_token_id": 126336, "eos_token_id": 126081,
            "weight_tying": False}


def llada2_mini(layers: int) -> dict:
    """LLaDA2.0-mini's shape (benchmarks/gpu_moe.py), ``layers`` of its 20."""
    c = block_config("llada2", hidden=2048, layers=layers, vocab=157184, heads=16, kv_heads=4, experts=256,
                     max_len=4096)
    return {**c, "head_dim": 128, "intermediate_size": 5120, "moe_intermediate_size": 512, "num_experts_per_tok": 8,
            "n_group": 8, "topk_group": 4, "mask_token_id": 156895, "eos_token_id": 156892, "pad_token_id": 156892}


def llada_small(layers: int) -> dict:
    """A LLaDA shape where the CPU's matmuls, not the ranks' messages, take most of a pass (d 1024)."""
    return {**llada_8b(layers), "d_model": 1024, "n_heads": 8, "n_kv_heads": 8, "mlp_hidden_size": 4096,
            "vocab_size": 4096, "embedding_size": 4096, "mask_token_id": 4095, "eos_token_id": 4094}


SHAPES = {"llada-8b": llada_8b, "llada2-mini": llada2_mini, "llada-small": llada_small}


def run(folder: Path, overrides: dict, tp: int, args, seeded: bool = False) -> dict:
    llm = LLM(str(folder), device=args.device, dtype=args.dtype, tensor_parallel_size=tp, config_overrides=overrides)
    try:
        knobs = {"seed": 0} if seeded else {"temperature": 0.0}
        params = llm.sampling_params(ignore_eos=True, max_tokens=args.max_tokens, **knobs)
        prompts = [[5 + i + j for j in range(args.prompt_len)] for i in range(args.batch)]
        llm.generate(prompt_token_ids=prompts[:1], sampling_params=params)          # warm up
        engine = llm.engine
        group = engine.workers.group if engine.workers is not None else None
        if group is not None:
            group.bytes.clear()
        steps, t0 = engine.stats.steps, time.perf_counter()
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        wall, forwards = time.perf_counter() - t0, engine.stats.steps - steps
        sent = dict(group.bytes) if group is not None else {}
        return {"tokens": [o.token_ids for o in outs], "forwards": forwards, "s_per_forward": wall / forwards,
                "tok_s": sum(len(o.token_ids) for o in outs) / wall,
                "bytes": {k: v / forwards for k, v in sent.items()}}
    finally:
        llm.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--models", default=None, help=f"comma-separated, of {', '.join([*TINY, *SHAPES])}")
    p.add_argument("--sizes", default="1,2", help="tensor-parallel sizes (1 first: the reference)")
    p.add_argument("--layers", type=int, default=4, help="layers of a random full-size shape")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    names = (args.models or ",".join(TINY if args.device == "cpu" else SHAPES)).split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"device {args.device}, {args.dtype}, batch {args.batch} x {args.prompt_len}-token prompts, "
          f"{args.max_tokens} new tokens, greedy (DiffusionGemma: seeded)")
    print(f"{'model':<12} {'TP':>2} {'forwards':>8} {'ms/fwd':>8} {'vs TP1':>7} {'tok/s':>8} {'all_reduce B':>13} "
          f"{'all_gather B':>13} {'broadcast B':>12}  tokens = TP1")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            if name in TINY:
                folder, overrides = TINY[name]
            else:
                folder, overrides = write_checkpoint(SHAPES[name](args.layers), Path(tmp) / name), {}
            base = None
            for tp in sizes:
                r = run(folder, overrides, tp, args, seeded=name in SEEDED)
                base = base or r
                b = r["bytes"]
                print(f"{name:<12} {tp:>2} {r['forwards']:>8} {r['s_per_forward'] * 1e3:>8.2f} "
                      f"{r['s_per_forward'] / base['s_per_forward']:>6.2f}x {r['tok_s']:>8.1f} "
                      f"{b.get('all_reduce', 0):>13,.0f} "
                      f"{b.get('all_gather', 0):>13,.0f} {b.get('broadcast', 0):>12,.0f}  "
                      f"{'yes' if r['tokens'] == base['tokens'] else 'NO'}", flush=True)


if __name__ == "__main__":
    main()
