"""``dlm train --compile``: the dense parts of each layer compiled with torch.compile (inductor).

A bf16 training step on 2 cores spent about 40% of its time in elementwise ops between the matrix
products: autocast's casts (``copy_``), RMSNorm's float32 round trip, the rotary multiply-adds and
SwiGLU, each a separate pass over ``[6144, 256..768]`` tensors. Compiled, each piece runs as a few
fused loops; attention (per-example length buckets, shapes that change every step) and the loss stay
eager. ``dlm train`` with the recipe's stage-1 flags: 0.85 -> 0.72 s a step (1.18x);
probes/bench_train_step.py: 0.751 -> 0.651 s (1.15x), on the w-run's cores.

The compiled pieces compute the same functions with other roundings, so a compiled run is
deterministic for its seed but not bitwise equal to an eager one, and over thousands of bf16 steps
the two runs part: the recipe compiled (w-run, findings.md) took 87 minutes and reached 69.4%
held-out, against 73.1% for the eager u-run. Off by default in ``dlm train``; ``train.sh`` turns it
on and spends the 1.18x on 800 more stage-1 steps (y-run: 98 minutes, 74.4%).
"""

from __future__ import annotations

import torch


def compile_layers(model: torch.nn.Module) -> None:
    """Compile each decoder layer's q/k/v projection with rotation, its two residual-add norms and its
    MLP, in place. Every training row has the same shape (``rows x max_len`` tokens), so each piece
    compiles once (the first layer's norm, with no residual yet, once more)."""
    for layer in model.model.layers:
        layer.self_attn.project = torch.compile(layer.self_attn.project)
        layer.mlp.forward = torch.compile(layer.mlp.forward)
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.add_forward = torch.compile(norm.add_forward)
