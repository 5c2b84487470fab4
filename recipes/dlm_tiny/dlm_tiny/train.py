"""Train dlm-tiny from scratch with the masked-diffusion objective on 2 CPU cores: the default run
(1700 steps) takes about 45 minutes; the shipped model is train.sh's four stages, about 116
minutes compiled in bf16 (findings.md).

Objective (LLaDA SFT, see :mod:`objective`): the reply, its end-of-turn token and the EOS run after
it are masked with probability t and the cross-entropy on masked positions is weighted by 1/t;
a share of the examples is masked over the prompt too (LLaDA pre-training), and the run starts
autoregressive and anneals to pure diffusion (``ar_until``). Examples are packed into fixed rows.
The Dream/Qwen2 layout keeps the one-position logit shift, so position i is predicted from output i-1.

Speed (probes/bench_train_step.py): ``--precision bf16`` runs the products in bfloat16 on CPUs
that have it, and attention per example in length buckets (example_attention.py); float32 keeps the row mask.

Deterministic for a seed; ``train_state.pt`` in the output folder makes a run resumable.
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.errors import DLMError
from dlm_backend.engine.checkpoint.tokenizer import Tokenizer as ChatTokenizer
from dlm_tiny import corpus
from dlm_tiny.compiled import compile_layers
from dlm_tiny.circuits import build_copy_circuit, freeze_copy_circuit, freeze_parts
from dlm_tiny.pointer import build_pointer_head, pointer_parts
from dlm_tiny.objective import PackedBatches, diffusion_loss
from dlm_tiny.checkpoint import build_tokenizer, model_config, write_checkpoint_files
from dlm_tiny.template import EOS
from dlm_tiny.train_config import TrainConfig
from dlm_tiny.checks import (TRAINING_KEY, check_flags, check_init_from, check_resume, check_weights,
                                         saved_flags, training_settings)


def parse_weights(spec: str) -> dict[str, float]:
    """``"qa=0.35,list=0.12"`` -> ``{"qa": 0.35, "list": 0.12}``."""
    weights = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, value = part.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            raise DLMError(f"--family-weights: cannot read {part!r}; write non-negative family=weight pairs, "
                           f"e.g. qa=0.35,list=0.12") from None
        if weights[name.strip()] < 0:
            raise DLMError(f"--family-weights: {part!r} has a negative weight; weights are >= 0, e.g. qa=0.35")
    unknown = set(weights) - set(corpus.FAMILIES)
    if unknown:
        raise DLMError(f"--family-weights: unknown families {sorted(unknown)}; known: {sorted(corpus.FAMILIES)}")
    return weights


def encode_examples(examples: list[corpus.Example], chat: ChatTokenizer, max_len: int) -> list[tuple[list[int], list[int]]]:
    pairs = []
    for ex in examples:
        if ex.messages:
            prompt = chat.encode(chat.apply_chat_template(ex.messages, tools=ex.tools))
            reply = chat.encode(ex.target + "<|im_end|>")
        else:   # plain text (text_prose): one EOS before it, as between documents, and all of it to denoise
            prompt, reply = chat.encode(EOS), chat.encode(ex.target)
        if len(prompt) + len(reply) + 1 <= max_len:
            pairs.append((prompt, reply))
    return pairs


def ar_share(step: int, cfg: TrainConfig) -> float:
    """Share of examples trained autoregressively at ``step``."""
    return max(0.0, 1.0 - step / (cfg.ar_until * cfg.steps)) if cfg.ar_until > 0 else 0.0


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def keep_freed_memory() -> None:
    """Make glibc keep freed memory for reuse instead of handing it back to the kernel.

    A step allocates and frees tensors of 3-50 MB (logits, MLP activations); above glibc's mmap
    threshold each one is a fresh mmap whose pages the kernel faults in and zeroes again. In the
    autoregressive start of a run (logits for every token) that was 4.4% system time and 2.46 s a
    step; with this, 0.6% and 2.28 s. Later steps were 1.98 s either way. Only training calls this.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:           # not glibc (macOS, musl): nothing to tune
        return
    m_trim_threshold, m_top_pad, m_mmap_max = -1, -2, -4     # mallopt's parameter numbers (malloc.h)
    libc.mallopt(m_mmap_max, 0)                   # every allocation from the heap, none by mmap
    libc.mallopt(m_trim_threshold, 2**31 - 1)     # never shrink the heap after a step's frees
    libc.mallopt(m_top_pad, 256 << 20)            # grow it in 256 MB steps


def init_weights(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            torch.nn.init.ones_(p)
        elif name.endswith(".bias"):
            torch.nn.init.zeros_(p)
        else:
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def train(cfg: TrainConfig, stop_at: int | None = None) -> Path:
    """Run (or resume) training; returns the folder holding the finished checkpoint.

    ``stop_at`` ends this run early after saving state, as an interruption would (tests use it).
    """
    check_flags(cfg)
    weights = parse_weights(cfg.family_weights)
    check_weights(weights, corpus.FAMILIES)
    out = Path(cfg.out_dir)
    state_path, log_path = out / "train_state.pt", out / "loss.csv"
    state = torch.load(state_path, weights_only=True, map_location="cpu") if state_path.is_file() else None
    if state is not None:
        check_resume(saved_flags(state), cfg)
    out.mkdir(parents=True, exist_ok=True)
    # Subnormal floats appear as the weights train and x86 handles them in microcode: step time grew
    # from 1.0 to 3.3 s; with flush-to-zero the same batch on step-750 weights takes 1.1 s instead of
    # 2.5. It must be set before torch starts its OpenMP pool, whose threads inherit the setting.
    torch.set_flush_denormal(True)
    keep_freed_memory()
    torch.manual_seed(cfg.seed)
    examples = corpus.generate(cfg.num_examples, seed=cfg.seed, split="train",
                               weights=weights, unanswerable=cfg.unanswerable, qa_hard=cfg.qa_hard,
                               rag_templates=cfg.rag_templates, prose_bank=cfg.prose_bank)
    model_dir = out / "model"
    if cfg.init_from:     # a second stage keeps the first stage's vocabulary
        tok = Tokenizer.from_file(str(Path(cfg.init_from) / "tokenizer.json"))
    elif (model_dir / "tokenizer.json").is_file():
        tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    else:
        texts = [json.dumps(e.messages) + " " + json.dumps(e.tools or []) + " " + e.target for e in examples]
        tok = build_tokenizer(texts, cfg.vocab_size)
    config = model_config(cfg, tok)
    config[TRAINING_KEY] = training_settings(cfg)
    if cfg.init_from:
        init_config = json.loads((Path(cfg.init_from) / "config.json").read_text())
        check_init_from(init_config, cfg)
        config["rope_theta"] = init_config["rope_theta"]
    write_checkpoint_files(model_dir, config, tok)
    chat = ChatTokenizer(model_dir)
    # The corpus is millions of live objects that never die: a full collection over them stalled one
    # template render past the renderer's 2 s deadline on a busy machine. Freeze them out of the GC.
    gc.freeze()
    pairs = encode_examples(examples, chat, cfg.max_len)

    model = DreamModel.from_config(config)
    init_weights(model, cfg.seed)
    if cfg.copy_circuit and not cfg.init_from:
        build_copy_circuit(model, config["rope_theta"], cfg.seed, config["mask_token_id"],
                           prev_dims=cfg.copy_prev_dims, copy_gain=cfg.copy_gain)
    if cfg.init_from:
        model.load_state_dict(load_file(str(Path(cfg.init_from) / "model.safetensors")))
    model.setup("cpu")
    if cfg.copy_circuit and cfg.pointer_layer and not cfg.init_from:    # sized on a forward pass: after setup
        build_pointer_head(model, cfg.pointer_layer, prev_dims=cfg.copy_prev_dims, copy_gain=cfg.copy_gain,
                           seed=cfg.seed)
    model.to(cfg.device)           # built on the CPU (the circuits are CPU code), trained where asked
    model.setup(cfg.device)
    if cfg.copy_circuit:          # a second stage keeps the first stage's circuit as it is
        freeze_copy_circuit(model, prev_dims=cfg.copy_prev_dims)
        if cfg.pointer_layer:
            freeze_parts(model, pointer_parts(model, cfg.pointer_layer, prev_dims=cfg.copy_prev_dims))
    if cfg.compile:
        compile_layers(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    step, gen = 0, torch.Generator().manual_seed(cfg.seed)
    ema, elapsed = None, 0.0          # a resumed run continues the loss curve's EMA and clock
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        gen.set_state(state["gen"])
        if log_path.exists():     # steps logged after the last save will run (and log) again
            # a line cut short by the kill has fewer than 4 fields: dropped with the steps after the save
            kept = [line for line in log_path.read_text().splitlines()
                    if len(line.split(",")) == 4 and int(line.split(",")[0]) <= step]
            log_path.write_text("".join(line + "\n" for line in kept))
            if kept:
                _, _, last_ema, last_time = kept[-1].split(",")
                ema, elapsed = float(last_ema), float(last_time)
    elif log_path.exists():
        log_path.unlink()
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    batch_at = PackedBatches(pairs, cfg.seed, cfg.max_len, cfg.rows, cfg.max_extra_pad, config["eos_token_id"],
                             cfg.pad_dist, cfg.block_size)
    if batch_at.dropped:
        print(f"block layout: {batch_at.dropped} of {len(pairs)} examples do not fit --max-len {cfg.max_len} with "
              f"their reply twice and are left out")
    model.train()
    bar = tqdm(total=cfg.steps, initial=step, desc="train dlm-tiny")
    start = time.time() - elapsed
    while step < (stop_at or cfg.steps):
        batch = batch_at(step).to(cfg.device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        with torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
            # length buckets pay in bf16 (1.62x against 1.44x with the row mask); in float32 they were
            # 9% slower than the row mask (probes/bench_train_step.py; findings.md, r2)
            loss = diffusion_loss(model, batch, config["mask_token_id"], gen, cfg.t_min, cfg.prompt_mask_prob,
                                  cfg.pad_weight, ar_share(step, cfg), per_example=cfg.precision == "bf16")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        with log_path.open("a") as f:
            f.write(f"{step},{loss.item():.5f},{ema:.5f},{time.time() - start:.1f}\n")
        bar.set_postfix(loss=f"{ema:.3f}")
        bar.update()
        if step % cfg.save_every == 0 or step in (cfg.steps, stop_at):
            # Written aside and renamed: a run killed while saving keeps its previous state.
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                        "gen": gen.get_state(), "config": json.dumps(asdict(cfg))}, state_path.with_suffix(".tmp"))
            os.replace(state_path.with_suffix(".tmp"), state_path)
    bar.close()
    if step < cfg.steps:
        return model_dir
    # aside and renamed, as the state is: train.sh takes this file as "stage done"
    weights = model_dir / "model.safetensors"
    save_file({k: v.contiguous().cpu() for k, v in model.state_dict().items()}, str(weights.with_suffix(".tmp")))
    os.replace(weights.with_suffix(".tmp"), weights)
    plot_loss(log_path, out / "loss.png")
    return model_dir


def plot_loss(csv_path: Path, png_path: Path) -> None:
    if not csv_path.is_file():      # a run of zero steps logs nothing
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [line.split(",") for line in csv_path.read_text().splitlines()]
    steps, raw, ema = zip(*[(int(r[0]), float(r[1]), float(r[2])) for r in rows])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, raw, alpha=0.3, label="loss")
    ax.plot(steps, ema, label="EMA 0.98")
    ax.set(xlabel="step", ylabel="masked-diffusion loss (1/t weighted)", yscale="log", title="dlm-tiny training")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
