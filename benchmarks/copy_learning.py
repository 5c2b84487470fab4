"""How fast does the dlm-tiny architecture learn to copy? (docs/dlm-tiny/findings.md)

Next-token runs of the dlm-tiny model shape from scratch, printing the loss on copied tokens:
  fixed:     12 random tokens, a separator, the same 12 tokens (copy at a fixed offset);
  induction: 128 random tokens whose second half is four spans copied from random offsets of the
             first half (the textbook induction-head task);
  corpus:    the corpus's copy family in the chat template, packed rows, loss on the reply only.

Measured on 2 CPU cores (session 4), loss at chance = ln(alphabet):
  fixed 8.4 -> 0.13 in 200 steps (60 tokens apart: 8.4 -> 3.2 in 150): a positional head, learned fast;
  corpus 5.0 at 200 steps, 4.2-4.5 at 700;
  induction, full vocabulary: 8.3 (chance) for 800 steps; --alphabet 64: chance for 700;
  --alphabet 256 --positional: chance for 600 steps (6 layers), for 1400 (--layers 2), and with
  q/k init 5x larger for 800: starting the neighbour head built does not make the match learnable.
Even "some earlier token comes next" (a bag of the context, 1.5 nats under chance) is not picked up
in 300 steps, by this model or by torch's own nn.TransformerEncoder: content-addressed attention sits
on a plateau longer than a CPU training run, which is why no dlm-tiny run copies unseen names.

--circuit starts from the induction circuit of dlm_backend/training/circuits.py (session 5; not
frozen here): induction, full vocabulary: 0.31 at step 0, 0.4-0.9 to step 100 (chance is 8.3).
A first, weaker version (codes at embedding scale) went 5.9 -> 1.0 in 100 steps, and on the
corpus copy family 4.6-4.9 at 125-175 steps: a reply's first copied token is found by meaning.

    .venv/bin/python benchmarks/copy_learning.py --task induction --alphabet 256 --positional --steps 600
    .venv/bin/python benchmarks/copy_learning.py --task induction --circuit --steps 100
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dlm_backend.engine.layers import AttentionContext, attention_context
from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.engine.tokenizer import Tokenizer as ChatTokenizer
from dlm_backend.training import corpus
from dlm_backend.training.circuits import build_copy_circuit, neighbour_bias
from dlm_backend.training.objective import PackedBatches
from dlm_backend.training.checkpoint import build_tokenizer, model_config, write_checkpoint_files
from dlm_backend.training.train import TrainConfig, encode_examples, init_weights


def positional_heads(model: DreamModel, theta: float) -> None:
    """Make layer 0's first two query heads attend to the previous and the next token (``--positional``).

    Only the q/k biases are set (:func:`neighbour_bias`), so attention depends on relative position
    alone; both query heads share kv head 0. This is the first half of an induction circuit: does
    the match then get learned quickly? (It did not: module docstring.)
    """
    attn = model.model.layers[0].self_attn
    hd = attn.head_dim
    prev_q, next_q, k = neighbour_bias(hd, theta)
    with torch.no_grad():
        attn.k_proj.bias[:hd] = k
        attn.q_proj.bias[:hd], attn.q_proj.bias[hd:2 * hd] = prev_q, next_q


def fixed_batches(vocab: int, n: int = 12, batch: int = 32):
    L = 2 * n + 1
    causal = torch.ones(L, L, dtype=torch.bool).tril()[None].expand(batch, L, L)
    while True:
        x = torch.randint(10, vocab - 10, (batch, n))
        ids = torch.cat([x, torch.full((batch, 1), 3), x], 1)                   # [B, L]
        target = torch.zeros(batch, L, dtype=torch.bool)
        target[:, n + 1:] = True
        yield ids, torch.arange(L).expand(batch, L), causal, target


def induction_batches(vocab: int, L: int = 128, batch: int = 16, alphabet: int = 0):
    """Random tokens; the second half is four 16-token spans copied from random offsets of the first.

    ``alphabet`` > 0 draws from that many token ids only (fewer symbols, more matches to learn from).
    """
    alphabet = alphabet or vocab - 20
    causal = torch.ones(L, L, dtype=torch.bool).tril()[None].expand(batch, L, L)
    half, n = L // 2, 16
    while True:
        ids = torch.randint(10, 10 + alphabet, (batch, L))
        target = torch.zeros(batch, L, dtype=torch.bool)
        for b in range(batch):
            for dst in range(half, L, n):
                src = int(torch.randint(0, half - n + 1, ()))
                ids[b, dst:dst + n] = ids[b, src:src + n]
                target[b, dst + 1:dst + n] = True      # the first token of a span is unpredictable
        yield ids, torch.arange(L).expand(batch, L), causal, target


def corpus_batches(chat: ChatTokenizer, eos: int):
    pairs = encode_examples(corpus.generate(6000, seed=0, families=["copy"]), chat, 512)
    batches = PackedBatches(pairs, 0, 512, 4, 4, eos)
    step = 0
    while True:
        b = batches(step)
        ex = b.ex.clamp_min(0)
        target = (b.ex >= 0) & (b.pos >= b.prompt_len[ex]) & (b.pos < (b.prompt_len + b.reply_len)[ex])
        yield b.ids, b.pos, b.attend & (b.pos[:, None, :] <= b.pos[:, :, None]), target
        step += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=["fixed", "induction", "corpus"], default="corpus")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--alphabet", type=int, default=0, help="induction: token ids drawn (0: the vocabulary)")
    ap.add_argument("--positional", action="store_true", help="start layer 0 with neighbour heads")
    ap.add_argument("--circuit", action="store_true", help="start with the built copy circuit (training/circuits.py)")
    ap.add_argument("--gain", type=float, default=3.0)
    ap.add_argument("--match", type=float, default=100.0)
    ap.add_argument("--layers", type=int, default=TrainConfig.num_layers)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    cfg = TrainConfig(num_layers=args.layers)
    examples = corpus.generate(20000, seed=0)
    tok = build_tokenizer([json.dumps(e.messages) + " " + json.dumps(e.tools or []) + " " + e.target
                           for e in examples], cfg.vocab_size)
    config = model_config(cfg, tok)
    folder = Path(tempfile.mkdtemp())
    write_checkpoint_files(folder, config, tok)
    data = {"fixed": lambda: fixed_batches(config["vocab_size"]),
            "induction": lambda: induction_batches(config["vocab_size"], alphabet=args.alphabet),
            "corpus": lambda: corpus_batches(ChatTokenizer(folder), config["eos_token_id"])}[args.task]()
    model = DreamModel.from_config(config)
    init_weights(model, 0)
    if args.positional:
        positional_heads(model, config["rope_theta"])
    if args.circuit:
        build_copy_circuit(model, config["rope_theta"], 0, config["mask_token_id"], match=args.match, copy_gain=args.gain)
    model.setup("cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98))
    start = time.time()
    for step in range(args.steps + 1):
        ids, pos, attend, target = next(data)
        B, L = ids.shape
        with attention_context(AttentionContext(rows=(B, L), attend=attend)):
            hidden = model(ids.reshape(-1), pos.reshape(-1)).view(B, L, -1)     # [B, L, D]
        b, i = target.nonzero(as_tuple=True)
        loss = F.cross_entropy(model.compute_logits(hidden[b, i - 1]), ids[b, i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d}  copy loss {loss.item():.3f}  {time.time() - start:6.1f} s", flush=True)


if __name__ == "__main__":
    main()
