"""Train dlm-tiny from scratch with the masked-diffusion SFT objective, on CPU in about an hour.

Objective (LLaDA SFT): for each example the prompt stays clean; every response token (the reply,
its end-of-turn token and the EOS padding after it) is masked with probability t ~ U(eps, 1), and
the cross-entropy on masked positions is weighted by 1/t and averaged over the reply's length, with
the EOS padding down-weighted (``pad_weight``) so it cannot drown the reply. The
Dream/Qwen2 layout keeps the one-position logit shift, so position i is predicted from output i-1.

Deterministic for a seed; ``train_state.pt`` in the output folder makes a run resumable.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm

from dlm_backend.engine.layers import AttentionContext, attention_context
from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.engine.tokenizer import Tokenizer as ChatTokenizer
from dlm_backend.training import corpus
from dlm_backend.training.template import CHAT_TEMPLATE, EOS, MASK, SPECIAL_TOKENS, TOOL_TOKENS


EPS = 1e-3   # smallest mask ratio of the bernoulli mode, as in LLaDA


@dataclass
class TrainConfig:
    out_dir: str = "runs/dlm-tiny"
    seed: int = 0
    num_examples: int = 60000
    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 768
    max_len: int = 448             # prompt + reply + padding, tokens (3 tool schemas ~ 250)
    batch_tokens: int = 6144       # tokens per optimiser step
    max_extra_pad: int = 40        # EOS run after the reply: the model learns to fill a 64-token canvas
    pad_weight: float = 0.05       # loss weight of that EOS run relative to the reply's tokens
    steps: int = 3500
    lr: float = 2e-3
    min_lr: float = 1e-4
    warmup: int = 150
    weight_decay: float = 0.01
    mask_mode: str = "bernoulli"   # see response_mask; "count" measured no better (held-out CE, 670 steps)
    # From this step on, t >= late_t_min. With t ~ U(0.001, 1) and weights 1/t the lightly-masked
    # rows dominate the loss, and those are solved from the reply's own unmasked tokens: after 2250
    # steps the model wrote fluent fragments that ignored the prompt (0/42 held-out, "Bye!" answered
    # with its identity line). Heavily-masked rows can only be solved from the prompt.
    late_from_step: int = 2250
    late_t_min: float = 0.3
    save_every: int = 250
    init_from: str = ""            # a finished dlm-tiny folder to continue from (its tokenizer too)


def build_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on the corpus; special tokens first (ids 0..3), tool tags after."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(TOOL_TOKENS), special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tok


def model_config(cfg: TrainConfig, tok: Tokenizer) -> dict:
    eos = tok.token_to_id(EOS)
    return {
        "architectures": ["DreamModel"], "model_type": "Dream", "hidden_act": "silu",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "vocab_size": tok.get_vocab_size(),
        "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "mask_token_id": tok.token_to_id(MASK), "eos_token_id": eos,
        "pad_token_id": eos, "bos_token_id": None, "torch_dtype": "float32", "use_cache": False,
    }


def write_checkpoint_files(folder: Path, config: dict, tok: Tokenizer) -> None:
    """Everything but the weights, laid out exactly as a hub checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": config["eos_token_id"], "pad_token_id": config["pad_token_id"],
         "mask_token_id": config["mask_token_id"]}, indent=2))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": EOS, "pad_token": EOS, "mask_token": MASK, "model_max_length": 2048,
         "chat_template": CHAT_TEMPLATE}, indent=2))


def encode_examples(examples: list[corpus.Example], chat: ChatTokenizer, max_len: int) -> list[tuple[list[int], list[int]]]:
    pairs = []
    for ex in examples:
        prompt = chat.encode(chat.apply_chat_template(ex.messages, tools=ex.tools))
        reply = chat.encode(ex.target + "<|im_end|>")
        if len(prompt) + len(reply) + 1 <= max_len:
            pairs.append((prompt, reply))
    return pairs


class Batches:
    """Batch ``step`` of the run, a pure function of (seed, step): resuming needs only the step.

    Returns token ids ``[B, L]``, each row's prompt length and the end of its reply (EOS after it).

    Examples are grouped by length so a [B, L] batch wastes little compute on padding; each epoch
    visits the groups in a seeded order.
    """

    def __init__(self, pairs, cfg: TrainConfig, eos: int):
        self.pairs, self.cfg, self.eos = pairs, cfg, eos
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        self.groups, i = [], 0
        while i < len(order):
            length = len(pairs[order[i]][0]) + len(pairs[order[i]][1]) + cfg.max_extra_pad
            size = max(1, cfg.batch_tokens // length)
            self.groups.append(order[i:i + size])
            i += size

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        epoch, index = divmod(step, len(self.groups))
        visit = list(range(len(self.groups)))
        random.Random(f"{self.cfg.seed}-epoch-{epoch}").shuffle(visit)
        group = self.groups[visit[index]]
        extra = random.Random(f"{self.cfg.seed}-pad-{step}").randint(1, self.cfg.max_extra_pad)
        L = min(self.cfg.max_len, max(len(self.pairs[j][0]) + len(self.pairs[j][1]) for j in group) + extra)
        ids = torch.full((len(group), L), self.eos, dtype=torch.long)
        prompt_len = torch.zeros(len(group), dtype=torch.long)
        reply_end = torch.zeros(len(group), dtype=torch.long)
        for r, j in enumerate(group):
            prompt, reply = self.pairs[j]
            row = (prompt + reply)[:L]
            ids[r, :len(row)] = torch.tensor(row)
            prompt_len[r], reply_end[r] = len(prompt), len(row)
        return ids, prompt_len, reply_end


def response_mask(prompt_len: torch.Tensor, L: int, gen: torch.Generator, mode: str,
                  t_min: float = EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Which response positions to mask, and each row's mask ratio t (``[B, L]`` bool, ``[B, 1]``).

    ``bernoulli``: t ~ U(t_min, 1), each response position masked with probability t (LLaDA's SFT).
    ``count``: k ~ U{1..n} positions of the n response positions masked exactly, t = k / n. The 1/t
    weight is then at most n instead of 1/eps = 1000: in small batches one row with t ~ 0.002 and a
    single masked token otherwise owns the whole clipped gradient step.
    """
    B = prompt_len.shape[0]
    pos = torch.arange(L)[None, :].expand(B, L)
    response = pos >= prompt_len[:, None]                                  # [B, L]
    if mode == "bernoulli":
        t = t_min + (1 - t_min) * torch.rand(B, 1, generator=gen)
        return response & (torch.rand(B, L, generator=gen) < t), t
    n = (L - prompt_len)[:, None]                                          # [B, 1]
    k = 1 + (torch.rand(B, 1, generator=gen) * n).long().clamp_max(n - 1)  # [B, 1] in 1..n
    scores = torch.rand(B, L, generator=gen).masked_fill(~response, 2.0)
    ranks = scores.argsort(dim=1).argsort(dim=1)
    return ranks < k, k / n


def diffusion_loss(model: DreamModel, ids: torch.Tensor, prompt_len: torch.Tensor, reply_end: torch.Tensor,
                   mask_id: int, gen: torch.Generator, pad_weight: float, mode: str = "bernoulli",
                   t_min: float = EPS) -> torch.Tensor:
    B, L = ids.shape
    pos = torch.arange(L)[None, :].expand(B, L)
    # EOS padding after the reply is trivial to predict; at full weight it drowns the reply's own
    # tokens (in a 24-example overfit test the model learned the padding and never the answers).
    weight = torch.where(pos < reply_end[:, None], 1.0, pad_weight)        # [B, L]
    masked, t = response_mask(prompt_len, L, gen, mode, t_min)
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    with attention_context(AttentionContext(rows=(B, L))):
        hidden = model(noisy.reshape(-1), pos.reshape(-1)).view(B, L, -1)  # [B, L, D]
    # Dream's shift: the prediction for position i is the output at i - 1 (prompts are >= 1 token).
    b, i = masked.nonzero(as_tuple=True)
    logits = model.compute_logits(hidden[b, i - 1])                        # [M, V]
    ce = F.cross_entropy(logits, ids[b, i], reduction="none") * weight[b, i]
    per_row = torch.zeros(B).index_add_(0, b, ce / t[b, 0])
    return (per_row / (reply_end - prompt_len).clamp_min(1)).mean()


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


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
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Subnormal floats appear as the weights train and x86 handles them in microcode: step time grew
    # from 1.0 to 3.3 s; with flush-to-zero the same batch on step-750 weights takes 1.1 s instead of
    # 2.5. It must be set before torch starts its OpenMP pool, whose threads inherit the setting.
    torch.set_flush_denormal(True)
    torch.manual_seed(cfg.seed)
    examples = corpus.generate(cfg.num_examples, seed=cfg.seed, split="train")
    model_dir = out / "model"
    if cfg.init_from:     # a second stage keeps the first stage's vocabulary
        tok = Tokenizer.from_file(str(Path(cfg.init_from) / "tokenizer.json"))
    elif (model_dir / "tokenizer.json").is_file():
        tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    else:
        texts = [json.dumps(e.messages) + " " + json.dumps(e.tools or []) + " " + e.target for e in examples]
        tok = build_tokenizer(texts, cfg.vocab_size)
    config = model_config(cfg, tok)
    write_checkpoint_files(model_dir, config, tok)
    chat = ChatTokenizer(model_dir)
    pairs = encode_examples(examples, chat, cfg.max_len)

    model = DreamModel.from_config(config)
    init_weights(model, cfg.seed)
    if cfg.init_from:
        model.load_state_dict(load_file(str(Path(cfg.init_from) / "model.safetensors")))
    model.setup("cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    state_path, log_path = out / "train_state.pt", out / "loss.csv"
    step, gen = 0, torch.Generator().manual_seed(cfg.seed)
    if state_path.is_file():
        state = torch.load(state_path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        gen.set_state(state["gen"])
        if log_path.exists():     # steps logged after the last save will run (and log) again
            kept = [line for line in log_path.read_text().splitlines() if int(line.split(",")[0]) <= step]
            log_path.write_text("".join(line + "\n" for line in kept))
    elif log_path.exists():
        log_path.unlink()
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    batch_at = Batches(pairs, cfg, config["eos_token_id"])
    model.train()
    bar = tqdm(total=cfg.steps, initial=step, desc="train dlm-tiny")
    start, ema = time.time(), None
    while step < (stop_at or cfg.steps):
        ids, prompt_len, reply_end = batch_at(step)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        t_min = cfg.late_t_min if step >= cfg.late_from_step else EPS
        loss = diffusion_loss(model, ids, prompt_len, reply_end, config["mask_token_id"], gen,
                              cfg.pad_weight, cfg.mask_mode, t_min)
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
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                        "gen": gen.get_state()}, state_path)
    bar.close()
    if step < cfg.steps:
        return model_dir
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(model_dir / "model.safetensors"))
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
