"""How far bf16 rounding moves a dlm-tiny gradient, eager and with ``--compile``, against float32.

Loads a checkpoint, draws three training batches of the recipe's mix (stage 1's EOS runs, fixed
masks), and prints each batch's loss and the relative distance ``|g - g_ref| / |g_ref|`` of the
full gradient in bf16 eager and bf16 compiled to the float32 gradient, and between the two bf16
ones. If compiling biased training, the compiled gradient would sit further from float32 than the
eager one; if it only rounds differently, the two sit about as far, and from each other.

    python benchmarks/grad_rounding_probe.py runs/dlm-tiny-w1/model
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.engine.tokenizer import Tokenizer as ChatTokenizer
from dlm_backend.training import corpus
from dlm_backend.training.compiled import compile_layers
from dlm_backend.training.objective import PackedBatches, diffusion_loss
from dlm_backend.training.train import encode_examples, parse_weights

MIX = "qa=0.26,tool_call=0.20,json=0.16,arithmetic=0.06,list=0.07"     # scripts/train_dlm_tiny.sh


def gradients(folder: Path, config: dict, batches: PackedBatches, precision: str, compiled: bool,
              count: int) -> list[tuple[float, torch.Tensor]]:
    model = DreamModel.from_config(config)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    model.setup("cpu")
    if compiled:
        compile_layers(model)
    out = []
    for step in range(count):
        gen = torch.Generator().manual_seed(step)            # the same masks in every variant
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = diffusion_loss(model, batches(step), config["mask_token_id"], gen, 0.2, 0.1, 0.05, 0.0,
                                  per_example=precision == "bf16")
        loss.backward()
        out.append((loss.item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    folder = Path(args.model)
    config = json.loads((folder / "config.json").read_text())
    examples = corpus.generate(2000, seed=5, split="train", weights=parse_weights(MIX), unanswerable=0.2, qa_hard=0.7)
    pairs = encode_examples(examples, ChatTokenizer(folder), 512)
    batches = PackedBatches(pairs, 0, 512, 12, 40, config["eos_token_id"], "uniform")
    runs = [gradients(folder, config, batches, p, c, args.batches)
            for p, c in (("float32", False), ("bf16", False), ("bf16", True))]
    print("| batch | loss float32 | bf16 eager | bf16 compiled | eager to float32 | compiled to float32 | eager to compiled |")
    print("|---|---|---|---|---|---|---|")
    for i, ((l0, g0), (l1, g1), (l2, g2)) in enumerate(zip(*runs)):
        def dist(a, b):
            return ((a - b).norm() / b.norm()).item()
        print(f"| {i} | {l0:.5f} | {l1:.5f} | {l2:.5f} | {dist(g1, g0):.4f} | {dist(g2, g0):.4f} | {dist(g2, g1):.4f} |")


if __name__ == "__main__":
    main()
