"""Deepen a trained dlm-tiny without changing what it computes, to ask whether size is what limits it.

Each new layer is a copy of the layer before it with its output projection and MLP down projection
zeroed, so it adds nothing to the residual stream until training moves those two matrices; the
grown model writes the source's replies token for token (checked below). New layers go where ``--insert`` says
(after which old layer each); the pointer head's layer index moves with them, and the grown
config records it, so a ``dlm train --init-from`` stage passes ``--num-layers N --pointer-layer P``.
Layers inserted before the pointer keep its source clean: their writes into the reserved dims are
zero, and pointer_parts freezes them there as it does the original layers'.

    .venv/bin/python recipes/dlm_tiny/probes/grow_layers.py runs/dlm-tiny-g1/model runs/dlm-tiny-h0/model \
        --insert 3,3,5,5
"""

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dlm_backend import LLM
from dlm_tiny import corpus, evaluate

ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def grow(state: dict[str, torch.Tensor], layers: int, insert: list[int]) -> tuple[dict[str, torch.Tensor], list[int]]:
    """The grown state dict, and for each of its layers the old layer's index (-1: an inserted copy)."""
    order: list[tuple[int, bool]] = []           # (old layer, is a zeroed copy)
    for old in range(layers):
        order.append((old, False))
        order += [(old, True)] * insert.count(old)
    grown = {k: v for k, v in state.items() if not k.startswith("model.layers.")}
    for new, (old, copy) in enumerate(order):
        for key, value in state.items():
            prefix = f"model.layers.{old}."
            if key.startswith(prefix):
                name = key[len(prefix):]
                grown[f"model.layers.{new}.{name}"] = torch.zeros_like(value) if copy and name in ZEROED else value.clone()
    return grown, [old if not copy else -1 for old, copy in order]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--insert", default="3,3,5,5", help="comma-separated: insert a copy after each old layer named")
    args = ap.parse_args()
    src, out = Path(args.source), Path(args.out)
    config = json.loads((src / "config.json").read_text())
    layers = config["num_hidden_layers"]
    insert = [int(i) for i in args.insert.split(",")]
    if not all(0 <= i < layers for i in insert):
        raise SystemExit(f"--insert names layers 0..{layers - 1} of {src}; got {args.insert}")
    grown, origin = grow(load_file(str(src / "model.safetensors")), layers, insert)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, out / f.name)
    config["num_hidden_layers"] = len(origin)
    training = config.get("dlm_training", {})
    if training.get("pointer_layer"):
        training["pointer_layer"] = origin.index(training["pointer_layer"])
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(grown, str(out / "model.safetensors"))
    params = sum(v.numel() for v in grown.values())
    print(f"{len(origin)} layers (old index or -1 for new: {origin}), pointer layer "
          f"{training.get('pointer_layer')}, {params / 1e6:.2f}M parameters, {params * 4 / 2**20:.1f} MiB float32")

    # The check: the same replies, token for token, from the source and the grown model.
    examples = corpus.generate(24, seed=evaluate.EVAL_SEED, split="eval", families=["qa_open", "tool_open", "json"])
    replies = []
    for model in (src, out):
        with LLM(str(model)) as llm:
            prompts = [llm.encode_chat(e.messages, tools=e.tools) for e in examples]
            replies.append([o.token_ids for o in llm.generate(prompt_token_ids=prompts)])
    same = sum(a == b for a, b in zip(*replies))
    print(f"replies identical to the source's: {same}/{len(examples)}")


if __name__ == "__main__":
    main()
