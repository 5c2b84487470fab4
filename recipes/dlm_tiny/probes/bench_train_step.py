"""One dlm-tiny training step (forward, backward, AdamW) per precision and attention layout, in one run.

The baseline is the step every committed stage up to s6 ran: float32, attention over whole packed
rows under a block-diagonal mask. Against it: per-example attention in length buckets
(dlm_tiny/example_attention.py), bf16 autocast (``--precision bf16``; native bf16 CPUs only) and,
on top of both, each layer's dense parts compiled (``--compile``, dlm_tiny/compiled.py).
Batches are the real mix: the shipped model's shape, 12 rows of 512 tokens, EOS runs drawn
log-uniformly up to 256, r1's family weights.

    python recipes/dlm_tiny/probes/bench_train_step.py              # pure diffusion, as after the AR start
    python recipes/dlm_tiny/probes/bench_train_step.py --ar-prob 1  # the autoregressive start of a run
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.engine.checkpoint.tokenizer import Tokenizer as ChatTokenizer
from dlm_tiny import corpus
from dlm_tiny.checkpoint import build_tokenizer, model_config, write_checkpoint_files
from dlm_tiny.checks import bf16_is_native
from dlm_tiny.compiled import compile_layers
from dlm_tiny.objective import PackedBatches, diffusion_loss
from dlm_tiny.train import TrainConfig, encode_examples, init_weights, parse_weights

MIX = "tool_call=0.20,json=0.16,arithmetic=0.06,list=0.07"


def batches_and_config(cfg: TrainConfig, num_examples: int, folder: Path):
    examples = corpus.generate(num_examples, seed=0, weights=parse_weights(MIX), unanswerable=0.35, qa_hard=0.6)
    tok = build_tokenizer([json.dumps(e.messages) + " " + json.dumps(e.tools or []) + " " + e.target
                           for e in examples], cfg.vocab_size)
    config = model_config(cfg, tok)
    write_checkpoint_files(folder, config, tok)
    pairs = encode_examples(examples, ChatTokenizer(folder), cfg.max_len)
    return PackedBatches(pairs, 0, cfg.max_len, cfg.rows, 256, config["eos_token_id"], "log"), config


def time_steps(config: dict, batches: PackedBatches, precision: str, per_example: bool, compiled: bool,
               steps: int, ar_prob: float) -> list[float]:
    model = DreamModel.from_config(config)
    init_weights(model, 0)
    model.setup("cpu")
    if compiled:
        compile_layers(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen, times = torch.Generator().manual_seed(0), []
    for step in range(steps + 2):               # two warm-up steps (the compiled run compiles in them)
        batch = batches(step)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = diffusion_loss(model, batch, config["mask_token_id"], gen, 0.2, 0.1, 0.05, ar_prob, per_example)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return times[2:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--ar-prob", type=float, default=0.0)
    parser.add_argument("--examples", type=int, default=4000)
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    cfg = replace(TrainConfig(), vocab_size=4096)
    with tempfile.TemporaryDirectory() as folder:
        batches, config = batches_and_config(cfg, args.examples, Path(folder))
    runs = [("float32", False, False), ("float32", True, False)]
    runs += [("bf16", False, False), ("bf16", True, False), ("bf16", True, True)] if bf16_is_native() else []
    print(f"| precision | attention | compiled | s / step (median of {args.steps}) | speed-up |")
    print("|---|---|---|---|---|")
    base = None
    for precision, per_example, compiled in runs:
        median = statistics.median(time_steps(config, batches, precision, per_example, compiled, args.steps,
                                              args.ar_prob))
        base = base or median
        layout = "length buckets" if per_example else "row mask"
        print(f"| {precision} | {layout} | {'yes' if compiled else 'no'} | {median:.3f} | {base / median:.2f}x |",
              flush=True)
    if not bf16_is_native():
        print("(bf16 rows left out: this CPU has no native bf16)")


if __name__ == "__main__":
    main()
