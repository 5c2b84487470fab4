"""Quantized execution against float32: a block pass of a medium LLaDA-shaped model (random weights).

For each precision (float32, bf16, int8, int4, fp8), the same random model quantized in memory
(``quant.methods.quantize_model``: what ``quantization=`` does at load): the median time of a block
pass (32 masked positions per request reading the prompt's cached keys, LLaDA's ``cache="dual"``)
at batch 1 and 8, the weights' memory, the logits' error against float32 on the same 8 x 160
canvases (max |diff| over the logits' std) and the greedy agreement (argmax equal at masked positions).
Ratios (``x_b*``) are to the first precision listed (float32 by default), measured in the same run;
the logits' error and agreement are against the first one too.

    python benchmarks/bench_quant.py                      # d_model 1024, 8 layers (~170M params)
    python benchmarks/bench_quant.py --tiny               # seconds, a smoke test
    python benchmarks/bench_quant.py --device cuda --dims 4096,32,11008   # LLaDA-8B-shaped on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_e2e import build_random_llada, generate, llada_config  # noqa: E402

from dlm_backend.engine.engine_config import EngineConfig  # noqa: E402
from dlm_backend.engine.forward.runner import ModelRunner  # noqa: E402
from dlm_backend.engine.kernels import resolve_kernels  # noqa: E402
from dlm_backend.engine.kv import KVPool, PageAllocator  # noqa: E402
from dlm_backend.engine.kv.pool import page_size_for  # noqa: E402
from dlm_backend.engine.quant.methods import quantize_model  # noqa: E402
from dlm_backend.engine.samplers import TokenInfo  # noqa: E402
from dlm_backend.parity.forward import packed_logits  # noqa: E402

PRECISIONS = ("float32", "bfloat16", "int8", "int4", "fp8")


def build(config: dict, precision: str, device: str):
    """The seed-0 random model at ``precision`` (quantized ones compute in float32 on CPU, bf16 on GPU)."""
    float_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    dtype = torch.bfloat16 if precision == "bfloat16" else float_dtype
    model = build_random_llada(config, device, float_dtype)
    if precision == "bfloat16":
        model = model.to(torch.bfloat16)
        model.setup(device)
    elif precision != "float32":
        quantize_model(model, precision, device, dtype)
    return model, dtype


class Timed:
    """One model's runner and KV pool at one batch size; :meth:`round` times the block passes of one
    generation (the first pass of each block, which also refreshes the prompt's keys, excluded)."""

    def __init__(self, model, dtype, device: str, batch: int, prompt: int, block: int):
        a = model.args
        page = page_size_for(a.block_size)
        pages = batch * -(-(prompt + 2 * block) // page)
        pool = KVPool(a.kv_shapes, page, pages, dtype, torch.device(device))
        self.allocator = PageAllocator(pages, page)
        self.runner = ModelRunner(model, torch.device(device), dtype, TokenInfo(mask_id=a.mask_token_id), pool,
                                  resolve_kernels(EngineConfig(model="random", device=device).kernels, device), False)
        self.batch, self.prompt, self.block, self.times = batch, prompt, block, []
        self.round()                                                                     # warm-up
        self.times = []

    def round(self) -> None:
        _, recs = generate(self.runner, self.allocator, self.batch, self.prompt, self.block, self.block)
        self.times += [t for refresh, t in recs if not refresh]

    @property
    def ms(self) -> float:
        return 1e3 * statistics.median(self.times)


@torch.inference_mode()
def quality(model, reference: torch.Tensor, rows: torch.Tensor, masked: torch.Tensor) -> tuple[float, float]:
    """(max |logit diff| / std of the reference logits, greedy agreement at the masked positions)."""
    got = packed_logits(model, rows, None).float()
    err = float((got - reference).abs().max() / reference.std())
    agree = float((got.argmax(-1) == reference.argmax(-1))[masked].float().mean())
    return err, agree


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dims", default="1024,8,2816", help="d_model,layers,mlp width")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3, help="generations per precision and batch (round-robin)")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--tiny", action="store_true", help="d_model 128, 2 layers: a smoke test")
    a = ap.parse_args(argv)
    d, layers, mlp = (128, 2, 352) if a.tiny else (int(x) for x in a.dims.split(","))
    vocab = 1024 if a.tiny else a.vocab
    config = llada_config(d, layers, max(1, d // 128), mlp, vocab, 4096)
    torch.manual_seed(0)
    rows = torch.randint(0, vocab - 3, (8, a.prompt + a.block), device=a.device)
    rows[:, a.prompt:] = config["mask_token_id"]
    masked = torch.zeros_like(rows, dtype=torch.bool)
    masked[:, a.prompt:] = True
    batches = [int(b) for b in a.batches.split(",")]
    print(f"LLaDA-shaped d_model {d}, {layers} layers, mlp {mlp}, vocab {vocab}; {a.device}, "
          f"{torch.get_num_threads()} threads; block {a.block} after a {a.prompt}-token prompt")
    cols = ["precision", "weights_MiB"] + [f"ms_b{b}" for b in batches] + [f"x_b{b}" for b in batches] + \
           ["logit_err", "greedy_agree"]
    print("  ".join(f"{c:>13}" for c in cols))
    reference, built = None, {}
    for precision in a.precisions.split(","):
        model, dtype = build(config, precision, a.device)
        if reference is None:
            reference = packed_logits(model, rows, None).float()
        mib = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())) / 2**20
        built[precision] = (mib, *quality(model, reference, rows, masked),
                            {b: Timed(model, dtype, a.device, b, a.prompt, a.block) for b in batches})
    # Round-robin: every precision's passes spread over the same minutes, so a neighbour's load on a
    # shared machine slows them alike and the ratios hold.
    for _ in range(a.rounds):
        for *_, timed in built.values():
            for t in timed.values():
                t.round()
    base = built[next(iter(built))][3]
    for precision, (mib, err, agree, timed) in built.items():
        row = [precision, f"{mib:.0f}"] + [f"{timed[b].ms:.1f}" for b in batches] + \
              [f"{base[b].ms / timed[b].ms:.2f}" for b in batches] + [f"{err:.4f}", f"{agree:.3f}"]
        print("  ".join(f"{c:>13}" for c in row), flush=True)

if __name__ == "__main__":
    main()
