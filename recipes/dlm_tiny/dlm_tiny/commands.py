"""`dlm train` and `dlm eval`: this recipe's ``register_commands`` hook, found through its entry point
(``[project.entry-points.dlm_backend] dlm_tiny = "dlm_tiny.commands"``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from dlm_backend import hookimpl


def _train(args) -> int:
    from dlm_tiny.train import TrainConfig, train

    overrides = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name, None) is not None}
    print(train(TrainConfig(**overrides)))
    return 0


def _eval(args) -> int:
    if args.set != "heldout":
        return _eval_handwritten(args)
    from dlm_tiny.evaluate import block_configs, default_configs, evaluate, format_table, plot, select_configs

    max_tokens = 64 if args.max_tokens is None else args.max_tokens
    configs = None          # every config of the checkpoint's kind
    if args.configs:
        configs = select_configs(default_configs(max_tokens, args.block_length) + block_configs(max_tokens), args.configs)
    rows = evaluate(args.model, per_family=args.per_family, configs=configs, max_tokens=max_tokens,
                    block_length=args.block_length)
    out = _write(args.out, rows, format_table(rows))
    if plot(rows, out / "accuracy_vs_passes.png"):
        print(f"plot: {out / 'accuracy_vs_passes.png'}")
    return 0


def _eval_handwritten(args) -> int:
    """The hand-written set (or another file of its shape): the model's own decoding and llada."""
    from dlm_tiny.handwritten import evaluate, format_table

    path = None if args.set == "handwritten" else args.set
    max_tokens = 128 if args.max_tokens is None else args.max_tokens     # the longest expected reply is 112
    rows, replies = evaluate(args.model, path=path, max_tokens=max_tokens, labels=args.configs)
    out = _write(args.out, rows, format_table(rows))
    (out / "replies.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in replies))
    return 0


def _write(out: str, rows: list[dict], table: str) -> Path:
    """Print the table and keep it, with its rows, in ``out`` (created)."""
    print(table)
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "eval.json").write_text(json.dumps(rows, indent=2))
    (path / "eval.md").write_text(table + "\n")
    return path


@hookimpl
def register_commands(subparsers):
    from dlm_tiny.train_config import TrainConfig

    p = subparsers.add_parser("train", help="train dlm-tiny from scratch (masked-diffusion SFT)")
    for f in fields(TrainConfig):
        kind = {"action": argparse.BooleanOptionalAction} if isinstance(f.default, bool) else {"type": type(f.default)}
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, help=f"default {f.default}", **kind)
    p.set_defaults(func=_train)
    p = subparsers.add_parser("eval", help="held-out quality and speed for every sampler and cache mode")
    p.add_argument("model", nargs="?", default=None, help="checkpoint (default: $DLM_MODEL, else the embedded dlm-tiny)")
    p.add_argument("--set", default="heldout",
                   help="heldout: the generator's held-out set (default); handwritten: the set written by hand "
                        "apart from the generator (eval/handwritten.jsonl); or a .jsonl file of that shape")
    p.add_argument("--per-family", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=None, help="default 64 (heldout), 128 (handwritten)")
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--configs", default=None, help="';'-separated config labels to run (default: all)")
    p.add_argument("--out", default="eval-results")
    p.set_defaults(func=_eval)
