"""Seconds a step of `dlm train` for the shipped dlm-tiny shape on one device, from the run's own log.

    python recipes/dlm_tiny/probes/bench_train_device.py --device cuda --precision bf16   # on a GPU
    python recipes/dlm_tiny/probes/bench_train_device.py --device cpu --steps 30          # for the ratio

Pure diffusion (``--ar-until 0``, as after the first quarter of a run), the default family mix, 12
rows of 512 tokens. The first ``--skip`` steps (allocator and kernel warm-up) are left out. The
from-scratch recipe (train.sh) is 7700 steps in four stages: the last line multiplies s / step by
them, about the recipe's time on this device (stage 1's autoregressive start is slower a step).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

from dlm_tiny.train import TrainConfig, train

RECIPE_STEPS = 7700             # train.sh: 5200 + 700 + 1200 + 600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--skip", type=int, default=10)
    parser.add_argument("--num-examples", type=int, default=5000)
    args = parser.parse_args()
    if not 1 <= args.skip < args.steps:
        parser.error(f"--skip {args.skip} must be 1 or more and under --steps {args.steps}")
    with tempfile.TemporaryDirectory() as folder:
        cfg = replace(TrainConfig(), out_dir=folder, steps=args.steps, num_examples=args.num_examples, ar_until=0.0,
                      precision=args.precision, device=args.device, save_every=10**9)
        train(cfg)
        rows = [line.split(",") for line in (Path(folder) / "loss.csv").read_text().splitlines()]
    clock = {int(r[0]): float(r[3]) for r in rows}
    per_step = (clock[args.steps] - clock[args.skip]) / (args.steps - args.skip)
    print(f"| device | precision | steps timed | s / step | {RECIPE_STEPS}-step recipe |")
    print("|---|---|---|---|---|")
    print(f"| {args.device} | {args.precision} | {args.steps - args.skip} | {per_step:.3f} | "
          f"{per_step * RECIPE_STEPS / 60:.0f} min |")


if __name__ == "__main__":
    main()
