"""Can SmolLM2-135M-Instruct, the English-pretrained model found on the package index, be cut to
dlm-tiny's 40 MB and still carry what it learned? A cut keeps some of its 30 layers and the first K
tokens of its BPE (its ids follow merge order, so the first K ids and the merges that make them are a
whole tokenizer). Each cut is scored as a causal model, before and after a short healing run on
news text, against the same shape trained from random weights:

* next-token cross-entropy on held-out news paragraphs (vocabulary cut to K; uniform is ln K);
* induction: a 30-token random sequence repeated, accuracy on the repeat (copying an unseen span is
  the skill dlm-tiny's built circuit supplies, findings.md "The recipe").

    python recipes/dlm_tiny/probes/teacher_cuts.py --cache runs/prose/downloads            # 40 s
    python recipes/dlm_tiny/probes/teacher_cuts.py --cache runs/prose/downloads --heal 150  # 25 min: 2.4 s a step
"""

import argparse
import math
import random
import sys
from pathlib import Path

import gguf
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers

sys.path.insert(0, str(Path(__file__).parent))
from write_prose_questions import ARTICLES, TEACHER, fetch  # noqa: E402

from dlm_tiny.prose_qa import load_articles  # noqa: E402
from dlm_tiny.teacher import apply_rope, load_teacher, rms_norm  # noqa: E402

CUTS = {"all 30": list(range(30)), "0-19": list(range(20)), "0-9 + 20-29": list(range(10)) + list(range(20, 30)),
        "0-9": list(range(10)), "0-3": [0, 1, 2, 3], "0-1 + 28-29": [0, 1, 28, 29]}


def cut_tokenizer(gguf_path: Path, k: int) -> Tokenizer:
    r = gguf.GGUFReader(str(gguf_path))
    tokens, merges = r.fields["tokenizer.ggml.tokens"].contents(), r.fields["tokenizer.ggml.merges"].contents()
    first_merge = len(tokens) - len(merges)        # SmolLM2: 17 control and 235 byte tokens, then the merges
    tokens, merges = tokens[:k], [tuple(m.split(" ", 1)) for m in merges[:k - first_merge]]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return tok


class Cut(torch.nn.Module):
    """A causal llama stack over some of the teacher's layers (or fresh ones of the same shape)."""

    def __init__(self, teacher, layers: list[int], k: int, fresh: bool = False):
        super().__init__()
        c, w = teacher.cfg, teacher.w
        self.cfg, self.rope, self.hd = c, teacher.rope, c.dim // c.n_head
        names = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
        params = {"emb": w["token_embd.weight"][:k], "out_norm": w["output_norm.weight"]}
        params |= {f"{j}_{n}": w[f"blk.{i}.{n}.weight"] for j, i in enumerate(layers) for n in names}
        if fresh:       # Dream/LLaDA-style init: N(0, 0.02), norms at 1
            params = {n: torch.ones_like(p) if n.endswith("norm") else torch.randn_like(p) * 0.02
                      for n, p in params.items()}
        self.p = torch.nn.ParameterDict({n: torch.nn.Parameter(p.clone()) for n, p in params.items()})
        self.n = len(layers)

    @property
    def megabytes_bf16(self) -> float:
        return sum(p.numel() for p in self.parameters()) * 2 / 2**20

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        p, c, (b, n) = self.p, self.cfg, ids.shape
        x = p["emb"][ids]                                                     # [B, L, C]
        rope = self.rope[:n][None].expand(b, -1, -1, -1)
        for j in range(self.n):
            h = rms_norm(x, p[f"{j}_attn_norm"], c.norm_eps)
            q = apply_rope(F.linear(h, p[f"{j}_attn_q"]).view(b, n, c.n_head, self.hd), rope)
            k = apply_rope(F.linear(h, p[f"{j}_attn_k"]).view(b, n, c.n_kv_head, self.hd), rope)
            v = F.linear(h, p[f"{j}_attn_v"]).view(b, n, c.n_kv_head, self.hd)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True)   # [B, H, L, D]
            x = x + F.linear(y.transpose(1, 2).reshape(b, n, c.dim), p[f"{j}_attn_output"])
            h = rms_norm(x, p[f"{j}_ffn_norm"], c.norm_eps)
            x = x + F.linear(F.silu(F.linear(h, p[f"{j}_ffn_gate"])) * F.linear(h, p[f"{j}_ffn_up"]), p[f"{j}_ffn_down"])
        return F.linear(rms_norm(x, p["out_norm"], c.norm_eps), p["emb"])   # [B, L, K]


def rows(tok: Tokenizer, texts: list[str], length: int) -> torch.Tensor:
    ids = [i for t in texts for i in tok.encode(t + "\n\n").ids]
    return torch.tensor(ids[:len(ids) // length * length]).view(-1, length)


@torch.no_grad()
def score(model: Cut, held: torch.Tensor, repeats: torch.Tensor) -> tuple[float, float]:
    logits = model(held)
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), held[:, 1:].flatten()).item()
    half = repeats.shape[1] // 2
    copied = (model(repeats)[:, half:-1].argmax(-1) == repeats[:, half + 1:]).float().mean().item()
    return ce, copied


def heal(model: Cut, train: torch.Tensor, steps: int, batch: int, seed: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.98), weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        ids = train[torch.randint(len(train), (batch,), generator=gen)]
        loss = F.cross_entropy(model(ids)[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for g in opt.param_groups:       # 10 warm-up steps, then constant: a probe, not a schedule
            g["lr"] = 3e-4 * min(1.0, (step + 1) / 10)
        opt.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default="runs/prose/downloads")
    ap.add_argument("--vocab", type=int, default=8192, help="tokens kept (the first K ids)")
    ap.add_argument("--heal", type=int, default=0, help="causal-LM steps on training news, each cut and a fresh twin")
    ap.add_argument("--heal-cuts", default="0-3,0-1 + 28-29", help="which cuts to heal (comma-separated names)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    cache = Path(args.cache)
    gguf_path = fetch(*TEACHER, cache)
    teacher, tok = load_teacher(str(gguf_path)), cut_tokenizer(gguf_path, args.vocab)
    articles = load_articles(fetch(*ARTICLES, cache))
    text = lambda keep: ["\n".join([a.title, *a.paragraphs]) for a in articles if a.held_out == keep]  # noqa: E731
    held, train = rows(tok, text(True), 256)[:16], rows(tok, text(False), 256)
    rng = random.Random(1)
    repeats = torch.tensor([[rng.randrange(1000, args.vocab) for _ in range(30)] * 2 for _ in range(16)])
    print(f"vocabulary {args.vocab} (uniform CE {math.log(args.vocab):.2f}); held-out news: {held.numel()} tokens")
    print(f"| cut | layers | MB in bf16 | news CE | induction | after {args.heal} steps: news CE | induction |")
    print("|---|---|---|---|---|---|---|")
    healed = [c.strip() for c in args.heal_cuts.split(",")] if args.heal else []
    for name, layers in CUTS.items():
        # a healed cut is followed by its twin: the same shape from random weights, on the same batches
        for label, fresh in [(name, False)] + ([(f"{name}, random weights", True)] if name in healed else []):
            model = Cut(teacher, layers, args.vocab, fresh=fresh)
            cells = [score(model, held, repeats)]
            if name in healed:
                heal(model, train, args.heal, 8, seed=0)
                cells.append(score(model, held, repeats))
            scores = " | ".join(f"{ce:.2f} | {copied:.2f}" for ce, copied in cells)
            print(f"| {label} | {len(layers)} | {model.megabytes_bf16:.1f} | {scores}{' | |' * (2 - len(cells))} |", flush=True)


if __name__ == "__main__":
    main()
